"""The output folder: checks before starting, shards written in a temporary sibling, atomic rename."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import uuid
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import InputError
from .formats import Checkpoint
from .formats.base import INDEX_FILE
from .formats.safetensors_format import SafetensorsStreamWriter
from .lazy import torch
from .plan import MergePlan

log = logging.getLogger("ram_desktop")

TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt",
                   "*.tiktoken", "spiece.model", "sentencepiece*.model", "generation_config.json",
                   "chat_template*", "preprocessor_config.json")
DISK_MARGIN = 64 * 2**20


def human_bytes(n: float) -> str:
    """A byte count in the unit that fits: 512 B, 3.4 KB, 12.0 MB, 1.5 GB (decimal, as disk tools show)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"


def input_paths(ckpt: Checkpoint) -> list[Path]:
    """What an input occupies on disk: its folder, or its file plus any shards."""
    return [ckpt.path.resolve(), *[f.resolve() for f in ckpt.files]]


def check_output(out: Path, inputs: list[Checkpoint], overwrite: bool, needed_bytes: int) -> Path:
    """Refuse an output that would touch an input, overwrite without permission, or not fit on disk."""
    out = Path(out).expanduser().resolve()
    for ckpt in inputs:
        for inp in input_paths(ckpt):
            if out == inp or inp in out.parents:
                raise InputError(f"output folder {out} is inside the input {inp}; choose a folder outside the inputs")
            if out in inp.parents:
                raise InputError(f"output folder {out} contains the input {inp}; choose a folder that holds no input")
    if out.exists():
        if not out.is_dir():
            raise InputError(f"output {out} exists and is a file; choose a folder name")
        if any(out.iterdir()) and not overwrite:
            raise InputError(f"output folder {out} exists and is not empty; pass --overwrite or choose another folder")
    anchor = out.parent
    while not anchor.exists():
        anchor = anchor.parent
    free = shutil.disk_usage(anchor).free
    if free < needed_bytes + DISK_MARGIN:
        raise InputError(f"not enough free disk at {anchor}: the merge needs {human_bytes(needed_bytes + DISK_MARGIN)} "
                         f"(output and a safety margin), {human_bytes(free)} are free; free space or choose another "
                         "output folder")
    return out


def shard_layout(plan: MergePlan, shard_bytes: int) -> list[list[int]]:
    """Job indices per shard, in plan order, each shard filled up to ``shard_bytes`` (a larger tensor alone)."""
    shards: list[list[int]] = [[]]
    used = 0
    for index, job in enumerate(plan.jobs):
        if shards[-1] and used + job.out_bytes > shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(index)
        used += job.out_bytes
    return shards


def shard_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


class ShardSet:
    """Streams merged slices into the shards; one open file at a time, in plan order."""

    def __init__(self, folder: Path, plan: MergePlan, shard_bytes: int) -> None:
        self.folder = folder
        self.plan = plan
        self.layout = shard_layout(plan, shard_bytes)
        self.names = shard_names(len(self.layout))
        self._shard_of = {j: s for s, jobs in enumerate(self.layout) for j in jobs}
        self._current = -1
        self._writer: SafetensorsStreamWriter | None = None
        self.bytes_written = 0

    def write(self, job_index: int, data: torch.Tensor | np.ndarray) -> None:
        """Append the next slice of job ``job_index``: a CPU tensor or a numpy array of its stored bits."""
        shard = self._shard_of[job_index]
        if shard != self._current:
            self._open(shard)
        assert self._writer is not None
        self._writer.write(data)
        self.bytes_written += data.nbytes if isinstance(data, np.ndarray) else data.numel() * data.element_size()

    def _open(self, shard: int) -> None:
        if self._writer is not None:
            self._writer.close()
        entries = [(self.plan.jobs[j].name, self.plan.jobs[j].out_name, self.plan.jobs[j].shape)
                   for j in self.layout[shard]]
        self._writer = SafetensorsStreamWriter(self.folder / self.names[shard], entries, {"format": "pt"})
        self._current = shard

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if len(self.layout) > 1:
            weight_map = {self.plan.jobs[j].name: self.names[s] for s, jobs in enumerate(self.layout) for j in jobs}
            index = {"metadata": {"total_size": self.plan.out_bytes}, "weight_map": weight_map}
            (self.folder / INDEX_FILE).write_text(json.dumps(index, indent=2))

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()
            self._writer = None

    @property
    def files(self) -> list[str]:
        return self.names + ([INDEX_FILE] if len(self.layout) > 1 else [])


OWNER_FILE = ".ram-desktop-owner"  # JSON {"pid", "started", "host"} of the run that writes the staging folder
STAGING = ".partial-"


def _process_start(pid: int) -> str | None:
    """An identity of the running process ``pid`` that a reused pid does not share (its start time in
    clock ticks since boot, from /proc), "" where the platform gives none, None when no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()  # field 22 of the full line: starttime
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:  # exists, owned by someone else
        pass
    return ""


def _owner_alive(marker: Path) -> bool:
    try:
        owner = json.loads(marker.read_text())
        pid, started, host = int(owner["pid"]), str(owner["started"]), str(owner["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return True  # unreadable: it may be being written right now; never remove what we cannot judge
    if host != socket.gethostname():
        return True  # another machine's run on a shared disk: its process cannot be seen from here
    now = _process_start(pid)
    return now is not None and (now == started or not now or not started)


def remove_orphaned_staging(parent: Path) -> list[Path]:
    """Remove the staging folders in ``parent`` whose owner process is gone (a run killed outright);
    folders without our owner marker, and those of live runs, are left alone. Returns what was removed."""
    removed = []
    try:
        candidates = [p for p in parent.iterdir() if STAGING in p.name and p.is_dir()]
    except OSError:
        return removed
    for folder in candidates:
        marker = folder / OWNER_FILE
        if marker.is_file() and not _owner_alive(marker):
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                log.warning("removed %s, left behind by a merge that was killed (its process %s is gone)", folder,
                            json.loads(marker.read_text()).get("pid") if marker.exists() else "")
                removed.append(folder)
    return removed


@contextmanager
def staging_folder(out: Path) -> Iterator[Path]:
    """A temporary sibling ``<out>.partial-XXXX`` that replaces ``out`` only when the body completes;
    on any exception (cancel, error, Ctrl-C) it is removed and ``out`` is left as it was.

    It holds an owner marker (pid, process start time, host), so that a later run writing beside it
    can tell a folder left by a killed run (removed, and logged) from one a live run owns (kept)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_orphaned_staging(out.parent)
    tmp = out.with_name(f"{out.name}{STAGING}{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    pid = os.getpid()
    (tmp / OWNER_FILE).write_text(json.dumps({"pid": pid, "started": _process_start(pid) or "",
                                              "host": socket.gethostname()}))
    try:
        yield tmp
        (tmp / OWNER_FILE).unlink()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.with_name(f"{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_config(base: Checkpoint, folder: Path, plan: MergePlan) -> None:
    """The base's config.json with its dtype field set to the output dtype."""
    if base.config is None:
        return
    config = dict(base.config)
    dtypes = {j.out_name for j in plan.mergeable_jobs}
    if len(dtypes) == 1:
        name = dtypes.pop()
        for key in [k for k in ("torch_dtype", "dtype") if k in config] or ["torch_dtype"]:
            config[key] = name
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def copy_tokenizer_files(base: Checkpoint, folder: Path) -> list[str]:
    """Copy every tokenizer, generation and chat-template file of the base."""
    copied = []
    for item in sorted(base.folder.iterdir()):
        if item.is_file() and any(fnmatch(item.name, pattern) for pattern in TOKENIZER_FILES):
            shutil.copyfile(item, folder / item.name)
            copied.append(item.name)
    return copied
