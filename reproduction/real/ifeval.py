"""IFEval through lm-eval's own checkers: does merging keep general instruction following (the paper's Table 3)?

The prompts are written here in IFEval's form (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``; the
committed ``ifeval_prompts.jsonl``, made by ``make_prompts``): a request about a topic followed by one to three
instructions whose text is the description lm-eval's own instruction class builds from the kwargs
(``build_description``), so prompt and checker cannot disagree. Every instruction type of lm-eval 0.4.13's
registry is used except ``length_constraints:number_sentences`` (see below); none is a training task.

Scoring is lm-eval's: ``lm_eval.tasks.ifeval.utils.test_instruction_following_strict`` and ``..._loose`` (the
loose one also tries the reply without its first / last line and without ``*``). ``instruction_strict`` (TRL
signature, so it is the suite's ``python:ifeval.py:instruction_strict`` scorer) gives the share of a prompt's
instructions followed; ``follow`` gives every flag for the four IFEval numbers (prompt- and instruction-level,
strict and loose).

lm-eval's ``instructions_util`` calls ``nltk.download("punkt_tab")`` at import when NLTK's sentence model is
not installed; with no network that fails. ``ensure_punkt_tab`` runs first: when ``tokenizers/punkt_tab/english``
is not on NLTK's path it writes a Punkt parameter folder holding only a list of common English abbreviations
(not NLTK's trained English model) into ``~/.cache/ram-desktop/nltk_data`` and puts that on the path. Only
``count_sentences`` reads it, i.e. only ``length_constraints:number_sentences`` — the one type the prompts
leave out, so no score here depends on the substitute.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPTS_FILE = HERE / "ifeval_prompts.jsonl"
N_PROMPTS = 240
IMPLEMENTATION = "lm-eval 0.4.13 lm_eval.tasks.ifeval (instructions_registry, utils.test_instruction_following_*)"
LEFT_OUT = ("length_constraints:number_sentences",)  # reads NLTK's punkt model, which cannot be fetched here
ABBREVIATIONS = ("mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "inc", "ltd", "no")

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
    "honey bees",
    "trains",
    "volcanoes",
    "chess",
)
REQUESTS = ("Write a short note about {}.", "Describe {}.", "Tell me about {}.", "Write a few lines on {}.")
WORDS = ("river", "light", "window", "garden", "music", "paper", "silver", "winter", "market", "stone", "forest")
LANGUAGES = ("fr", "de", "es", "it", "en")


def ensure_punkt_tab() -> None:
    """Make ``tokenizers/punkt_tab/english`` findable by NLTK without a download (see the module docstring)."""
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        return
    except LookupError:
        pass
    root = Path(os.environ.get("RAM_DESKTOP_NLTK_DATA", Path.home() / ".cache" / "ram-desktop" / "nltk_data"))
    folder = root / "tokenizers" / "punkt_tab" / "english"
    if not (folder / "ortho_context.tab").exists():
        staging = folder.parent / f".english.{os.getpid()}"
        staging.mkdir(parents=True, exist_ok=True)
        (staging / "abbrev_types.txt").write_text("\n".join(ABBREVIATIONS) + "\n")
        for name in ("collocations.tab", "sent_starters.txt", "ortho_context.tab"):
            (staging / name).write_text("")
        try:
            staging.rename(folder)
        except OSError:  # another process made it first
            for f in staging.iterdir():
                f.unlink()
            staging.rmdir()
    if str(root) not in nltk.data.path:
        nltk.data.path.append(str(root))


def registry():
    """lm-eval's instruction registry (``INSTRUCTION_DICT``, ``INSTRUCTION_CONFLICTS``), punkt_tab ensured first."""
    ensure_punkt_tab()
    from lm_eval.tasks.ifeval import instructions_registry

    return instructions_registry


def _kwargs(instruction: str, rng: random.Random, request: str) -> dict:
    """Explicit arguments for one instruction (lm-eval would draw missing ones at random)."""
    relation = rng.choice(("less than", "at least"))
    return {
        "change_case:capital_word_frequency": {"capital_frequency": rng.randint(2, 5), "capital_relation": relation},
        "combination:repeat_prompt": {"prompt_to_repeat": request},
        "detectable_content:number_placeholders": {"num_placeholders": rng.randint(1, 3)},
        "detectable_content:postscript": {"postscript_marker": rng.choice(("P.S.", "P.P.S"))},
        "detectable_format:multiple_sections": {
            "section_spliter": rng.choice(("Section", "SECTION")),
            "num_sections": rng.randint(2, 4),
        },
        "detectable_format:number_bullet_lists": {"num_bullets": rng.randint(2, 5)},
        "detectable_format:number_highlighted_sections": {"num_highlights": rng.randint(1, 3)},
        "keywords:existence": {"keywords": rng.sample(WORDS, 2)},
        "keywords:forbidden_words": {"forbidden_words": rng.sample(WORDS, 2)},
        "keywords:frequency": {"keyword": rng.choice(WORDS), "frequency": rng.randint(1, 3), "relation": relation},
        "keywords:letter_frequency": {
            "letter": rng.choice("abcdefghilmnoprstuw"),
            "let_frequency": rng.randint(2, 6),
            "let_relation": relation,
        },
        "language:response_language": {"language": rng.choice(LANGUAGES)},
        "length_constraints:nth_paragraph_first_word": {
            "num_paragraphs": (n := rng.randint(2, 4)),
            "nth_paragraph": rng.randint(1, n),
            "first_word": rng.choice(WORDS),
        },
        "length_constraints:number_paragraphs": {"num_paragraphs": rng.randint(2, 4)},
        "length_constraints:number_words": {"num_words": rng.choice((20, 40, 60, 100, 150)), "relation": relation},
        "startend:end_checker": {"end_phrase": rng.choice(("Any other questions?", "Is there anything else?"))},
    }.get(instruction, {})


def make_prompts(n: int = N_PROMPTS) -> list[dict]:
    """``n`` prompts in IFEval's form, the same every time: prompt i's first instruction cycles through every
    type used (so each appears about n / 24 times), one or two more are drawn without conflicts; a prompt
    drawn twice is drawn again with another topic."""
    reg = registry()
    types = [t for t in sorted(reg.INSTRUCTION_DICT) if t not in LEFT_OUT]
    rows: list[dict] = []
    seen: set[str] = set()
    for i in range(n):
        for attempt in range(100):  # a prompt drawn twice is drawn again
            rng = random.Random(f"ifeval-{i}-{attempt}" if attempt else f"ifeval-{i}")
            row = _prompt(reg, types, i, rng, TOPICS[i % len(TOPICS)] if attempt == 0 else rng.choice(TOPICS))
            if row["prompt"] not in seen:
                break
        seen.add(row["prompt"])
        rows.append(row)
    return rows


def _prompt(reg, types: list[str], i: int, rng: random.Random, topic: str) -> dict:
    request = rng.choice(REQUESTS).format(topic)
    chosen = [types[i % len(types)]]
    for _ in range(rng.choice((0, 1, 1, 2))):
        free = [t for t in types if all(t not in reg.INSTRUCTION_CONFLICTS[c] and t != c for c in chosen)]
        free = [t for t in free if all(c not in reg.INSTRUCTION_CONFLICTS[t] for c in chosen)]
        if free:
            chosen.append(rng.choice(free))
    if "combination:repeat_prompt" in chosen:  # it must come first: the reply starts with the request
        chosen.remove("combination:repeat_prompt")
        chosen.insert(0, "combination:repeat_prompt")
    kwargs = [_kwargs(t, rng, request) for t in chosen]
    texts = [reg.INSTRUCTION_DICT[t](t).build_description(**k) for t, k in zip(chosen, kwargs)]
    return {"key": i, "prompt": " ".join([request, *texts]), "instruction_id_list": chosen, "kwargs": kwargs}


def load_prompts(n: int | None = None) -> list[dict]:
    """The committed prompts (``ifeval_prompts.jsonl``), the first ``n`` when given."""
    rows = [json.loads(line) for line in PROMPTS_FILE.read_text().splitlines() if line.strip()]
    return rows[:n] if n else rows


def _text(completion: object) -> str:
    if isinstance(completion, list):
        completion = completion[-1]["content"] if completion else ""
    return str(completion)


def follow(prompts, completions, instruction_id_list, kwargs, loose: bool = False, key=None, **_) -> list[list[bool]]:
    """lm-eval's verdict on every instruction of every prompt (strict, or loose)."""
    registry()
    from lm_eval.tasks.ifeval import utils

    test = utils.test_instruction_following_loose if loose else utils.test_instruction_following_strict
    keys = key if key is not None else range(len(prompts))
    out = []
    for k, p, c, ids, kw in zip(keys, prompts, completions, instruction_id_list, kwargs):
        example = utils.InputExample(key=k, instruction_id_list=list(ids), prompt=_text(p), kwargs=list(kw))
        out.append(list(test(example, _text(c)).follow_instruction_list))
    return out


def instruction_strict(prompts, completions, instruction_id_list, kwargs, **columns) -> list[float]:
    """Per prompt, the share of its instructions followed, lm-eval's strict test (the suite's scorer)."""
    return [sum(f) / len(f) for f in follow(prompts, completions, instruction_id_list, kwargs, **columns)]


def summary(flags_strict: list[list[bool]], flags_loose: list[list[bool]]) -> dict[str, float]:
    """IFEval's four numbers: prompt-level (all followed) and instruction-level (pooled), strict and loose."""
    out = {}
    for mode, flags in (("strict", flags_strict), ("loose", flags_loose)):
        out[f"prompt_{mode}"] = sum(all(f) for f in flags) / len(flags)
        out[f"instruction_{mode}"] = sum(map(sum, flags)) / sum(map(len, flags))
    return out


if __name__ == "__main__":  # rewrite the committed prompts: python -m reproduction.real.ifeval
    PROMPTS_FILE.write_text("".join(json.dumps(r) + "\n" for r in make_prompts()))
    print(f"wrote {N_PROMPTS} prompts to {PROMPTS_FILE}")
