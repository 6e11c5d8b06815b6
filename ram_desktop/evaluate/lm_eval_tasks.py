"""Standard benchmarks through lm-eval (EleutherAI's lm-evaluation-harness) as suites: ``lm-eval:TASK``.

A task is scored by lm-eval itself (``lm_eval.simple_evaluate`` with its ``hf`` model on the model folder), so
its score is the task's main metric exactly as ``lm_eval --model hf --tasks TASK`` reports it: the first metric
of the task's ``metric_list`` under its first filter (``acc,none`` for most multiple-choice tasks). The
per-example values come from lm-eval's logged samples, in document order; where the task aggregates by the mean
(most tasks) their mean is the score and the intervals of ``ram-eval/2`` apply to them. ``include_path``:
folders of task YAMLs of one's own (lm-eval's own flag name). lm-eval is an optional extra (``[lm-eval]``);
without it an ``lm-eval:`` suite is refused in one line. Tasks whose data lives on the Hugging Face Hub need it
(or its cache); a task YAML over a local JSONL (``dataset_path: json``) needs nothing else. With ``--backend vllm``
the task runs on lm-eval's own ``vllm`` model instead (``lm_eval --model vllm``).
"""

from __future__ import annotations

import difflib
import importlib.util
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import InputError

PREFIX = "lm-eval:"


def is_lm_eval(spec: str | Path) -> bool:
    """Whether a ``--suite`` value names an lm-eval task."""
    return isinstance(spec, str) and spec.startswith(PREFIX)


@dataclass(frozen=True, eq=False)
class LmEvalTask:
    """An lm-eval task used as a suite: its name, where its YAMLs were looked up, and its main metric."""

    task: str
    include_path: tuple[Path, ...] = ()
    metric: str = ""  # the main metric's key in lm-eval's results, e.g. "acc,none"; known once scored
    examples: int = 0  # known once scored

    @property
    def name(self) -> str:
        return self.task

    @property
    def source(self) -> str:
        return PREFIX + self.task

    @property
    def scorer(self) -> str:
        return f"lm-eval {self.metric}" if self.metric else "lm-eval"


@dataclass
class LmEvalScore:
    """One model on one task, as lm-eval scored it."""

    task: str
    metric: str
    score: float
    per_example: list[float]
    responses: list[str] = field(default_factory=list)


def require_lm_eval() -> None:
    if importlib.util.find_spec("lm_eval") is None:
        raise InputError(
            "lm-eval suites need lm-eval (pip install 'ram-desktop[lm-eval]', which brings lm-eval 0.4.13 with its "
            "hf extra)"
        )


def _task_manager(include_path: tuple[Path, ...]) -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=[str(p) for p in include_path] or None)


def open_task(spec: str, include_path: list[Path] | tuple[Path, ...] = ()) -> LmEvalTask:
    """The task ``lm-eval:TASK`` names, checked against lm-eval's registry and ``include_path`` (no data read).

    Raises ``InputError`` for an unknown task (naming the closest known ones) or a missing include folder."""
    require_lm_eval()
    task = spec[len(PREFIX) :].strip() if is_lm_eval(spec) else spec.strip()
    if not task:
        raise InputError(f"{spec!r}: name an lm-eval task after {PREFIX}, e.g. {PREFIX}arc_easy")
    folders = tuple(Path(p).expanduser().resolve() for p in include_path)
    for folder in folders:
        if not folder.is_dir():
            raise InputError(f"--include-path {folder}: no such folder of task YAMLs")
    known = _task_manager(folders).all_tasks
    if task not in known:
        close = difflib.get_close_matches(task, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f" ({len(known)} tasks known to lm-eval here)"
        raise InputError(f"unknown lm-eval task {task!r}{hint}")
    return LmEvalTask(task, folders)


def _main_metric(results: dict, config: dict, task: str) -> tuple[str, str]:
    """(metric, filter) of the task's main metric: the first of its metric_list, under its first filter."""
    metrics = config.get("metric_list") or []
    names = [m["metric"] for m in metrics if isinstance(m, dict) and isinstance(m.get("metric"), str)]
    keys = [k for k in results[task] if "," in k and not k.split(",", 1)[0].endswith("_stderr")]
    for name in names:
        for key in keys:
            if key.split(",", 1)[0] == name:
                return name, key.split(",", 1)[1]
    if not keys:
        raise InputError(f"lm-eval task {task!r} reported no metric")
    metric, filter_name = keys[0].split(",", 1)
    return metric, filter_name


def score_model(
    model_folder: Path,
    tasks: list[LmEvalTask],
    device: str = "cpu",
    batch_size: int = 8,
    limit: int | None = None,
    dtype: str = "auto",
    backend: str = "transformers",
) -> list[LmEvalScore]:
    """Score one model folder on lm-eval tasks with lm-eval's ``hf`` model (greedy, as lm-eval runs it), or with
    its ``vllm`` model for ``backend="vllm"`` (as ``lm_eval --model vllm`` runs it; the caller checked vLLM and the
    GPU first)."""
    require_lm_eval()
    if not tasks:
        return []
    from lm_eval import simple_evaluate

    include = tuple(dict.fromkeys(p for t in tasks for p in t.include_path))
    os.environ.setdefault("HF_DATASETS_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "0"))
    try:
        out = simple_evaluate(
            model="vllm" if backend == "vllm" else "hf",
            model_args={"pretrained": str(model_folder), "dtype": dtype},
            tasks=[t.task for t in tasks],
            task_manager=_task_manager(include),
            device=device,
            batch_size=batch_size,
            limit=limit,
            log_samples=True,
        )
    except (ValueError, OSError, KeyError, RuntimeError) as e:
        raise InputError(f"lm-eval could not score {model_folder} on {', '.join(t.task for t in tasks)}: {e}") from None
    if out is None:
        raise InputError("lm-eval returned no results")
    scores = []
    for t in tasks:
        metric, filter_name = _main_metric(out["results"], out["configs"].get(t.task, {}), t.task)
        samples = sorted(
            (s for s in out["samples"].get(t.task, []) if s.get("filter", filter_name) == filter_name),
            key=lambda s: s["doc_id"],
        )
        value = float(out["results"][t.task][f"{metric},{filter_name}"])
        per_example = [float(s[metric]) for s in samples if metric in s]
        scores.append(
            LmEvalScore(
                t.task,
                f"{metric},{filter_name}",
                value,
                per_example if per_example and all(math.isfinite(v) for v in per_example) else [],
                [_response(s) for s in samples],
            )
        )
    return scores


def _response(sample: dict) -> str:
    """What the model answered: its generated text, or the index of the choice with the highest likelihood."""
    filtered = sample.get("filtered_resps")
    if isinstance(filtered, list) and filtered and isinstance(filtered[0], str):
        return filtered[0]
    if isinstance(filtered, list) and filtered and all(isinstance(r, (list, tuple)) and r for r in filtered):
        best = max(range(len(filtered)), key=lambda i: filtered[i][0])
        return f"choice {best}"
    return str(filtered)
