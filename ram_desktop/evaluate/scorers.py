"""Scorers: how a completion earns a reward.

A scorer has the TRL GRPO reward signature ``f(prompts, completions, **columns) -> list[float]``:
``prompts`` and ``completions`` are lists of strings and every extra column of the suite (``answer``
and anything else a row carries) arrives as a keyword argument holding one value per example.

Built-in scorers give 0 or 1 and compare with the ``answer`` column:

- ``exact``: the completion, whitespace-stripped, equals the answer (also stripped);
- ``contains``: the stripped answer occurs in the completion;
- ``number``: the first number in the completion equals the answer numerically
  (``1,000`` = ``1000``, ``2.50`` = ``2.5``, ``1e3`` = ``1000``);
- ``regex:PATTERN``: the stripped completion matches PATTERN as a whole (``re.fullmatch``); the
  answer is not used.

An answer that is a JSON list accepts any of its items (exact, contains, number).

``python:FILE.py:FUNCTION`` is the user's own reward function, e.g. the one an agent was trained
with. Parsing a spec (``parse_scorer``, done when a suite is opened) only checks the text and that
the file exists; the file is executed by ``make_scorer``, which only an evaluation calls, so opening
a suite or a recipe never runs code. ``ScorerSpec.file`` says which file will run.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal, Protocol

from ..core import InputError
from .scorer_process import DEFAULT_TIMEOUT, ScorerError, ScorerProcess, call

ScorerKind = Literal["exact", "contains", "number", "regex", "python"]
BUILTIN = ("exact", "contains", "number")
FORMS = "exact, contains, number, regex:PATTERN or python:FILE.py:FUNCTION"
NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class ScorerSpec:
    """A parsed scorer spec; nothing has been executed. For ``python`` scorers ``file`` is the file
    an evaluation will run and ``function`` the name it will call."""

    kind: ScorerKind
    text: str
    pattern: str | None = None
    file: Path | None = None
    function: str | None = None

    @property
    def needs_answer(self) -> bool:
        return self.kind in BUILTIN

    def describe(self) -> str:
        """One line for a window or a log: what scores the suite, and which file runs for a python scorer."""
        if self.kind == "python":
            return f"python reward function {self.function}() in {self.file} (runs when the evaluation starts)"
        if self.kind == "regex":
            return f"regex full match of {self.pattern!r}"
        return self.kind


def parse_scorer(text: str, base_dir: Path | None = None) -> ScorerSpec:
    """Check a scorer spec without running anything. A python scorer's file is resolved against
    ``base_dir`` (the suite's folder; the current folder when None) and must exist."""
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"empty scorer; use {FORMS}")
    text = text.strip()
    if text in BUILTIN:
        return ScorerSpec(text, text)  # type: ignore[arg-type]
    kind, sep, rest = text.partition(":")
    if sep and kind == "regex":
        try:
            re.compile(rest)
        except re.error as e:
            raise InputError(f"scorer {text!r}: not a valid regular expression ({e})") from None
        return ScorerSpec("regex", text, pattern=rest)
    if sep and kind == "python":
        file_text, sep2, function = rest.rpartition(":")
        if not sep2 or not file_text.endswith(".py") or not function.isidentifier():
            raise InputError(f"scorer {text!r}: write a python scorer as python:FILE.py:FUNCTION")
        file = Path(file_text).expanduser()
        if not file.is_absolute():
            file = (base_dir or Path.cwd()) / file
        file = file.resolve()
        if not file.is_file():
            raise InputError(f"scorer {text!r}: no such file {file}")
        return ScorerSpec("python", text, file=file, function=function)
    raise InputError(f"unknown scorer {text!r}; use {FORMS}")


class Rows(Protocol):
    """What a scorer reads of a suite (``suites.Suite`` is one): declared here so that scorers never import
    suites, which import scorers."""

    @property
    def name(self) -> str: ...
    @property
    def data_file(self) -> Path: ...
    @property
    def prompts(self) -> Sequence[str]: ...
    @property
    def columns(self) -> Mapping[str, Sequence[Any]]: ...
    @property
    def lines(self) -> Sequence[int]: ...


class Scorer:
    """A scorer with the TRL reward signature; ``spec`` says what it is. A built-in runs in this process;
    a python scorer's function runs in ``process`` (``scorer_process.ScorerProcess``), ``timeout`` seconds
    at most per call."""

    def __init__(
        self,
        spec: ScorerSpec,
        function: Callable[..., Any] | None = None,
        process: ScorerProcess | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.spec = spec
        self.function = function
        self.process = process
        self.timeout = timeout

    @property
    def name(self) -> str:
        """How messages name the scorer: the built-in's name, or ``FUNCTION in FILE``."""
        if self.spec.kind == "python":
            return f"function {self.spec.function} in {self.spec.file}"
        return f"scorer {self.spec.text!r}"

    def __call__(self, prompts: list[str], completions: list[str], **columns: list[Any]) -> list[Any]:
        """The rewards as the function returned them (a python scorer's as plain floats), unchecked."""
        kind, value = self._send(prompts, completions, columns)()
        if kind == "failed":
            raise ScorerError(value)
        return value if kind == "values" else []

    def _send(
        self, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]
    ) -> Callable[[], tuple[str, Any]]:
        """Start the call; what it returns gives the answer (a python scorer's child computes meanwhile)."""
        if self.process is not None:
            assert self.spec.file is not None and self.spec.function is not None
            self.process.send_call(self.spec.file, self.spec.function, prompts, completions, columns, self.timeout)
            return self.process.receive
        assert self.function is not None
        answer = call(self.function, prompts, completions, columns)
        return lambda: answer

    def check(self, suite: Rows) -> None:
        """Refuse a suite this scorer cannot score before anything is generated: a built-in scorer
        needs an answer on every row (a number for ``number``)."""
        if not self.spec.needs_answer:
            return
        answers = suite.columns.get("answer")
        for i, line in enumerate(suite.lines):
            answer = answers[i] if answers is not None else None
            if answer is None or answer == []:
                raise InputError(
                    f'{suite.data_file}, line {line}: no "answer"; the {self.spec.kind} scorer '
                    f"compares the completion with it"
                )
            if self.spec.kind == "number":
                for item in answer if isinstance(answer, list) else [answer]:
                    if _answer_number(item) is None:
                        raise InputError(
                            f"{suite.data_file}, line {line}: the answer {item!r} is not a number; "
                            f"the number scorer needs one"
                        )

    def score(self, suite: Rows, completions: Sequence[str], indices: Sequence[int] | None = None) -> list[float]:
        """Rewards for ``completions`` of the examples ``indices`` of ``suite`` (default: all, in order),
        checked: one finite number each.

        A scorer that raises, returns anything else, runs past its time limit, or ends or crashes its
        process becomes an ``InputError`` naming the suite, the function and the examples."""
        return self.submit(suite, completions, indices)()

    def submit(
        self, suite: Rows, completions: Sequence[str], indices: Sequence[int] | None = None
    ) -> Callable[[], list[float]]:
        """``score``, started: a python scorer's child scores while the caller goes on (generates the next
        batch); calling what this returns waits for the rewards (or raises ``InputError``). One at a time."""
        examples = list(range(len(suite.prompts))) if indices is None else list(indices)
        n = len(examples)
        if len(completions) != n:
            raise ValueError(f"{len(completions)} completions for {n} prompts")
        where = f"suite {suite.name!r} ({suite.data_file}): {self.name}"
        scoring = f"scoring {_examples(suite, examples)}"
        prompts = [suite.prompts[i] for i in examples]
        columns = {k: [v[i] for i in examples] for k, v in suite.columns.items()}
        try:
            receive = self._send(prompts, list(completions), columns)
        except ScorerError as e:
            raise InputError(f"{where} {e} ({scoring})") from None

        def rewards() -> list[float]:
            try:
                kind, value = receive()
            except ScorerError as e:
                raise InputError(f"{where} {e} ({scoring})") from None
            return self._checked(kind, value, suite, examples, where, scoring)

        return rewards

    def _checked(
        self, kind: str, value: Any, suite: Rows, examples: list[int], where: str, scoring: str
    ) -> list[float]:
        n = len(examples)
        if kind == "failed":
            raise InputError(f"{where} {value} ({scoring})")
        if kind == "returned":
            raise InputError(
                f"{where} returned {value}; a reward function returns a list with one number per completion "
                f"({n}) ({scoring})"
            )
        if len(value) != n:
            raise InputError(
                f"{where} returned {len(value)} scores for {n} completions; it must return one per completion "
                f"({scoring})"
            )
        for i, r in sorted(zip(examples, value), key=lambda pair: pair[0]):  # the first bad one in suite order
            if not isinstance(r, float) or not math.isfinite(r):
                raise InputError(
                    f"{where} returned {r if isinstance(r, str) else repr(r)} as the score of example {i + 1} "
                    f"({suite.data_file}, line {suite.lines[i]}); scores must be finite numbers"
                )
        return value


def _examples(suite: Rows, indices: Sequence[int]) -> str:
    """The examples of a batch, for a message: ``example 3 (line 3)`` or ``examples 1, 5, 9 and 5 more (lines 1, 5, 9, ...)``."""
    ordered = sorted(indices)
    if len(ordered) == 1:
        return f"example {ordered[0] + 1} (line {suite.lines[ordered[0]]})"
    shown = ordered[:5]
    more = f" and {len(ordered) - 5} more" if len(ordered) > 5 else ""
    lines = ", ".join(str(suite.lines[i]) for i in shown) + (", ..." if more else "")
    return f"examples {', '.join(str(i + 1) for i in shown)}{more} (lines {lines})"


def make_scorer(
    spec: str | ScorerSpec,
    base_dir: Path | None = None,
    process: ScorerProcess | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Scorer:
    """The scorer for ``spec``. A ``python:`` scorer's file is executed here (the user's own code), in
    ``process`` (a new ``ScorerProcess`` when None; it ends with this process) within ``timeout``
    seconds: call this only when an evaluation starts. A file that cannot load is an ``InputError``."""
    if isinstance(spec, str):
        spec = parse_scorer(spec, base_dir)
    if spec.kind == "exact":
        return Scorer(spec, _per_example(lambda c, a: c.strip() == _answer_text(a).strip()))
    if spec.kind == "contains":
        return Scorer(spec, _per_example(lambda c, a: _answer_text(a).strip() in c))
    if spec.kind == "number":
        return Scorer(spec, _per_example(_same_number))
    if spec.kind == "regex":
        pattern = re.compile(spec.pattern or "")
        return Scorer(
            spec,
            lambda prompts, completions, **_: [float(pattern.fullmatch(c.strip()) is not None) for c in completions],
        )
    assert spec.file is not None and spec.function is not None
    process = process or ScorerProcess()
    try:
        process.load(spec.file, spec.function, timeout)
    except ScorerError as e:
        raise InputError(f"{e} (scorer {spec.text!r})") from None
    return Scorer(spec, process=process, timeout=timeout)


def _per_example(match: Callable[[str, Any], bool]) -> Callable[..., list[float]]:
    """A reward function from a per-example comparison with the answer; a list answer accepts any item."""

    def reward(prompts: list[str], completions: list[str], answer: list[Any], **_: Any) -> list[float]:
        return [
            float(any(match(c, item) for item in (a if isinstance(a, list) else [a])))
            for c, a in zip(completions, answer)
        ]

    return reward


def _answer_text(answer: Any) -> str:
    return answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)


def _answer_number(answer: Any) -> Decimal | None:
    if isinstance(answer, bool):
        return None
    if isinstance(answer, (int, float)):
        text = repr(answer)
    elif isinstance(answer, str):
        text = answer.strip().replace(",", "")
    else:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def first_number(completion: str) -> Decimal | None:
    """The first number written in ``completion`` (thousands separators allowed), or None."""
    m = NUMBER.search(completion)
    return Decimal(m.group(0).replace(",", "")) if m else None


def _same_number(completion: str, answer: Any) -> bool:
    found, expected = first_number(completion), _answer_number(answer)
    return found is not None and expected is not None and found == expected
