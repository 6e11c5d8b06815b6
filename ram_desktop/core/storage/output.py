"""The output folder: checks before starting, shards written in a temporary sibling, atomic rename."""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path
from typing import Protocol

import numpy as np

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

from ..errors import InputError
from ..events import human_bytes
from ..lazy import torch
from .formats import Checkpoint
from .formats.base import INDEX_FILE, torch_dtype
from .formats.safetensors_format import SafetensorsStreamWriter, stored_bytes
from .manifest import TOKENIZER_FILES, foreign_entries, write_manifest

log = logging.getLogger("ram_desktop")

DISK_MARGIN = 64 * 2**20


def input_paths(ckpt: Checkpoint) -> list[Path]:
    """What an input occupies on disk: its folder, or its file plus any shards."""
    return [ckpt.path.resolve(), *[f.resolve() for f in ckpt.files]]


def check_apart(out: Path, inputs: list[Checkpoint]) -> Path:
    """``out`` resolved; refused when it is, lies inside or contains an input."""
    out = Path(out).expanduser().resolve()
    for ckpt in inputs:
        for inp in input_paths(ckpt):
            if out == inp or inp in out.parents:
                raise InputError(f"output folder {out} is inside the input {inp}; choose a folder outside the inputs")
            if out in inp.parents:
                raise InputError(f"output folder {out} contains the input {inp}; choose a folder that holds no input")
    return out


def check_output(out: Path, inputs: list[Checkpoint], overwrite: bool, needed_bytes: int) -> Path:
    """Refuse an output that would touch an input, overwrite without permission, or not fit on disk."""
    out = check_apart(out, inputs)
    check_replaceable(out, overwrite)
    anchor = out.parent
    while not anchor.exists():
        anchor = anchor.parent
    free = shutil.disk_usage(anchor).free
    if free < needed_bytes + DISK_MARGIN:
        raise InputError(
            f"not enough free disk at {anchor}: the merge needs {human_bytes(needed_bytes + DISK_MARGIN)} "
            f"(output and a safety margin), {human_bytes(free)} are free; free space or choose another "
            "output folder"
        )
    return out


class OutputTensor(Protocol):
    """One tensor of the output as the writer sees it (the engine's ``TensorJob`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def out_name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def out_bytes(self) -> int: ...


class OutputPlan(Protocol):
    """The output's tensors in plan order (the engine's ``MergePlan`` is one); storage needs no more."""

    @property
    def jobs(self) -> Sequence[OutputTensor]: ...
    @property
    def mergeable_jobs(self) -> Sequence[OutputTensor]: ...
    @property
    def out_bytes(self) -> int: ...


def shard_layout(plan: OutputPlan, shard_bytes: int) -> list[list[int]]:
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


def _named(error: OSError, path: Path) -> OSError:
    """``error`` with ``path`` as its file name where it names none: a failed ``write()`` (disk full, I/O
    error) carries no path, and the one error line must say which file could not be written."""
    if error.filename is not None:
        return error
    return error.__class__(error.errno, error.strerror or str(error), str(path))


class ShardSet:
    """Streams merged slices into the shards; one open file at a time, in plan order."""

    def __init__(self, folder: Path, plan: OutputPlan, shard_bytes: int) -> None:
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
        try:
            if shard != self._current:
                self._open(shard)
            assert self._writer is not None
            self._writer.write(data)
        except OSError as e:
            raise _named(e, self.folder / self.names[shard]) from None
        self.bytes_written += data.nbytes if isinstance(data, np.ndarray) else data.numel() * data.element_size()

    def _open(self, shard: int) -> None:
        if self._writer is not None:
            self._writer.close()
        entries = [
            (self.plan.jobs[j].name, self.plan.jobs[j].out_name, self.plan.jobs[j].shape) for j in self.layout[shard]
        ]
        self._writer = SafetensorsStreamWriter(self.folder / self.names[shard], entries, {"format": "pt"})
        self._current = shard

    def close(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError as e:
                raise _named(e, self.folder / self.names[self._current]) from None
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


class MemoryShards:
    """The in-memory sink beside ``ShardSet``: the merged tensors kept in this process, each holding the bytes its
    written shard would hold (the same ``stored_bytes`` of every slice, in the same order), for a merge that is
    scored and dropped without being written (search trials). Same ``write`` / ``close`` / ``abort`` as
    ``ShardSet``; ``tensors()`` hands them out in the output dtype once closed."""

    def __init__(self, plan: OutputPlan) -> None:
        self.plan = plan
        self._buffers: dict[int, np.ndarray] = {}
        self._filled: dict[int, int] = {}
        self.bytes_written = 0  # bytes kept (the name ``ShardSet`` uses)
        self._closed = False

    def write(self, job_index: int, data: torch.Tensor | np.ndarray) -> None:
        """Append the next slice of job ``job_index``: a CPU tensor or a numpy array of its stored bits."""
        raw = stored_bytes(data)
        buf = self._buffers.get(job_index)
        if buf is None:
            buf = self._buffers[job_index] = np.empty(self.plan.jobs[job_index].out_bytes, dtype=np.uint8)
            self._filled[job_index] = 0
        start = self._filled[job_index]
        buf[start : start + raw.nbytes] = raw
        self._filled[job_index] = start + raw.nbytes
        self.bytes_written += raw.nbytes

    def close(self) -> None:
        for index, job in enumerate(self.plan.jobs):
            if self._filled.get(index, 0) != job.out_bytes:
                raise RuntimeError(
                    f"in-memory merge: tensor {job.name} got {self._filled.get(index, 0)} of {job.out_bytes} bytes"
                )
        self._closed = True

    def abort(self) -> None:
        self._buffers.clear()
        self._filled.clear()

    @property
    def files(self) -> list[str]:
        return []  # nothing is written

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every output tensor by name, in the output dtype and shape, sharing the kept bytes (no copy)."""
        assert self._closed, "tensors() after close()"
        out: dict[str, torch.Tensor] = {}
        for index, job in enumerate(self.plan.jobs):
            dtype = torch_dtype(job.out_name)
            buf = self._buffers.get(index)
            if buf is None or buf.nbytes == 0:
                out[job.name] = torch.empty(job.shape, dtype=dtype)
            else:
                out[job.name] = torch.frombuffer(buf, dtype=dtype).reshape(job.shape)
        return out


OWNER_FILE = ".ram-desktop-owner"  # JSON {"pid", "started", "host"}: the marker of staging folders of earlier versions
STAGING = ".partial-"
OLD = ".old-"
LOCK_SUFFIX = ".ram-desktop-lock"


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


def _alive(pid: int, started: str, host: str) -> bool:
    if host != _host():
        return True  # another machine's run on a shared disk: its process cannot be seen from here
    now = _process_start(pid)
    return now is not None and (now == started or not now or not started or started == "0")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _owner_tag() -> str:
    """``<pid>-<start>-<random>-<host>``: the owner of a staging or old folder, in its name from the first byte."""
    pid = os.getpid()
    return f"{pid}-{_process_start(pid) or 0}-{uuid.uuid4().hex[:8]}-{_host()}"


def _owner_alive(folder: Path) -> bool:
    """Whether the run that made ``folder`` (``<out>.partial-<tag>`` or ``<out>.old-<tag>``) may still be running.
    Folders of earlier versions carry the owner in ``OWNER_FILE``; what cannot be judged counts as alive."""
    tag = folder.name.split(STAGING, 1)[1] if STAGING in folder.name else folder.name.split(OLD, 1)[-1]
    parts = tag.split("-", 3)
    if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit():
        return _alive(int(parts[0]), parts[1], parts[3])
    try:
        owner = json.loads((folder / OWNER_FILE).read_text())
        return _alive(int(owner["pid"]), str(owner["started"]), re.sub(r"[^A-Za-z0-9.]", "_", str(owner["host"])))
    except (OSError, ValueError, KeyError, TypeError):
        return True  # no marker or unreadable: never remove what we cannot judge


def remove_orphaned_staging(parent: Path) -> list[Path]:
    """Tidy what runs killed outright left in ``parent``: a staging folder whose owner is gone is removed; an
    ``.old-`` folder whose owner is gone is moved back to its output name when that name is free (the run
    died between its two renames) and removed otherwise. Folders of live runs, and folders without an owner
    we can read, are left alone. Returns what was removed or restored."""
    tidied: list[Path] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return tidied
    candidates = [p for p in entries if (STAGING in p.name or OLD in p.name) and p.is_dir() and not p.is_symlink()]
    for lock in (p for p in entries if p.name.startswith(".") and p.name.endswith(LOCK_SUFFIX)):
        _remove_stale_lock(lock)
    for folder in candidates:
        if _owner_alive(folder):
            continue
        if OLD in folder.name and STAGING not in folder.name:
            out = folder.with_name(folder.name.split(OLD, 1)[0])
            if not out.exists():
                os.rename(folder, out)
                log.warning("restored %s from %s, left by a run that was killed while replacing it", out, folder.name)
                tidied.append(folder)
                continue
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            log.warning("removed %s, left behind by a run that was killed (its process is gone)", folder)
            tidied.append(folder)
    return tidied


def _remove_stale_lock(path: Path) -> None:
    """A lock file whose holder died (its lock went with it): removed while we hold it; a held one is kept."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        _try_lock(fd)
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)
    except OSError:
        pass  # held by a live run, or gone meanwhile
    finally:
        os.close(fd)


def free_folder(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3`` ... : the first that does not exist or is empty."""
    candidate, k = path, 2
    while candidate.exists() and (not candidate.is_dir() or any(candidate.iterdir())):
        candidate, k = path.with_name(f"{path.name}-{k}"), k + 1
    return candidate


class NotReplaceable(InputError):
    """An existing output folder holds what RAM Desktop did not write (``lost``: what replacing it would
    lose); ``free`` is a new folder to use instead."""

    def __init__(self, out: Path, lost: list[str]) -> None:
        self.out, self.lost, self.free = out, lost, free_folder(out)
        shown = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
        super().__init__(
            f"output folder {out} holds files that RAM Desktop did not write or that changed since ({shown}); "
            f"replacing it would lose them, so it is never replaced — choose a new folder, such as "
            f"{self.free.name}"
        )


def is_staging_entry(item: Path) -> bool:
    """A run's lock file or staging / old folder beside an output (tidied by the run that made it, or the next)."""
    name = item.name
    if name.startswith(".") and name.endswith(LOCK_SUFFIX):
        return item.is_file() and not item.is_symlink()
    tag = name.split(STAGING, 1)[1] if STAGING in name else name.split(OLD, 1)[1] if OLD in name else ""
    parts = tag.split("-", 3)
    return item.is_dir() and len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit()


def check_replaceable(out: Path, overwrite: bool, hashes: bool = True) -> None:
    """An existing ``out`` may be replaced only with ``overwrite``, and only when it is empty or nothing in it
    is foreign (``manifest.foreign_entries``: every file listed in its manifest, unchanged): a folder with
    anything else is refused naming what would be lost (``NotReplaceable``), its files untouched, with or
    without ``overwrite`` (so the refusal without it offers ``--overwrite`` only where it would work)."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise InputError(f"output {out} exists and is not a folder; choose a folder name")
    if not any(out.iterdir()):
        return
    lost = foreign_entries(out, hashes=hashes)  # first: --overwrite is offered only where it would work
    if lost:
        raise NotReplaceable(out, lost)
    if not overwrite:
        raise InputError(
            f"output folder {out} holds an earlier RAM Desktop output; pass --overwrite to replace it or choose "
            "another folder"
        )


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """One writer per output folder: an exclusive ``flock`` on ``.<out>.ram-desktop-lock`` beside it (the OS
    releases it when the process dies, even by SIGKILL). A second run is refused naming the first one's pid.
    The file is removed on release; a run that locked a file which was removed meanwhile locks again."""
    lock_path = out.with_name(f".{out.name}{LOCK_SUFFIX}")
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _try_lock(fd)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise InputError(
                f"output folder {out} is being written by another RAM Desktop run (pid {holder}); wait "
                "for it to finish or choose another folder"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file as we opened it: lock the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        try:
            os.unlink(lock_path)
        except OSError:
            pass
        os.close(fd)


def _try_lock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:  # Windows
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            raise BlockingIOError from None


def _make_parents(folder: Path) -> list[Path]:
    """``mkdir -p folder``; returns the folders it created, deepest first (removed again on failure)."""
    missing = []
    p = folder
    while not p.exists():
        missing.append(p)
        p = p.parent
    for m in reversed(missing):
        m.mkdir(exist_ok=True)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for f in folders:
        try:
            f.rmdir()
        except OSError:
            break


_EXCHANGE = 2  # RENAME_EXCHANGE (linux/fs.h)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system or
    the file system has no such call (the caller then renames twice)."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP are only noted while the output is swapped in (only SIGKILL can cut the swap,
    and the next run repairs that). A cancel that arrives meanwhile comes too late: the output is complete,
    so it is kept and the cancel is logged, not raised. (Python runs signal handlers in the main thread only;
    elsewhere, as in the window's worker, there is nothing to hold.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    names = [n for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]
    previous = {n: signal.signal(getattr(signal, n), lambda signum, frame: noted.append(signum)) for n in names}
    try:
        yield
    finally:
        for n, handler in previous.items():
            signal.signal(getattr(signal, n), handler)
        if noted:
            log.warning("cancel arrived as the output was put in place; the complete output is kept")


def _swap_in(tmp: Path, out: Path) -> Path | None:
    """Put the finished ``tmp`` at ``out``: at every moment ``out`` holds the old output or the new one.
    Returns the folder that now holds the old output (to remove), if any."""
    with _signals_held():
        if not out.exists():
            os.rename(tmp, out)
            return None
        if _exchange(tmp, out):  # tmp now holds the old output, under a name the next run tidies if we die
            return tmp
        old = out.with_name(f"{out.name}{OLD}{tmp.name.split(STAGING, 1)[1]}")
        os.rename(out, old)  # a run killed right here leaves no out: the next run restores it from old
        os.rename(tmp, out)
        return old


@contextmanager
def staging_folder(out: Path, overwrite: bool = True) -> Iterator[Path]:
    """A temporary sibling ``<out>.partial-<owner>`` that replaces ``out`` only when the body completes;
    on any exception (cancel, error, Ctrl-C) it is removed, with any parent folders this run created, and
    ``out`` is left as it was. The body's files are listed in ``ram-manifest.json`` (written last, before the
    swap), which is what lets a later ``--overwrite`` tell our files from the user's.

    The whole run holds ``output_lock(out)``, and ``out`` is checked again under it (``check_replaceable``):
    two runs can never both write one output. The owner (pid, process start time, host) is in the folder's
    name from its first byte, so a later run can tell a folder left by a killed run (tidied, and logged)
    from one a live run owns (kept)."""
    created = _make_parents(out.parent)
    try:
        with output_lock(out):
            remove_orphaned_staging(out.parent)
            check_replaceable(out, overwrite, hashes=False)  # hashed in check_output moments ago
            tmp = out.with_name(f"{out.name}{STAGING}{_owner_tag()}")
            tmp.mkdir()
            try:
                yield tmp
                write_manifest(tmp)  # last: it vouches for every file the body wrote
                previous = _swap_in(tmp, out)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            if previous is not None:  # the new output is in place: a cancel now must not cut the removal short
                with _signals_held():  # (it would end the run as "cancelled; nothing was written")
                    shutil.rmtree(previous, ignore_errors=True)
    except BaseException:
        _remove_empty(created)
        raise


def write_config(base: Checkpoint, folder: Path, plan: OutputPlan, layers: list[int] | None = None) -> None:
    """The base's config.json with its dtype field set to the output dtype. ``layers`` (a layer map): per output
    layer, the input layer it is read from: the layer count becomes their number and every per-layer list of
    the config (a list as long as the base's layer count, e.g. ``layer_types``) follows the layers read."""
    if base.config is None:
        return
    config = dict(base.config)
    if layers is not None:
        config = _relayered(config, layers)
    dtypes = {j.out_name for j in plan.mergeable_jobs}
    if len(dtypes) == 1:
        name = dtypes.pop()
        for key in [k for k in ("torch_dtype", "dtype") if k in config] or ["torch_dtype"]:
            config[key] = name
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def _relayered(config: dict, layers: list[int]) -> dict:
    """``config`` (and its ``text_config``) with the output's layer count and per-layer lists."""
    config = dict(config)
    if isinstance(config.get("text_config"), dict) and not any(k in config for k in LAYER_COUNT_KEYS):
        config["text_config"] = _relayered(config["text_config"], layers)
        return config
    key = next((k for k in LAYER_COUNT_KEYS if isinstance(config.get(k), int)), None)
    if key is None:
        return config
    count = config[key]
    for name, value in list(config.items()):
        if "layer" in name and isinstance(value, list) and len(value) == count:
            config[name] = [value[j] for j in layers]
    config[key] = len(layers)
    return config


def copy_tokenizer_files(base: Checkpoint, folder: Path, patterns: Sequence[str] = TOKENIZER_FILES) -> list[str]:
    """Copy every tokenizer, generation and chat-template file of the base (those matching ``patterns``)."""
    copied = []
    for item in sorted(base.folder.iterdir()):
        if item.is_file() and any(fnmatch(item.name, pattern) for pattern in patterns):
            shutil.copyfile(item, folder / item.name)
            copied.append(item.name)
    return copied
