"""Reward functions for the three tasks, in the TRL GRPO signature ``f(prompts, completions, **columns)``.

The same functions train the agents (``GRPOTrainer(reward_funcs=...)``) and score every model on the
suites (``python:reward.py:FUNCTION``). 1.0 is a fully correct answer; a wrong answer earns partial
credit for being close, so that a small policy's group of samples differs in reward and GRPO has a
gradient to follow (a 0/1 reward left most groups all-zero here). ``exact_match`` gives the 0/1
view used beside the reward in the results. Only the standard library: a suite's scorer runs anywhere.
"""

from __future__ import annotations

import difflib
import re

_CALL = re.compile(r"([a-z]+)\((.*)\)")
_INT = re.compile(r"-?\d+")


def _text(completion) -> str:
    if isinstance(completion, list):  # conversational completions: [{"role": ..., "content": ...}]
        completion = completion[-1]["content"] if completion else ""
    return str(completion).strip()


def exact_match(prompts, completions, answer, **_) -> list[float]:
    """1.0 when the completion is exactly the answer."""
    return [1.0 if _text(c) == str(a).strip() else 0.0 for c, a in zip(completions, answer)]


def code_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 for the program's value; a number off by k earns 0.5·(1 - k/10) (nothing from 10 away)."""
    out = []
    for c, a in zip(completions, answer):
        text, want = _text(c), int(a)
        if text == str(want):
            out.append(1.0)
        elif _INT.fullmatch(text):
            out.append(0.5 * max(0.0, 1.0 - abs(int(text) - want) / 10))
        else:
            out.append(0.0)
    return out


def tool_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 for the exact call; a well-formed call naming the right tool earns 0.25 plus up to 0.5 for
    how closely its argument matches the one asked for."""
    out = []
    for c, a in zip(completions, answer):
        text, want = _text(c), str(a).strip()
        if text == want:
            out.append(1.0)
            continue
        got, expected = _CALL.fullmatch(text), _CALL.fullmatch(want)
        if got and expected and got.group(1) == expected.group(1):
            out.append(0.25 + 0.5 * difflib.SequenceMatcher(None, got.group(2), expected.group(2)).ratio())
        else:
            out.append(0.0)
    return out


def memory_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 for the value stored under the asked key; 0.25 for another value of the context (a
    retrieval, but of the wrong key) or per digit right in its place."""
    out = []
    for p, c, a in zip(prompts, completions, answer):
        text, want = _text(c), str(a).strip()
        if text == want:
            out.append(1.0)
            continue
        stored = set(re.findall(r"[a-z]=(\d+)", str(p)))
        if text in stored:
            out.append(0.25)
        else:
            out.append(0.25 * sum(x == y for x, y in zip(text, want)) if len(text) == len(want) else 0.0)
    return out


REWARDS = {"code": "code_reward", "tool": "tool_reward", "memory": "memory_reward"}
