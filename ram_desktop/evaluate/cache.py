"""Scores already computed, reused instead of generated again: a model's completions and rewards on a
suite, keyed by everything they depend on (docs/evaluate.md, Reusing scores).

The key of (model, suite) is a SHA-256 over

- the model folder's fingerprint: every file under it (path, size, modification time; a Hub model's
  snapshot folder likewise) except the two an evaluation itself writes into a merged model's folder
  (``eval.json`` and the model card ``README.md``), so a model merged again into the same folder is
  scored again, and one that was only scored is not;
- the suite's content: its examples as loaded (the first N with ``--limit``), its
  ``max_new_tokens``, ``chat_template`` and ``system`` prompt;
- the scorer: its spec text and, for a python scorer, its file's bytes;
- the settings that can change a completion: the device, the batch size and the backend (vLLM's kernels are
  not transformers').

The window keeps one cache for its Evaluate and Compare steps, so a compare does not score the base
and the agents again; nothing is written to disk.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .suites import Suite


@dataclass(frozen=True)
class CachedScores:
    """One model's completions and rewards on one suite, in suite order."""

    completions: tuple[str, ...]
    rewards: tuple[float, ...]


class ScoreCache:
    """In-memory (model, suite, scorer, settings) -> ``CachedScores``; ``hits`` counts the reuses."""

    def __init__(self) -> None:
        self._entries: dict[str, CachedScores] = {}
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> CachedScores | None:
        found = self._entries.get(key)
        if found is not None:
            self.hits += 1
        return found

    def put(self, key: str, completions: list[str], rewards: list[float]) -> None:
        self._entries[key] = CachedScores(tuple(completions), tuple(rewards))

    def clear(self) -> None:
        self._entries.clear()


WRITTEN_BY_EVALUATION = ("eval.json", "README.md")  # at the top of a merged model's folder


def folder_fingerprint(folder: Path) -> str:
    """A digest of every file under ``folder``: relative path, size and modification time (links followed);
    ``WRITTEN_BY_EVALUATION`` at its top left out."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            if Path(root) == folder and name in WRITTEN_BY_EVALUATION:
                continue
            path = Path(root) / name
            try:
                stat = path.stat()
            except OSError:  # a dangling link: part of the folder as it is
                digest.update(f"{path.relative_to(folder)}\0missing\n".encode())
                continue
            digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def suite_fingerprint(suite: Suite) -> str:
    """A digest of what a suite's scores depend on: its examples, generation settings and scorer."""
    spec = suite.scorer_spec
    settings = {
        "prompts": suite.prompts,
        "columns": suite.columns,
        "max_new_tokens": suite.max_new_tokens,
        "chat_template": suite.chat_template,
        "system": suite.system,
        "scorer": suite.scorer,
        "scorer_dir": str(suite.scorer_dir),
    }
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, ensure_ascii=False).encode())
    if spec.file is not None:
        digest.update(spec.file.read_bytes())
    return digest.hexdigest()


def score_key(
    model_fingerprint: str, suite_key: str, device: str, batch_size: int, backend: str = "transformers"
) -> str:
    """The cache key of one model on one suite with these settings (the backend only where it is not the
    default, so that transformers' keys stay as they were)."""
    engine = "" if backend == "transformers" else f"\0{backend}"
    return hashlib.sha256(f"{model_fingerprint}\0{suite_key}\0{device}\0{batch_size}{engine}".encode()).hexdigest()
