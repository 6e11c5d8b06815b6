"""The window's session model, Qt-free and evented (docs/gui.md, "What a change makes out of date"): what the panels share —
the sources as the Sources step shows them, the merge being drafted in the method form (``draft.Draft``: what runs
is made from the sources and the draft alone), the scoring settings of Evaluate, the models offered for scoring,
the merge result and the latest scores — and which results the window holds (the analysis, the merge result,
the comparison, the merged model's scores) and whether each is still fresh. Panels write their part and watch
the parts they show (``watch``); none reads another panel's widgets. A change marks stale exactly what it
invalidates (``INVALIDATES``, the table in docs/gui.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..core import Agent
from ..evaluate.cache import ScoreCache
from .draft import Draft


@dataclass(frozen=True)
class SourceRow:
    """One agent row of the Sources step: ``key`` stays with it through reorder and rename (per-agent values
    follow it), ``slot`` is its colour."""

    key: int
    name: str
    source: str
    slot: int = 0


@dataclass(frozen=True)
class SourcesState:
    """The Sources step as a value: the base's source ("" while none), the agent rows in order, and whether
    every row has opened without error."""

    base: str = ""
    agents: tuple[SourceRow, ...] = ()
    ready: bool = False

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.agents]

    @property
    def identities(self) -> list[tuple[int, str]]:
        return [(a.key, a.name) for a in self.agents]

    @property
    def color_slots(self) -> dict[str, int]:
        return {a.name: a.slot for a in self.agents}

    @property
    def chosen(self) -> tuple[str, tuple[Agent, ...]]:
        """What a spec takes: the base's source and the named agents in order."""
        return self.base, tuple(Agent(a.name, a.source) for a in self.agents)


@dataclass(frozen=True)
class ModelEntry:
    """A model the user may score: its name in tables, its folder (or Hub id) and what it is."""

    name: str
    source: str
    kind: str  # base | agent | merged | variant | other


@dataclass(frozen=True)
class Scoring:
    """How models are scored, as Evaluate shows it; Compare and Search score with the same: the ticked suites,
    the batch size and the examples per suite (None: all)."""

    suites: tuple[Any, ...] = ()
    batch_size: int = 8
    limit: int | None = None


class Topic(Enum):
    """A part of the session that panels watch; a watcher gets the part's new value."""

    SOURCES = "sources"  # SourcesState
    DRAFT = "draft"  # the Draft the method form shows (gui/draft.py): what a merge, a recipe, a search runs
    ANALYSIS = "analysis"  # the ProbeReport shown (or None); the session's analysis_key says what it measured
    SCORING = "scoring"  # Scoring
    MODEL_OFFERED = "model offered"  # a ModelEntry to add to the models to score
    RESULT = "merge result"  # the MergeResult shown, or None
    SCORES = "scores"  # the latest EvalResult of Evaluate


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


@dataclass
class Session:
    """The window's shared state (see the module docstring). The values: ``sources``, ``draft``, ``analysis``,
    ``scoring``, ``result``, ``scores`` (each written through its ``set_`` method, which tells the topic's watchers; the
    draft by the method form and by what loads a merge into it, each of the others by one panel) and the
    scores cache every scoring run of the window shares. Freshness: ``made(part)``: a fresh result is shown;
    ``dropped(part)``: none is shown; ``changed(change)``: the parts held that it invalidates turn stale (returns
    them). Freshness listeners get ``(part, reason)`` (None: fresh or gone) whenever a part's state changes."""

    sources: SourcesState = field(default_factory=SourcesState)
    draft: Draft = field(default_factory=Draft)
    analysis: Any = None  # the ProbeReport shown
    analysis_key: tuple | None = None  # what it measured (the window's sources-and-ε key)
    scoring: Scoring = field(default_factory=Scoring)
    result: Any = None  # the MergeResult shown
    scores: Any = None  # the latest EvalResult of Evaluate
    score_cache: ScoreCache = field(default_factory=ScoreCache)
    _held: dict[Part, str | None] = field(default_factory=dict, repr=False)  # part -> None (fresh) or why stale
    _listeners: list[Listener] = field(default_factory=list, repr=False)
    _watchers: dict[Topic, list[Callable[[Any], None]]] = field(default_factory=dict, repr=False)

    # --- the shared values ----------------------------------------------------------------------------
    def watch(self, topic: Topic, watcher: Callable[[Any], None]) -> None:
        """Call ``watcher(value)`` whenever ``topic`` is written."""
        self._watchers.setdefault(topic, []).append(watcher)

    def _publish(self, topic: Topic, value: Any) -> None:
        for watcher in list(self._watchers.get(topic, ())):
            watcher(value)

    def set_sources(self, sources: SourcesState) -> None:
        """The Sources step changed (told even when equal: a row's state may have changed the window's actions)."""
        self.sources = sources
        self._publish(Topic.SOURCES, sources)

    def set_draft(self, draft: Draft) -> None:
        """The merge drafted changed (the same draft again tells nobody). A watcher that writes a newer draft
        while being told (the method form completing one) has told everyone of it: the older one stops there."""
        if draft == self.draft:
            return
        self.draft = draft
        for watcher in list(self._watchers.get(Topic.DRAFT, ())):
            if self.draft is not draft:
                break
            watcher(draft)

    def set_analysis(self, report: Any, key: tuple | None = None) -> None:
        """A new analysis is shown (fresh), or none (``report`` None)."""
        self.analysis, self.analysis_key = report, key if report is not None else None
        self._publish(Topic.ANALYSIS, report)
        if report is None:
            self.dropped(Part.ANALYSIS)
        else:
            self.made(Part.ANALYSIS)

    def relabel_analysis(self, report: Any) -> None:
        """The analysis shown, with its agents renamed: the same statistics, so its freshness stays as it is."""
        self.analysis = report
        self._publish(Topic.ANALYSIS, report)

    def set_scoring(self, scoring: Scoring) -> None:
        if scoring != self.scoring:
            self.scoring = scoring
            self._publish(Topic.SCORING, scoring)

    def offer_model(self, entry: ModelEntry) -> None:
        """A model made in this session (a merge, a compared variant) is offered for scoring."""
        self._publish(Topic.MODEL_OFFERED, entry)

    def set_result(self, result: Any) -> None:
        self.result = result
        self._publish(Topic.RESULT, result)

    def set_scores(self, scores: Any) -> None:
        self.scores = scores
        self._publish(Topic.SCORES, scores)

    # --- freshness --------------------------------------------------------------------------------------
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
