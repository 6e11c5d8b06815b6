"""Hugging Face Hub sources: ``org/name``, ``org/name@revision``, ``hf://org/name@revision``.

A Hub source becomes a snapshot folder in the standard huggingface_hub cache
(``$HF_HUB_CACHE``, default ``$HF_HOME/hub`` = ``~/.cache/huggingface/hub``), and then opens like any
local folder. Only what a merge needs is downloaded: the weights (safetensors preferred — the index
and the shards it names, or ``model.safetensors`` — else ``pytorch_model.bin`` / its index and
shards) plus ``config.json``, generation, tokenizer and chat-template files at the repository root.
Files already in the cache are reused; nothing else of the repository is fetched.

- The resolved commit sha becomes ``Checkpoint.revision`` (with ``Checkpoint.repo_id``); recipes,
  reports and model cards name ``repo@sha``.
- ``HF_HUB_OFFLINE=1``: no network at all; a source resolves only from the cache (``refs/<branch>``
  or ``snapshots/<sha>``). A full commit sha that is already cached with its weights is used without
  asking the Hub even when online. When the Hub cannot be reached, a cached snapshot of the same
  revision is used with a warning.
- Tokens: an explicit ``token`` (e.g. from the GUI's token field) wins; otherwise huggingface_hub uses
  ``HF_TOKEN`` or the token stored by ``hf auth login``. A token is only ever handed to
  huggingface_hub: it is never logged, put in an error message, or stored in a ``Checkpoint``.
- Download progress: ``Reporter.progress("download", done_bytes, total_bytes, "B", detail)`` where
  ``detail`` names the file and its own progress; cancelling raises ``Cancelled`` from the next
  progress update (the cache keeps completed blobs and may keep a resumable ``.incomplete`` file).
- Errors become one ``HubError`` (an ``InputError``, see ``core.errors``) naming the repository, one class
  per kind: not found, gated, revision not found, offline and not cached, network failure, authentication
  failure. ``hub_error`` is the one place that maps huggingface_hub's exception classes to them; callers
  branch on the class, never on the message.

Every call into huggingface_hub goes through the module attributes ``huggingface_hub.model_info``,
``huggingface_hub.hf_hub_download`` and ``huggingface_hub.try_to_load_from_cache`` (tests replace them).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING

import huggingface_hub as hf
from huggingface_hub import constants as hf_constants, errors as hf_errors
from huggingface_hub.file_download import repo_folder_name

from ...errors import (
    Cancelled,
    GatedRepo,
    HubAuthError,
    HubError,
    HubFileMissing,
    HubHTTPError,
    HubOffline,
    HubUnreachable,
    InputError,
    RepoDisabled,
    RepoNotFound,
    RevisionNotFound,
)
from ...events import Reporter
from ...storage.formats import registry
from ...storage.formats.base import (
    Checkpoint,
    contained,
    read_index,
)
from ...storage.formats.local import open_local
from ...storage.manifest import TOKENIZER_FILES
from ...storage.safe_read import read_text

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger("ram_desktop")

# what a Hub source downloads besides the weights: the config, what the output folder copies from the base
# (storage.manifest.TOKENIZER_FILES: tokenizer, chat template, generation config …) and a LoRA adapter's config
EXTRA_FILES = ("config.json", *TOKENIZER_FILES, "adapter_config.json")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DEFAULT_REVISION = "main"


def parse_spec(text: str) -> tuple[str, str | None]:
    """``"hf://org/name@rev"`` → ``("org/name", "rev")``; the revision is None when not given."""
    body = text.strip()
    body = body.removeprefix("hf://")
    repo_id, _, revision = body.partition("@")
    repo_id = repo_id.strip().strip("/")
    if not REPO_ID.match(repo_id) or ".." in repo_id:
        raise InputError(f"{text}: not a Hugging Face repository id; write it as org/name or org/name@revision")
    return repo_id, (revision.strip() or None)


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) as set now, else huggingface_hub's own setting."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        value = os.environ.get(var)
        if value is not None and value.strip() != "":
            return value.strip().upper() in {"1", "ON", "YES", "TRUE"}
    return bool(hf_constants.HF_HUB_OFFLINE)


def cache_dir() -> Path:
    """The huggingface_hub cache, from the environment as it is now (``HF_HUB_CACHE``, ``HF_HOME``, ...)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.path.expanduser(os.environ[var])))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.path.expanduser(os.environ["HF_HOME"]))) / "hub"
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "huggingface" / "hub"
    return Path(hf_constants.HF_HUB_CACHE)


def storage_folder(repo_id: str, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / repo_folder_name(repo_id=repo_id, repo_type="model")


@dataclass
class RepoFiles:
    """What the Hub lists for one revision, and which of those files a merge needs."""

    repo_id: str
    sha: str
    sizes: dict[str, int | None]  # every file of the revision → size in bytes (None when unknown)
    needed: list[str] = field(default_factory=list)  # files a merge downloads (index shards added later)
    weights_format: str = ""  # its weights format's name (``storage.formats.registry.FORMATS``): "safetensors", "bin"
    gated: bool | str = False
    private: bool = False

    @property
    def expected(self) -> list[str]:
        """``needed`` plus, for a sharded checkpoint, the root weight files its index will most likely name
        (the exact shard list is read from the index when downloading)."""
        files = list(self.needed)
        if files and files[0].endswith(".index.json"):
            suffix = next(f.suffixes[0] for f in registry.FORMATS if f.name == self.weights_format)
            files += sorted(n for n in self.sizes if "/" not in n and n.endswith(suffix) and n not in files)
        return files

    @property
    def expected_bytes(self) -> int:
        return sum(self.sizes.get(f) or 0 for f in self.expected)


def needed_files(names: list[str]) -> tuple[list[str], str]:
    """The files of a repository a merge needs, and the weights format; root-level files only.

    Weights in the first format of ``storage.formats.registry.FORMATS`` the repository holds (each format's
    ``pick``: safetensors' index, whose shards are added once it is read, ``model.safetensors`` or a single
    root ``*.safetensors``; then ``pytorch_model.bin.index.json``, ``pytorch_model.bin``). Raises
    ``InputError`` (without a repository name) when there are none.
    """
    root = [n for n in names if "/" not in n]
    extras = sorted(n for n in root if any(fnmatch(n, p) for p in EXTRA_FILES))
    for fmt in registry.FORMATS:
        weights = fmt.pick(root)
        if weights is not None:
            return weights + [e for e in extras if e not in weights], fmt.name
    raise InputError(f"has no weights RAM Desktop can read ({registry.standard_files()} at the repository root)")


def _index_shards(index_file: Path, where: str) -> list[str]:
    return sorted(set(read_index(index_file, f"{where}: {index_file.name}").values()))


# --------------------------------------------------------------------------------------------------- errors


def _network_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [ConnectionError, TimeoutError, hf_errors.OfflineModeIsEnabled]
    for module in ("httpx2", "httpx", "requests"):
        try:
            mod = __import__(module)
        except ImportError:
            continue
        for name in ("TransportError", "ConnectionError", "Timeout"):
            cls = getattr(mod, name, None)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                types.append(cls)
    return tuple(types)


def hub_error(error: BaseException, repo_id: str, revision: str | None) -> HubError | None:
    """The typed error, naming the repository, for a huggingface_hub (or network) exception; None if it is
    neither. The one place where huggingface_hub's exception classes map to ours.

    The message never contains a token (huggingface_hub's own text is not copied, only its class and
    status code)."""
    rev = revision or DEFAULT_REVISION
    login = "set HF_TOKEN, run `hf auth login`, or enter a token"
    if isinstance(error, hf_errors.GatedRepoError):
        return GatedRepo(
            f"{repo_id}: gated repository — you need access. Accept its conditions at "
            f"https://huggingface.co/{repo_id} with your account, then use a token of that account "
            f"({login})",
            repo_id,
            revision,
        )
    if isinstance(error, hf_errors.RepositoryNotFoundError):
        return RepoNotFound(
            f"{repo_id}: repository not found on the Hugging Face Hub (or it is private and no "
            f"token with access was given); check the id, or {login}",
            repo_id,
            revision,
        )
    if isinstance(error, hf_errors.RevisionNotFoundError):
        return RevisionNotFound(
            f"{repo_id}: revision {rev!r} not found; check the branch, tag or commit sha", repo_id, revision
        )
    if isinstance(error, hf_errors.DisabledRepoError):
        return RepoDisabled(
            f"{repo_id}: the repository has been disabled by its owner and cannot be downloaded", repo_id, revision
        )
    if isinstance(error, hf_errors.RemoteEntryNotFoundError):
        return HubFileMissing(
            f"{repo_id}@{rev}: a file listed by the Hub could not be downloaded (404); "
            "the revision may have changed — try again",
            repo_id,
            revision,
        )
    if isinstance(error, hf_errors.HfHubHTTPError):
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status == 401:
            return HubAuthError(
                f"{repo_id}: the Hub refused the token (401 unauthorized); check it, or {login}", repo_id, revision
            )
        if status == 403:
            return HubAuthError(
                f"{repo_id}: access forbidden (403); your token lacks permission for this repository", repo_id, revision
            )
        return HubHTTPError(
            f"{repo_id}: the Hugging Face Hub answered with an error ({status or 'HTTP error'}); try again later",
            repo_id,
            revision,
        )
    if isinstance(error, (hf_errors.LocalEntryNotFoundError, *_network_error_types())):
        if is_offline() or isinstance(error, hf_errors.OfflineModeIsEnabled):
            return offline_error(repo_id, revision)
        return HubUnreachable(
            f"{repo_id}: cannot reach the Hugging Face Hub ({error.__class__.__name__}) and no "
            f"complete copy of revision {rev!r} is in the cache ({cache_dir()}); check your "
            "connection or proxy, or use a local folder",
            repo_id,
            revision,
        )
    return None


def offline_error(repo_id: str, revision: str | None) -> HubOffline:
    """Offline (``HF_HUB_OFFLINE``) and the revision's weights are not in the cache."""
    rev = revision or DEFAULT_REVISION
    return HubOffline(
        f"{repo_id}: offline (HF_HUB_OFFLINE=1) and revision {rev!r} is not in the local cache "
        f"{cache_dir()} with its weights; connect and unset HF_HUB_OFFLINE to download it, "
        "or use a local folder",
        repo_id,
        revision,
    )


# --------------------------------------------------------------------------------------------------- cache


def cached_snapshot(repo_id: str, revision: str | None) -> tuple[Path, str] | None:
    """The cached snapshot folder and commit sha for a revision (branch or tag via ``refs/``, or a sha)."""
    storage = storage_folder(repo_id)
    rev = revision or DEFAULT_REVISION
    sha = None
    if COMMIT.match(rev):
        sha = rev
    else:
        ref = storage / "refs" / rev
        if contained(storage / "refs", rev) and ref.exists():
            sha = read_text(ref).strip()
    if not sha or not COMMIT.match(sha):
        return None
    folder = storage / "snapshots" / sha
    return (folder, sha) if folder.is_dir() else None


def _complete(folder: Path) -> bool:
    """Whether a snapshot folder holds a complete set of weights (the index's shards included)."""
    names = [p.name for p in folder.iterdir() if p.is_file()]
    try:
        files, _ = needed_files(names)
    except InputError:
        return False
    weights = files[0]
    if weights.endswith(".index.json"):
        try:
            return all((folder / s).is_file() for s in _index_shards(folder / weights, str(folder)))
        except InputError:
            return False
    return True


# --------------------------------------------------------------------------------------------------- online


def list_repo_files(repo_id: str, revision: str | None = None, token: str | None = None) -> RepoFiles:
    """Ask the Hub (``model_info`` with file sizes) for a revision's files and pick those a merge needs.

    Raises a ``HubError`` naming the repository for every Hub error, and ``HubOffline`` when offline.
    """
    if is_offline():
        raise HubOffline(
            f"{repo_id}: offline (HF_HUB_OFFLINE=1); the Hub cannot list files — a cached copy is used if there is one",
            repo_id,
            revision,
        )
    try:
        info = hf.model_info(repo_id, revision=revision, files_metadata=True, token=token)
    except Cancelled:
        raise
    except Exception as e:
        mapped = hub_error(e, repo_id, revision)
        if mapped is None:
            raise
        raise mapped from None
    sizes = {s.rfilename: getattr(s, "size", None) for s in (info.siblings or [])}
    try:
        needed, fmt = needed_files(list(sizes))
    except InputError as e:
        raise InputError(f"{repo_id}@{info.sha}: {e}") from None
    return RepoFiles(
        repo_id,
        str(info.sha),
        sizes,
        needed,
        fmt,
        getattr(info, "gated", False) or False,
        bool(getattr(info, "private", False)),
    )


class _Download:
    """Turns huggingface_hub's per-file tqdm updates into ``download`` progress events (and cancellation)."""

    def __init__(self, reporter: Reporter, repo_id: str, total: int) -> None:
        self.reporter = reporter
        self.repo_id = repo_id
        self.total = total
        self.done = 0

    def bar_class(self, filename: str) -> type:
        outer = self

        class Bar:  # mimics the part of tqdm that huggingface_hub drives
            def __init__(self, *args: object, total: int | None = None, initial: int = 0, **kwargs: object) -> None:
                self.total = total or 0
                self.n = 0
                self.format_dict: dict = {}
                if initial:
                    self.update(initial)

            def __getattr__(self, name: str):  # any other tqdm method huggingface_hub may call: a no-op
                if name.startswith("_"):
                    raise AttributeError(name)
                return lambda *args, **kwargs: None

            def update(self, n: float | None = 1) -> None:
                n = int(n or 0)
                self.n += n
                outer.done += n
                detail = f"{outer.repo_id}: {filename} {_mb(self.n)} of {_mb(self.total)}"
                outer.reporter.progress("download", outer.done, max(outer.total, outer.done), "B", detail)

            def update_transfer(self, n: float | None = 1) -> None:
                outer.reporter.check()

            def set_postfix_str(self, *args: object, **kwargs: object) -> None:
                pass

            def set_transfer_postfix_str(self, *args: object, **kwargs: object) -> None:
                pass

            def set_description(self, *args: object, **kwargs: object) -> None:
                pass

            def refresh(self, *args: object, **kwargs: object) -> None:
                pass

            def close(self) -> None:
                pass

            def __enter__(self) -> Self:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

        return Bar


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def download(repo_id: str, revision: str | None, reporter: Reporter, token: str | None = None) -> tuple[Path, str]:
    """Make the files a merge needs present in the cache; return the snapshot folder and the commit sha."""
    listing = list_repo_files(repo_id, revision, token)
    sha = listing.sha
    cache = cache_dir()
    files = list(listing.needed)

    def fetch(names: list[str], progress: _Download | None) -> None:
        for name in names:
            reporter.check()
            if isinstance(hf.try_to_load_from_cache(repo_id, name, cache_dir=str(cache), revision=sha), str):
                continue
            size = listing.sizes.get(name) or 0
            start = progress.done if progress else 0
            log.info("downloading %s/%s (%s)", repo_id, name, _mb(size))
            bar = progress.bar_class(name) if progress else None
            hf.hf_hub_download(repo_id, name, revision=sha, cache_dir=str(cache), token=token, tqdm_class=bar)
            if progress:
                progress.done = start + size
                progress.reporter.progress(
                    "download", progress.done, max(progress.total, progress.done), "B", f"{repo_id}: {name} done"
                )

    try:
        if files[0].endswith(".index.json"):  # the index names the shards: fetch it first
            fetch([files[0]], None)
            index = storage_folder(repo_id, cache) / "snapshots" / sha / files[0]
            files += [s for s in _index_shards(index, f"{repo_id}@{sha}") if s not in files]
        missing = [
            f
            for f in files
            if not isinstance(hf.try_to_load_from_cache(repo_id, f, cache_dir=str(cache), revision=sha), str)
        ]
        unknown = [f for f in missing if f not in listing.sizes]
        if unknown:
            raise HubFileMissing(
                f"{repo_id}@{sha}: the index names {unknown[0]!r}, which the repository does not have",
                repo_id,
                revision,
            )
        total = sum(listing.sizes.get(f) or 0 for f in missing)
        if missing:
            log.info("%s@%s: downloading %d files (%s) into %s", repo_id, sha[:12], len(missing), _mb(total), cache)
            progress = _Download(reporter, repo_id, total)
            reporter.progress("download", 0, total, "B", f"{repo_id}: {len(missing)} files")
            fetch(missing, progress)
        else:
            log.info("%s@%s: every needed file is in the cache", repo_id, sha[:12])
    except (Cancelled, InputError):
        raise
    except Exception as e:
        mapped = hub_error(e, repo_id, revision)
        if mapped is None:
            if isinstance(e, OSError):
                raise InputError(
                    f"{repo_id}: download failed ({e.__class__.__name__}: "
                    f"{getattr(e, 'strerror', None) or 'I/O error'}); check free disk space at {cache}"
                ) from None
            raise
        raise mapped from None
    return storage_folder(repo_id, cache) / "snapshots" / sha, sha


def resolve(repo_id: str, revision: str | None, reporter: Reporter, token: str | None = None) -> tuple[Path, str]:
    """The snapshot folder and commit sha of ``repo_id@revision``, downloading what is missing if online."""
    cached = cached_snapshot(repo_id, revision)
    usable = cached if cached is not None and _complete(cached[0]) else None
    if is_offline():
        if usable is None:
            raise offline_error(repo_id, revision)
        log.info("%s: using the cached snapshot %s (offline)", repo_id, usable[1])
        return usable
    if usable is not None and revision and COMMIT.match(revision):
        log.info("%s: commit %s is in the cache; not contacting the Hub", repo_id, revision)
        return usable  # a commit never changes
    try:
        return download(repo_id, revision, reporter, token)
    except HubUnreachable:
        if usable is not None:
            log.warning(
                "%s: the Hub cannot be reached; using the cached snapshot %s of %r",
                repo_id,
                usable[1],
                revision or DEFAULT_REVISION,
            )
            return usable
        raise


def open_hub(text: str, reporter: Reporter | None = None, token: str | None = None) -> Checkpoint:
    """Open a Hub source (``org/name``, ``org/name@revision``, ``hf://org/name@revision``) as a ``Checkpoint``
    whose ``repo_id`` and ``revision`` (the resolved commit sha) are set. See the module docstring."""
    reporter = reporter or Reporter()
    repo_id, revision = parse_spec(text)
    reporter.check()
    try:
        folder, sha = resolve(repo_id, revision, reporter, token)
    except (RepoNotFound, HubOffline) as e:  # a bare id may have been meant as a local path
        if text.strip().startswith("hf://"):
            raise
        raise e.with_message(f"{e} (no local folder or file {text.strip()!r} exists either)") from None
    try:
        ckpt = open_local(folder, text)
    except InputError as e:
        raise InputError(f"{repo_id}@{sha}: {e}") from None
    ckpt.repo_id, ckpt.revision = repo_id, sha
    return ckpt
