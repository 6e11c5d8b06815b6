"""The engine's advice in command-line words, said in the window's words with the button that follows it
(the message bar at the top offers it)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from .panel import MethodPanel

# the engine's advice in command-line words -> (the window's words, the button that does it: label, method
# panel setter, value)
FLAG_ADVICE = {
    "pass --vocab common (recipe: 'vocab: common')": (
        "choose Vocabulary: common rows (section 3)",
        ("Use common vocabulary", "set_vocab", "common"),
    ),
}


def window_words(text: str, method: MethodPanel) -> tuple[str, tuple[str, Callable[[], None]] | None]:
    """``text`` with command-line advice in the window's words, and the fix it offers: the button's label and
    what it does to ``method`` (None: no fix)."""
    for flag, (words, (label, setter, value)) in FLAG_ADVICE.items():
        if flag in text:
            return text.replace(flag, words), (label, partial(getattr(method, setter), value))
    return text, None
