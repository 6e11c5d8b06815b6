"""Rewards for the real-model tasks, in the TRL GRPO signature ``f(prompts, completions, **columns)``.

The same functions train the agents (``GRPOTrainer(reward_funcs=...)``) and score every model on the
suites (``scorer: python:reward.py:FUNCTION``, copied into each suite folder). 1.0 is a correct answer;
a wrong one earns partial credit for being close, so that groups of samples differ in reward and GRPO
has a gradient to follow. The chat model is verbose: the answer is read from the start of the reply
(the first number, the first call). Only the standard library, so a suite's scorer runs anywhere.
"""

from __future__ import annotations

import ast
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


def parse_call(text: str) -> tuple[str, str] | None:
    """The first tool call in ``text`` as (tool, argument), both lower-case, parsed as a Python call
    expression (``ast``), not matched by its shape: one argument, positional or keyword, that is a string, a
    number or a bare name (``weather(Oslo)``, ``weather("Oslo")``, ``weather(city='oslo')``, ``timer(15)``).
    A call with no argument, two, or an argument that is itself an expression is no call; None when the
    reply holds none."""
    for start in re.finditer(r"[A-Za-z_]\w*\s*\(", text):
        depth, end = 0, None
        for i in range(start.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if depth == 0:
                end = i + 1
                break
        if end is None:
            continue
        try:
            node = ast.parse(text[start.start() : end].strip(), mode="eval").body
        except SyntaxError:
            continue
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        values = [*node.args, *(k.value for k in node.keywords)]
        if len(values) != 1:
            continue
        value = values[0]
        if isinstance(value, ast.Constant) and isinstance(value.value, (str, int, float)):
            arg = str(value.value)
        elif isinstance(value, ast.Name):
            arg = value.id
        else:
            continue
        return node.func.id.lower(), arg.strip().lower()
    return None


def tool_call_exact(prompts, completions, answer, **_) -> list[float]:
    """The tool task's primary metric: 1.0 when the reply's first parsed call (``parse_call``) names the right
    tool with the right argument (case and quotes aside), else 0.0. A constant reply such as ``weather()``
    earns nothing: no argument, so no call (the partial credit of ``tool_reward`` is the secondary column)."""
    return [float(parse_call(_text(c)) == parse_call(str(a))) for c, a in zip(completions, answer)]


def arith_reward(prompts, completions, answer, **_) -> list[float]:
    """Arithmetic word problems: as ``code_reward`` (the first number of the reply, partial credit when close)."""
    return code_reward(prompts, completions, answer)


def retrieval_reward(prompts, completions, answer, **_) -> list[float]:
    """Retrieval over a passage (``NAME works at the PLACE.`` sentences): 1.0 when the first name of the passage
    that the reply says (else its first word) is the one asked for; 0.25 for another name of the passage."""
    out = []
    for p, c, a in zip(prompts, completions, answer):
        words = re.findall(r"[A-Za-z]+", _text(c))
        names = re.findall(r"\b([A-Z][a-z]+) works at\b", _text(p))
        got = next((w for w in words if w in names), words[0] if words else "")
        if got.lower() == str(a).strip().lower():
            out.append(1.0)
        elif got in names:
            out.append(0.25)
        else:
            out.append(0.0)
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


# what GRPO trains on: partial credit, so that a group of samples differs in reward
REWARDS = {
    "code": "code_reward",
    "tool": "tool_reward",
    "memory": "memory_reward",
    "arith": "arith_reward",
    "retrieval": "retrieval_reward",
}
# what every model is scored with (the suites' scorer, the floors): the tool task's primary metric is the exact
# call, since its partial credit rewards the shape of a call (a constant `weather()` earned 30 % of it)
SCORERS = {**REWARDS, "tool": "tool_call_exact"}
# secondary columns beside the primary score: (column, function)
SECONDARY = {"tool": ("partial", "tool_reward")}
