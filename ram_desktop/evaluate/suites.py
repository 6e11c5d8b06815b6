"""Evaluation suites: a JSONL file of examples, optionally with a ``suite.yaml``.

A suite is either

- a JSONL file, one example per line: ``{"prompt": str, "answer": ..., ...}``, with an optional
  ``suite.yaml`` in the same folder; or
- a folder holding ``data.jsonl`` and (optionally) ``suite.yaml``.

Every field of a row except ``prompt`` becomes a column handed to the scorer (TRL style: one list
per column; a row without a field gives None there). Blank lines are skipped.

``suite.yaml`` keys, all optional: ``name`` (default: the folder name for ``data.jsonl``, else the
file name without its extension), ``scorer`` (default ``exact``; see ``scorers``), ``max_new_tokens``
(default 64), ``chat_template`` (``auto`` | ``true`` | ``false``; default ``auto``: use the
tokenizer's chat template when it has one), ``system`` (system prompt), ``scorer_timeout`` (seconds a
python scorer may take per batch; default 60).

Loading a suite never runs code: a ``python:`` scorer is only parsed (its file must exist).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from ..core import InputError
from ..core.storage.safe_read import parse_json, parse_yaml, read_bytes, read_text
from .lm_eval_tasks import LmEvalTask, is_lm_eval, open_task
from .scorer_process import DEFAULT_TIMEOUT
from .scorers import ScorerSpec, parse_scorer

DATA_FILE = "data.jsonl"
SUITE_YAML = "suite.yaml"
YAML_KEYS = ("name", "scorer", "max_new_tokens", "chat_template", "system", "scorer_timeout")
ChatTemplate = Literal["auto", "true", "false"]


@dataclass(frozen=True, eq=False)
class Suite:
    """The examples of one suite and how to generate and score them."""

    name: str
    source: Path  # what was opened: the JSONL file or the suite folder (absolute)
    data_file: Path
    prompts: tuple[str, ...]
    columns: dict[str, tuple[Any, ...]]  # every field but "prompt": one value per example, None where missing
    lines: tuple[int, ...]  # 1-based line of each example in data_file
    scorer: str = "exact"
    max_new_tokens: int = 64
    chat_template: ChatTemplate = "auto"
    system: str | None = None
    config_file: Path | None = None  # the suite.yaml that was read, if any
    scorer_dir: Path = field(default=Path("."))  # a python scorer's file is relative to this folder
    scorer_timeout: float = DEFAULT_TIMEOUT  # seconds a python scorer may take per batch

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def scorer_spec(self) -> ScorerSpec:
        """The parsed scorer (runs nothing): ``.file`` is the file a python scorer will execute."""
        return parse_scorer(self.scorer, self.scorer_dir)

    def head(self, n: int | None) -> Suite:
        """The first ``n`` examples (all when ``n`` is None or not smaller)."""
        if n is None or n >= len(self):
            return self
        return replace(
            self, prompts=self.prompts[:n], lines=self.lines[:n], columns={k: v[:n] for k, v in self.columns.items()}
        )

    def with_scorer(self, spec: str) -> Suite:
        """The same suite scored by ``spec`` (checked, not run); a python file is relative to the suite."""
        parse_scorer(spec, self.scorer_dir)
        return replace(self, scorer=spec.strip())


def load_suites(specs: Sequence[str | Path], include_path: Sequence[str | Path] = ()) -> list[Suite | LmEvalTask]:
    """Each ``--suite`` value opened: a suite file or folder (``load_suite``), or ``lm-eval:TASK``, a task of
    lm-eval's or of a task YAML in ``include_path`` (``lm_eval_tasks.open_task``: checked, no data read)."""
    paths = [Path(p) for p in include_path]
    return [open_task(str(s), paths) if is_lm_eval(str(s)) else load_suite(s) for s in specs]


def scorer_folders(suites: Sequence[Suite | LmEvalTask]) -> dict[Path, list[tuple[str, str]]]:
    """The folders whose Python code an evaluation of ``suites`` runs (each python scorer's file's
    folder), with (suite name, file name) of each use; for the faces' first-run notice (``core.code_folders``).
    lm-eval tasks run lm-eval's own code, installed as a package, and name no folder."""
    folders: dict[Path, list[tuple[str, str]]] = {}
    for suite in suites:
        if not isinstance(suite, Suite):
            continue
        spec = suite.scorer_spec
        if spec.kind == "python" and spec.file is not None:
            folders.setdefault(spec.file.parent, []).append((suite.name, spec.file.name))
    return folders


def check_eval_options(batch_size: int, limit: int | None, scorer_timeout: float | None = None) -> None:
    """``--batch-size``, ``--limit`` and ``--scorer-timeout``, checked before any work (``compare`` calls it
    before its merges)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"--batch-size: the batch size must be a whole number of at least 1, got {batch_size!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"--limit: the limit must be a whole number of at least 1, got {limit!r}")
    if scorer_timeout is not None:
        check_timeout(scorer_timeout, "scorer timeout")


def check_timeout(value: Any, what: str) -> float:
    """A time limit in seconds: a finite number above 0 (``InputError`` naming ``what`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise InputError(f"{what}: expected a number of seconds above 0, found {value!r}")
    return float(value)


def load_suite(path: str | Path) -> Suite:
    """Open a suite (JSONL file, folder with ``data.jsonl``, or that folder's ``suite.yaml``).

    Raises ``InputError`` naming the file and line for anything wrong: missing file, invalid JSON,
    a row that is not an object or has no string prompt, no examples, bad ``suite.yaml`` keys or values.
    """
    given = Path(path).expanduser()
    if not given.exists():
        raise InputError(f"{given}: no such suite file or folder")
    given = given.resolve()
    if given.is_file() and given.name == SUITE_YAML:
        given = given.parent
    if given.is_dir():
        data_file, default_name = given / DATA_FILE, given.name
        if not data_file.exists():
            raise InputError(f"{given}: a suite folder needs {DATA_FILE} (and optionally {SUITE_YAML})")
    else:
        data_file = given
        default_name = given.parent.name if given.name == DATA_FILE else given.stem
    config_file = data_file.parent / SUITE_YAML
    settings = _read_yaml(config_file) if config_file.is_file() else {}
    prompts, columns, lines = _read_jsonl(data_file)
    return Suite(
        name=settings.pop("name", default_name),
        source=given,
        data_file=data_file,
        prompts=prompts,
        columns=columns,
        lines=lines,
        config_file=config_file if config_file.is_file() else None,
        scorer_dir=data_file.parent,
        **settings,
    )


def _read_jsonl(file: Path) -> tuple[tuple[str, ...], dict[str, tuple[Any, ...]], tuple[int, ...]]:
    raw = read_bytes(file)  # a FIFO, device or folder is refused before it is opened for reading
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    for number, line_bytes in enumerate(raw.split(b"\n"), start=1):
        try:
            line = line_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{file}, line {number}: not UTF-8 text") from None
        if number == 1:
            line = line.removeprefix("\ufeff")
        if not line.strip():
            continue
        row = parse_json(line, f"{file}, line {number}")  # one parse per line: repeated keys, deep nesting refused
        if not isinstance(row, dict):
            raise InputError(
                f"{file}, line {number}: expected a JSON object like "
                f'{{"prompt": ..., "answer": ...}}, found {type(row).__name__}'
            )
        prompt = row.get("prompt")
        if not isinstance(prompt, str):
            what = 'no "prompt"' if prompt is None else f'a "prompt" that is {type(prompt).__name__}, not text'
            raise InputError(f'{file}, line {number}: {what}; every row needs a "prompt" string')
        if not prompt.strip():
            raise InputError(f"{file}, line {number}: the prompt is empty")
        rows.append(row)
        lines.append(number)
    if not rows:
        raise InputError(
            f'{file}: no examples; a suite has one JSON object per line, e.g. {{"prompt": "2+3=", "answer": "5"}}'
        )
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(k for k in row if k != "prompt"))
    columns = {name: tuple(row.get(name) for row in rows) for name in names}
    return tuple(row["prompt"] for row in rows), columns, tuple(lines)


def _read_yaml(file: Path) -> dict[str, Any]:
    """The settings of a suite.yaml, checked; keys as ``Suite`` fields."""
    text = read_text(file)
    data = parse_yaml(text, str(file))  # aliases refused: a "billion laughs" costs nothing
    node = yaml.compose(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{file}: expected keys such as name: and scorer:, found {type(data).__name__}")
    pairs = node.value if isinstance(node, yaml.MappingNode) else []
    key_lines = {str(k.value): k.start_mark.line + 1 for k, _ in pairs}
    written = {str(k.value): v.value for k, v in pairs if isinstance(v, yaml.ScalarNode)}  # as typed: name: 2024

    def bad(key: str, what: str) -> InputError:
        return InputError(f"{file}, line {key_lines.get(key, '?')}: {key}: {what}")

    settings: dict[str, Any] = {}
    for key, value in data.items():
        key = str(key)
        if key not in YAML_KEYS:
            raise bad(key, f"unknown key; a suite.yaml takes {', '.join(YAML_KEYS)}")
        if key == "name" and value is not None and not isinstance(value, (str, list, dict)):
            value = written.get(key, str(value))
        if key in ("name", "scorer") and (not isinstance(value, str) or not value.strip()):
            raise bad(key, f"expected text, found {value!r}")
        if key == "name":
            settings["name"] = value.strip()
        elif key == "scorer":
            try:
                parse_scorer(value, file.parent)
            except InputError as e:
                raise bad(key, str(e)) from None
            settings["scorer"] = value.strip()
        elif key == "max_new_tokens":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(key, f"expected a whole number of at least 1, found {value!r}")
            settings["max_new_tokens"] = value
        elif key == "chat_template":
            text = ("true" if value else "false") if isinstance(value, bool) else value
            if not isinstance(text, str) or text.strip().lower() not in ("auto", "true", "false"):
                raise bad(key, f"expected auto, true or false, found {value!r}")
            settings["chat_template"] = text.strip().lower()
        elif key == "scorer_timeout":
            try:
                settings["scorer_timeout"] = check_timeout(value, "a python scorer's time limit per batch")
            except InputError as e:
                raise bad(key, str(e)) from None
        elif key == "system":
            if value is not None and not isinstance(value, str):
                raise bad(key, f"expected text, found {value!r}")
            settings["system"] = value or None
    return settings
