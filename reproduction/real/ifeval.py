"""An IFEval-style check (the paper's Table 3 in spirit): does merging keep general instruction following?

Held-out chat prompts — none of them is a training task — each with one or two constraints that a program
can check: a word limit, a required keyword, all lowercase, all uppercase, valid JSON, no commas, a fixed
first word, a fixed ending, a number of bullet points. ``ifeval_reward`` (TRL signature, so it is also a
``python:ifeval.py:ifeval_reward`` suite scorer) gives the share of a prompt's constraints met
(IFEval's instruction-level accuracy); ``ifeval_strict`` gives 1.0 only when all are met (prompt-level).
Only the standard library.
"""

from __future__ import annotations

import json
import re

TOPICS = (
    "the ocean",
    "autumn",
    "a good breakfast",
    "learning to swim",
    "city parks",
    "the moon",
    "bicycles",
    "rainy days",
    "friendship",
    "mountains",
    "coffee",
    "libraries",
)

# (instruction text, check name, argument)
CONSTRAINTS = (
    ("Answer in fewer than 20 words.", "max_words", 20),
    ("Use the word 'green' at least once.", "keyword", "green"),
    ("Write everything in lowercase letters only.", "lowercase", None),
    ("Write everything in capital letters.", "uppercase", None),
    ("Reply with a JSON object only.", "json", None),
    ("Do not use any commas.", "no_commas", None),
    ("Start your reply with the word 'Yes'.", "starts_with", "Yes"),
    ("End your reply with the words 'That is all.'", "ends_with", "That is all."),
    ("Answer with exactly three bullet points starting with '-'.", "bullets", 3),
)
PAIRS = ((0, 2), (1, 5), (3,), (4,), (6, 0), (7,), (8,), (2, 5), (1,), (0,), (6, 1), (5, 3))


def _text(completion: object) -> str:
    if isinstance(completion, list):
        completion = completion[-1]["content"] if completion else ""
    return str(completion).strip()


def check(name: str, arg: object, text: str) -> bool:
    """Whether ``text`` meets one constraint."""
    if name == "max_words":
        return 0 < len(text.split()) < int(arg)  # type: ignore[call-overload]
    if name == "keyword":
        return re.search(rf"\b{re.escape(str(arg))}\b", text, re.IGNORECASE) is not None
    if name == "lowercase":
        return text != "" and text == text.lower()
    if name == "uppercase":
        return any(c.isalpha() for c in text) and text == text.upper()
    if name == "json":
        body = text.removeprefix("```json").removeprefix("```").removesuffix("```").strip()
        try:
            return isinstance(json.loads(body), dict)
        except ValueError:
            return False
    if name == "no_commas":
        return text != "" and "," not in text
    if name == "starts_with":
        return re.match(rf"\W*{re.escape(str(arg))}\b", text, re.IGNORECASE) is not None
    if name == "ends_with":
        return text.endswith(str(arg))
    if name == "bullets":
        return len([line for line in text.splitlines() if line.strip().startswith("- ")]) == int(arg)  # type: ignore[call-overload]
    raise ValueError(f"unknown constraint {name!r}")


def make_prompts(n: int | None = None) -> list[dict]:
    """The held-out prompts (``n`` of them, default all 144): a topic and one or two constraints."""
    rows = []
    for i, topic in enumerate(TOPICS):
        for k, pair in enumerate(PAIRS):
            chosen = [CONSTRAINTS[j] for j in pair]
            task = ("Write a short note about", "Describe", "Tell me about")[(i + k) % 3]
            prompt = f"{task} {topic}. " + " ".join(text for text, _, _ in chosen)
            rows.append({"prompt": prompt, "checks": [[name, arg] for _, name, arg in chosen]})
    rows.sort(key=lambda r: (len(r["checks"]), r["prompt"]))  # fixed order; a prefix mixes topics
    rows = rows[::2] + rows[1::2]
    return rows[:n] if n else rows


def ifeval_reward(prompts, completions, checks, **_) -> list[float]:
    """The share of the prompt's constraints that the reply meets (instruction-level accuracy)."""
    return [sum(check(name, arg, _text(c)) for name, arg in cs) / len(cs) for c, cs in zip(completions, checks)]


def ifeval_strict(prompts, completions, checks, **_) -> list[float]:
    """1.0 when the reply meets every constraint of its prompt (prompt-level accuracy)."""
    return [float(all(check(name, arg, _text(c)) for name, arg in cs)) for c, cs in zip(completions, checks)]
