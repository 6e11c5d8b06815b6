"""Check Hub sources before downloading them, then download several at once.

``precheck`` reads every Hub source's safetensors headers remotely (huggingface_hub
``get_safetensors_metadata``: a few kilobytes per shard, no weights) and its ``config.json``, builds
the merge plan from them exactly as for local files (names, shapes, dtypes, vocabulary rows, tied
embeddings: ``plan.make_plan``), and checks free disk for the downloads (files not yet in the cache)
and for the output. A mismatch between two remote repositories is therefore reported before a single
weight file is requested, instead of after the downloads.

``download_all`` then fetches the sources that need it concurrently (one thread per repository, at
most ``MAX_PARALLEL``) with one combined ``download`` progress (bytes of all repositories together);
cancelling stops every transfer at its next progress update. The huggingface_hub cache keeps finished
files and partial ``.incomplete`` ones, so a later run resumes.

Every call goes through ``huggingface_hub.get_safetensors_metadata`` and ``core.ecosystem.hub.source`` (tests replace
the huggingface_hub attributes).
"""

from __future__ import annotations

import logging
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub as hf

from ...engine.plan import MergePlan, make_plan
from ...errors import Cancelled, HubUnreachable, InputError
from ...events import CancelToken, ProgressEvent, Reporter
from ...sources import HUB_ID
from ...storage.formats import Checkpoint, TensorInfo
from ...storage.formats.base import DTYPE_TABLE
from . import source as hub

log = logging.getLogger("ram_desktop")

MAX_PARALLEL = 4


@dataclass
class RemoteSource:
    """A Hub source known from its listing and headers only."""

    spec: str
    repo_id: str
    sha: str
    checkpoint: Checkpoint  # tensors from the remote headers; files are repository paths, not local files
    download_bytes: int  # needed files not in the cache yet


def is_hub_source(spec: str) -> bool:
    """A Hub id that is not an existing local path (the same rule as ``sources.open_checkpoint``)."""
    text = str(spec).strip()
    if not text:
        return False
    if not text.startswith("hf://") and Path(text).expanduser().exists():
        return False
    return bool(HUB_ID.match(text)) and not text.startswith(("/", ".", "~"))


def remote_source(spec: str, token: str | None = None) -> RemoteSource | None:
    """Listing + safetensors headers + config of one Hub source; None when it has no safetensors weights
    (pickle checkpoints cannot be read remotely: they are checked after their download)."""
    repo_id, revision = hub.parse_spec(spec)
    listing = hub.list_repo_files(repo_id, revision, token)
    if "adapter_config.json" in listing.sizes:
        log.info("%s: a LoRA adapter is checked against its base after downloading (it is small)", repo_id)
        return None
    if listing.weights_format != "safetensors":
        log.info("%s: %s weights cannot be checked before downloading", repo_id, listing.weights_format)
        return None
    try:
        meta = hf.get_safetensors_metadata(repo_id, revision=listing.sha, token=token)
        config = _remote_config(repo_id, listing, token)
    except (Cancelled, InputError):
        raise
    except Exception as e:
        mapped = hub.hub_error(e, repo_id, revision)
        if mapped is None:
            raise
        raise mapped from None
    tensors: dict[str, TensorInfo] = {}
    for filename, file_meta in meta.files_metadata.items():
        for name, info in file_meta.tensors.items():
            if info.dtype not in DTYPE_TABLE:
                raise InputError(f"{repo_id}@{listing.sha}: tensor {name!r} in {filename} has dtype {info.dtype}, "
                                 "which RAM Desktop cannot read")
            tensors[name] = TensorInfo(name, info.dtype, tuple(int(d) for d in info.shape), Path(filename))
    files = sorted(meta.files_metadata)
    cache = hub.cache_dir()
    missing = [f for f in [*listing.needed, *files] if not isinstance(
        hf.try_to_load_from_cache(repo_id, f, cache_dir=str(cache), revision=listing.sha), str)]
    download = sum(listing.sizes.get(f) or 0 for f in dict.fromkeys(missing))
    ckpt = Checkpoint(spec, Path(f"{repo_id}@{listing.sha}"), [Path(f) for f in files], tensors, config,
                      revision=listing.sha, repo_id=repo_id, metadata=dict(meta.metadata or {}))
    return RemoteSource(spec, repo_id, listing.sha, ckpt, download)


def _remote_config(repo_id: str, listing: hub.RepoFiles, token: str | None) -> dict | None:
    """``config.json`` (tied embeddings, vocabulary size): a small file, fetched into the cache as usual."""
    if "config.json" not in listing.sizes:
        return None
    cache = str(hub.cache_dir())
    path = hf.try_to_load_from_cache(repo_id, "config.json", cache_dir=cache, revision=listing.sha)
    if not isinstance(path, str):
        path = hf.hf_hub_download(repo_id, "config.json", revision=listing.sha, cache_dir=cache, token=token)
    from ...storage.safe_read import read_json  # here, not at the top: the module's imports are edited elsewhere

    value = read_json(path)  # a cached file that is not a regular file, valid UTF-8 JSON, ...: refused by name
    return value if isinstance(value, dict) else None


def precheck(base: str, agents: list[str], token: str | None = None, names: list[str] | None = None,
             out_dtype: str = "base", vocab: str = "exact", out: Path | None = None,
             local: dict[str, Checkpoint] | None = None) -> MergePlan | None:
    """Plan the merge from remote headers (local sources opened as usual) and check free disk; None when no
    source needs the Hub (or the check cannot run: offline, pickle weights). ``InputError`` as ``make_plan``."""
    specs = [base, *agents]
    remote_specs = [s for s in specs if is_hub_source(s)]
    if not remote_specs or hub.is_offline():
        return None
    from ...sources import open_checkpoint

    opened: dict[str, Checkpoint] = dict(local or {})
    remotes: list[RemoteSource] = []
    for spec in dict.fromkeys(specs):
        if spec in opened:
            continue
        cached = _cached_commit(spec) if is_hub_source(spec) else None
        if cached is not None:
            opened[spec] = cached
        elif is_hub_source(spec):
            remote = remote_source(spec, token)
            if remote is None:
                return None
            remotes.append(remote)
            opened[spec] = remote.checkpoint
        else:
            opened[spec] = open_checkpoint(spec)
    if not remotes:
        return None
    plan = make_plan(opened[base], [opened[a] for a in agents], names, out_dtype, vocab)
    check_disk([r.download_bytes for r in remotes], hub.cache_dir(), plan.out_bytes, out)
    log.info("checked %d Hub source(s) from their headers: %s to download", len(remotes),
             hub._mb(sum(r.download_bytes for r in remotes)))
    return plan


def _cached_commit(spec: str) -> Checkpoint | None:
    """A source pinned to a full commit sha whose weights are all in the cache: opened from there, no Hub call."""
    repo_id, revision = hub.parse_spec(spec)
    if not revision or not hub.COMMIT.match(revision):
        return None
    cached = hub.cached_snapshot(repo_id, revision)
    if cached is None or not hub._complete(cached[0]):
        return None
    ckpt = hub.open_local(cached[0], spec)
    ckpt.repo_id, ckpt.revision = repo_id, cached[1]
    return ckpt


def prepare_sources(base: str, agents: list[str], reporter: Reporter, token: str | None = None,
                    names: list[str] | None = None, out_dtype: str = "base", vocab: str = "exact",
                    out: Path | None = None) -> None:
    """Before a probe or merge opens its sources: check Hub sources from their headers, then download them
    concurrently. When the Hub cannot be reached, the sources open as before (a cached snapshot is used
    with a warning, or the usual error comes)."""
    try:
        plan = precheck(base, agents, token, names, out_dtype, vocab, out)
    except HubUnreachable:
        return  # opening the sources says it (or falls back to a cached snapshot with a warning)
    if plan is not None:
        download_all([base, *agents], reporter, token)


def _existing(path: Path) -> Path:
    path = Path(path).expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(downloads: list[int], cache: Path, out_bytes: int, out: Path | None) -> None:
    """Enough free space for the downloads (in the cache) and the output (where it goes), counted together
    when both are on one file system."""
    needs: dict[int, tuple[Path, int, list[str]]] = {}

    def need(where: Path, amount: int, what: str) -> None:
        place = _existing(where)
        dev = place.stat().st_dev
        path, total, whats = needs.get(dev, (place, 0, []))
        needs[dev] = (path, total + amount, [*whats, what])

    if sum(downloads):
        need(cache, sum(downloads), f"{hub._mb(sum(downloads))} of downloads into {cache}")
    if out is not None:
        need(Path(out), out_bytes, f"{hub._mb(out_bytes)} of output in {out}")
    for path, total, whats in needs.values():
        free = shutil.disk_usage(path).free
        if total > free:
            raise InputError(f"not enough free disk space on {path}: {' and '.join(whats)} need {hub._mb(total)}, "
                             f"{hub._mb(free)} free; free some space or choose another output folder / HF_HUB_CACHE")


class _Combined:
    """Adds the ``download`` progress of several repositories into one event stream (thread-safe)."""

    def __init__(self, outer: Reporter, inner: CancelToken) -> None:
        self.outer, self.inner = outer, inner
        self.lock = threading.Lock()
        self.done: dict[str, int] = {}
        self.total: dict[str, int] = {}

    def reporter(self, repo_id: str) -> Reporter:
        def on_progress(event: ProgressEvent) -> None:
            if event.stage != "download":
                return
            with self.lock:
                self.done[repo_id] = event.done
                self.total[repo_id] = max(event.total, self.total.get(repo_id, 0))
                done, total = sum(self.done.values()), sum(self.total.values())
                try:
                    self.outer.progress("download", done, max(total, done), "B", event.detail)
                except Cancelled:
                    self.inner.cancel()
                    raise

        return Reporter(on_progress, self.inner)


def download_all(specs: list[str], reporter: Reporter, token: str | None = None,
                 max_parallel: int = MAX_PARALLEL) -> dict[str, tuple[Path, str]]:
    """Resolve (download into the cache) every Hub source in ``specs`` concurrently; spec → (snapshot, sha).

    The first failure or a cancel stops the other transfers; the error (or ``Cancelled``) is raised."""
    todo = list(dict.fromkeys(s for s in specs if is_hub_source(s)))
    if not todo:
        return {}
    inner = CancelToken()
    combined = _Combined(reporter, inner)
    results: dict[str, tuple[Path, str]] = {}
    errors: list[BaseException] = []

    def fetch(spec: str) -> None:
        repo_id, revision = hub.parse_spec(spec)
        try:
            if reporter.cancel.cancelled:
                inner.cancel()
            inner.raise_if_cancelled()
            results[spec] = hub.resolve(repo_id, revision, combined.reporter(repo_id), token)
        except BaseException as e:  # noqa: BLE001 — handed to the caller after every thread stopped
            inner.cancel()
            errors.append(e)

    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(todo))), thread_name_prefix="hub-download") as pool:
        list(pool.map(fetch, todo))
    if errors:
        first = next((e for e in errors if not isinstance(e, Cancelled)), errors[0])
        if reporter.cancel.cancelled or isinstance(first, Cancelled):
            raise Cancelled("cancelled by the user")
        raise first
    return results
