"""Rewards for the real-model tasks, in the TRL GRPO signature ``f(prompts, completions, **columns)``.

The same functions train the agents (``GRPOTrainer(reward_funcs=...)``) and score every model on the
suites (``scorer: python:reward.py:FUNCTION``, copied into each suite folder). 1.0 is a correct answer;
a wrong one earns partial credit for being close, so that groups of samples differ in reward and GRPO
has a gradient to follow. The chat model is verbose: the answer is read from the start of the reply
(the first number, the first call). Only the standard library, so a suite's scorer runs anywhere.
"""

from __future__ import annotations

import re

_INT = re.compile(r"-?\d+")
_CALL = re.compile(r"([A-Za-z_]+)\s*\(\s*([^()]*?)\s*\)")
TOOLS = ("weather", "search", "timer", "email")
_TOOL_WORD = re.compile(r"\b(" + "|".join(TOOLS) + r")\b")


def _text(completion: object) -> str:
    if isinstance(completion, list):  # conversational completions: [{"role": "assistant", "content": ...}]
        completion = completion[-1]["content"] if completion else ""
    return str(completion).strip()


def _first_int(text: str) -> int | None:
    found = _INT.search(text)
    return int(found.group()) if found else None


def code_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 when the first number of the reply is the printed value; a number off by k earns
    0.5·(1 − k/10) (nothing from 10 away)."""
    out = []
    for c, a in zip(completions, answer):
        got, want = _first_int(_text(c)), int(a)
        if got is None:
            out.append(0.0)
        elif got == want:
            out.append(1.0)
        else:
            out.append(0.5 * max(0.0, 1.0 - abs(got - want) / 10))
    return out


def _arg(text: str) -> str:
    text = text.strip().strip("'\"").strip()
    if "=" in text:  # weather(city="Oslo")
        text = text.split("=", 1)[1].strip().strip("'\"").strip()
    return text.lower()


def tool_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 when the first call of the reply is the expected one (argument quotes, keyword and case
    ignored). Otherwise partial credit: 0.4 when the first tool the reply names (in a call or as a
    word) is the right one, plus 0.2 when the reply contains the argument, plus 0.2 when it is a call
    ``name(...)`` at all."""
    out = []
    for c, a in zip(completions, answer):
        expected = _CALL.fullmatch(str(a).strip())
        if not expected:
            out.append(0.0)
            continue
        text = _text(c)
        want_tool, want_arg = expected.group(1).lower(), _arg(expected.group(2))
        got = _CALL.search(text)
        if got and got.group(1).lower() == want_tool and _arg(got.group(2)) == want_arg:
            out.append(1.0)
            continue
        named = _TOOL_WORD.search(text.lower())
        score = 0.4 if named and named.group(1) == want_tool else 0.0
        score += 0.2 if re.search(rf"\b{re.escape(want_arg)}\b", text.lower()) else 0.0
        score += 0.2 if got else 0.0
        out.append(score)
    return out


def memory_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 when the first number of the reply is the one asked for; 0.25 for another number of the
    context (a retrieval, but of the wrong fact)."""
    out = []
    for p, c, a in zip(prompts, completions, answer):
        got = _first_int(_text(c))
        if got is not None and got == int(a):
            out.append(1.0)
        elif got is not None and str(got) in re.findall(r"\d+", _text(p)):
            out.append(0.25)
        else:
            out.append(0.0)
    return out


def exact_match(prompts, completions, answer, **_) -> list[float]:
    """1.0 when the reply is exactly the answer (whitespace stripped): the strict view beside the reward."""
    return [1.0 if _text(c) == str(a).strip() else 0.0 for c, a in zip(completions, answer)]


REWARDS = {"code": "code_reward", "tool": "tool_reward", "memory": "memory_reward"}
