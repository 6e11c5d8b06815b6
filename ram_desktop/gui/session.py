"""The window's session model, Qt-free: which results the window holds (the analysis, the merge result, the
comparison, the merged model's scores) and whether each is still fresh. A change marks stale exactly what it
invalidates (``INVALIDATES``, the table in docs/gui.md); panels subscribe and show it where the user looks.
A first, minimal step towards the evented session model of ARCHITECTURE.md (issue 48): it holds freshness
only, not the spec or the results themselves."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum


class Part(Enum):
    """A result the window shows, in the order the flow makes them."""

    ANALYSIS = "analysis"
    RESULT = "merge result"
    COMPARE = "comparison"
    SCORES = "merged model's scores"


class Change(Enum):
    """What the user changed."""

    SOURCES = "the sources"  # a row added, removed, reordered, the base changed (a rename changes nothing)
    EPS = "ε"
    METHOD = "the method or its parameters"
    MERGE = "a new merge"  # into the folder whose scores are shown


# what each change invalidates: the sources and ε, the analysis and everything after it; the method, the merge
# result and the comparison (the analysis measured the sources, not the method); a new merge, its own scores
# (the base's and the agents' scores stay: those models did not change)
INVALIDATES: dict[Change, tuple[Part, ...]] = {
    Change.SOURCES: (Part.ANALYSIS, Part.RESULT, Part.COMPARE, Part.SCORES),
    Change.EPS: (Part.ANALYSIS, Part.RESULT, Part.COMPARE, Part.SCORES),
    Change.METHOD: (Part.RESULT, Part.COMPARE),
    Change.MERGE: (Part.SCORES,),
}
# the one action that refreshes each part
REFRESH: dict[Part, str] = {
    Part.ANALYSIS: "Analyze",
    Part.RESULT: "Merge",
    Part.COMPARE: "Run compare",
    Part.SCORES: "Evaluate",
}

SINCE: dict[Part, str] = {
    Part.ANALYSIS: "this analysis",
    Part.RESULT: "this merge",
    Part.COMPARE: "this comparison",
    Part.SCORES: "the merged model was scored",
}

Listener = Callable[[Part, "str | None"], None]


class Session:
    """Which parts the window holds and why any is stale. ``made(part)``: a fresh result is shown;
    ``dropped(part)``: none is shown; ``changed(change)``: the parts held that it invalidates turn stale (returns
    them). Listeners get ``(part, reason)`` (None: fresh or gone) whenever a part's state changes."""

    def __init__(self) -> None:
        self._held: dict[Part, str | None] = {}  # part -> None (fresh) or why it is stale
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _tell(self, part: Part) -> None:
        for listener in list(self._listeners):
            listener(part, self._held.get(part))

    def made(self, part: Part) -> None:
        self._held[part] = None
        self._tell(part)

    def dropped(self, part: Part) -> None:
        self._held.pop(part, None)
        self._tell(part)

    def changed(self, change: Change) -> list[Part]:
        stale = []
        for part in INVALIDATES[change]:
            if part in self._held and self._held[part] is None:
                self._held[part] = (
                    "The merged model was merged again since it was scored"
                    if change is Change.MERGE
                    else f"{change.value} changed since {SINCE[part]}".replace("the ", "The ", 1)
                )
                stale.append(part)
                self._tell(part)
        return stale

    def held(self, part: Part) -> bool:
        return part in self._held

    def stale(self, part: Part) -> str | None:
        """Why ``part`` is stale; None when it is fresh or not held."""
        return self._held.get(part)

    def stale_parts(self) -> list[Part]:
        return [p for p in Part if self._held.get(p)]
