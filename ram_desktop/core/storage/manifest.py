"""What a RAM Desktop output folder holds, by size and content hash (``ram-manifest.json``, written last), and the
judgement ``--overwrite`` rests on: which entries of a folder RAM Desktop did not write, or that changed since
(docs/contracts.md, "What a merge writes"). A folder is ours to replace only when nothing in it is foreign.

A folder written before manifests existed is ours only when it has the earlier layout exactly
(``legacy_foreign``): regular files only, every name one an earlier merge (or Fisher estimate) wrote, a
report that parses and names exactly the weight files present, each of them a safetensors file whose header
accounts for its size. Markers alone (an empty ``merge-report.json``) never make a folder ours."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import struct
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from .formats.base import CONTENT_DIGEST, INDEX_FILE as INDEX_NAME, content_hasher, written_digest

MANIFEST = "ram-manifest.json"
MANIFEST_FORMAT = "ram-manifest/2"  # entries: size and CONTENT_DIGEST
# earlier manifests: the same with SHA-256; still read, so an earlier output stays replaceable
DIGEST_OF_FORMAT = {"ram-manifest/1": "sha256", MANIFEST_FORMAT: CONTENT_DIGEST}
READ_LIMIT = 64 * 2**20  # a report, recipe or manifest larger than this is not one we wrote

# the names an earlier merge wrote besides its weights and tokenizer files (eval.json: added by evaluation)
LEGACY_MERGE_FILES = ("config.json", "README.md", "ram-recipe.yaml", "merge-report.json", "eval.json")
# the base's files a merge copies (output.copy_tokenizer_files), as fnmatch patterns
TOKENIZER_FILES = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "*.tiktoken",
    "spiece.model",
    "sentencepiece*.model",
    "generation_config.json",
    "chat_template*",
    "preprocessor_config.json",
)
_SHARD = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors")


def file_digest(path: Path, algorithm: str = CONTENT_DIGEST) -> str:
    """The hex digest of the file's bytes: ``CONTENT_DIGEST`` (remembered where this process just wrote the file
    and hashed it on the way) or ``sha256`` (an earlier manifest's)."""
    if algorithm == CONTENT_DIGEST:
        remembered = written_digest(path)
        if remembered is not None:
            return remembered
    digest = content_hasher() if algorithm == CONTENT_DIGEST else hashlib.sha256()
    buffer = bytearray(16 * 2**20)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])  # both release the GIL
    return str(digest.hexdigest())


def _entry(path: Path, algorithm: str = CONTENT_DIGEST) -> dict[str, Any]:
    return {"size": path.stat().st_size, algorithm: file_digest(path, algorithm)}


def write_manifest(folder: Path, **extra: Any) -> None:
    """List every regular file under ``folder`` (by path relative to it) with its size and ``CONTENT_DIGEST`` in
    ``folder/ram-manifest.json``, written atomically. A subfolder holding its own manifest is listed by that
    manifest alone (it pins the rest). ``extra``: more keys (a cache's source fingerprint)."""
    files: dict[str, dict[str, Any]] = {}
    for rel, path in _listing(folder):
        files[rel] = _entry(path)
    _write_json(folder / MANIFEST, {"format": MANIFEST_FORMAT, **extra, "files": files})


def record_files(folder: Path, names: list[str]) -> None:
    """After one of our own tools rewrote or added ``names`` in ``folder`` (evaluation's ``eval.json`` and
    card): their new sizes and hashes go into the manifest. A folder without a readable manifest is left
    without one (it was not ours to vouch for)."""
    manifest = read_manifest(folder)
    if manifest is None:
        return
    algorithm = DIGEST_OF_FORMAT[manifest["format"]]
    for name in names:
        if (folder / name).is_file():
            manifest["files"][name] = _entry(folder / name, algorithm)
    _write_json(folder / MANIFEST, manifest)


def entry_matches(folder: Path, name: str) -> bool:
    """Whether ``folder/name`` is absent or still what the manifest records (a tool that rewrites it may then
    record the new content as ours; a file the user changed stays the user's)."""
    manifest = read_manifest(folder)
    path = folder / name
    if manifest is None:
        return False
    if not os.path.lexists(path):
        return True
    recorded = manifest["files"].get(name)
    return recorded is not None and _is_regular(path) and _entry(path, DIGEST_OF_FORMAT[manifest["format"]]) == recorded


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, or None when it is missing, not a regular file, unreadable or malformed."""
    data = _read_json(folder / MANIFEST)
    if (
        not isinstance(data, dict)
        or data.get("format") not in DIGEST_OF_FORMAT
        or not isinstance(data.get("files"), dict)
    ):
        return None
    algorithm = DIGEST_OF_FORMAT[data["format"]]
    for name, entry in data["files"].items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("size"), int)
            or not isinstance(entry.get(algorithm), str)
            or not _safe_relative(name)
        ):
            return None
    return data


def foreign_entries(
    folder: Path,
    tolerated: Callable[[Path], bool] | None = None,
    legacy: Callable[[Path], list[str]] | None = None,
    hashes: bool = True,
) -> list[str]:
    """What in ``folder`` RAM Desktop did not write or that changed since (paths relative to it, sorted);
    empty when the folder is ours to replace. With a manifest: every entry must be listed with its size and
    hash (files listed but gone are fine: nothing of the user's is lost with them). Without one: ``legacy``
    judges (default: the earlier merge or Fisher layout, ``legacy_foreign``). ``tolerated``: entries that
    are neither ours nor the user's (a run's lock file, a staging folder its owner tidies, Python's bytecode).
    ``hashes=False`` compares names and sizes only (the check repeated under the output lock, moments after
    the full one)."""
    manifest = read_manifest(folder)
    if manifest is None:
        return (legacy or legacy_foreign)(folder)
    recorded: dict[str, dict[str, Any]] = manifest["files"]
    foreign: list[str] = []
    for rel, path in _entries(folder, tolerated):
        if rel.endswith("/"):  # a non-regular entry or an unlisted subfolder
            foreign.append(rel.rstrip("/"))
            continue
        if path.name == MANIFEST and path.parent != folder:  # a nested output: judged by its own manifest
            prefix = rel[: -len(MANIFEST)]
            foreign += [prefix + f for f in foreign_entries(path.parent, hashes=hashes)]
            continue
        if not _matches(path, recorded.get(rel), DIGEST_OF_FORMAT[manifest["format"]] if hashes else None):
            foreign.append(rel)
    return sorted(foreign)


def _matches(path: Path, entry: dict[str, Any] | None, algorithm: str | None) -> bool:
    """Whether the file at ``path`` is the one a manifest entry records, by size and by the ``algorithm`` digest
    (None: size only); a file we cannot read is not."""
    try:
        return (
            entry is not None
            and path.stat().st_size == entry["size"]
            and (algorithm is None or file_digest(path, algorithm) == entry[algorithm])
        )
    except OSError:
        return False


def _entries(folder: Path, tolerated: Callable[[Path], bool] | None) -> list[tuple[str, Path]]:
    """Every entry under ``folder`` the way ``write_manifest`` lists it: regular files by relative path; a
    subfolder with its own manifest as that manifest only; anything that is not a regular file or folder
    (a link, a FIFO) as ``name/`` (foreign)."""
    found: list[tuple[str, Path]] = []

    def walk(d: Path, prefix: str) -> None:
        try:
            items = sorted(d.iterdir())
        except OSError:  # unreadable: whatever it holds cannot be vouched for
            found.append((prefix or "./", d))
            return
        for item in items:
            rel = prefix + item.name
            if (d == folder and item.name == MANIFEST) or (tolerated is not None and tolerated(item)):
                continue
            try:
                mode = os.lstat(item).st_mode
            except OSError:
                found.append((rel + "/", item))
                continue
            if stat.S_ISREG(mode):
                found.append((rel, item))
            elif stat.S_ISDIR(mode):
                if _is_regular(item / MANIFEST):
                    found.append((rel + "/" + MANIFEST, item / MANIFEST))
                    continue
                before = len(found)
                walk(item, rel + "/")
                if len(found) == before:  # an empty folder is no file of ours either
                    found.append((rel + "/", item))
            else:
                found.append((rel + "/", item))

    walk(folder, "")
    return found


def _listing(folder: Path) -> list[tuple[str, Path]]:
    return [(rel, path) for rel, path in _entries(folder, None) if not rel.endswith("/")]


def legacy_foreign(folder: Path) -> list[str]:
    """Without a manifest, what in ``folder`` is not ours. Ours only in the exact layout an earlier merge
    (weights, config, tokenizer files, card, recipe, report, eval.json) or Fisher estimate (``fisher.json``
    and the weights it lists) wrote: with a report or ``fisher.json`` that does not vouch for the weights
    present, every entry is the user's; with valid ones, every entry that is not a regular file of those
    names is."""
    try:
        items = sorted(folder.iterdir())
    except OSError:
        return [folder.name]
    everything = [p.name for p in items]
    names = {p.name for p in items if _is_regular(p)}
    weights = {n for n in names if _SHARD.fullmatch(n)} | ({INDEX_NAME} & names)
    allowed: Callable[[str], bool]
    if "merge-report.json" in names:
        report = _read_json(folder / "merge-report.json")
        output = report.get("output") if isinstance(report, dict) else None
        listed = output.get("files") if isinstance(output, dict) else None
        valid = (
            isinstance(report, dict)
            and report.get("format") == "ram-probe/1"
            and isinstance(report.get("method"), str)
            and "ram-recipe.yaml" in names
            and _is_recipe(folder / "ram-recipe.yaml")
            and isinstance(listed, list)
            and set(listed) == weights
        )
        allowed = lambda n: n in weights or n in LEGACY_MERGE_FILES or _is_tokenizer(n)
    elif "fisher.json" in names:
        info = _read_json(folder / "fisher.json")
        listed = info.get("files") if isinstance(info, dict) else None
        valid = isinstance(listed, list) and all(isinstance(n, str) for n in listed) and set(listed) <= names
        weights = {str(n) for n in listed} if valid and isinstance(listed, list) else set()
        allowed = lambda n: n in weights or n == "fisher.json"
    else:
        return everything
    whole = all(_whole_safetensors(folder / n) for n in weights if n.endswith(".safetensors"))
    if not valid or not weights or not whole:
        return everything
    return [n for n in everything if n not in names or not allowed(n)]


def _is_tokenizer(name: str) -> bool:
    return any(fnmatch(name, pattern) for pattern in TOKENIZER_FILES)


def _is_recipe(path: Path) -> bool:
    """A recipe an earlier merge wrote: its first line names the format (``MergeSpec.save`` writes it first)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return False
    return bool(re.search(r"^format:\s*ram-recipe/\d+\s*$", head, re.MULTILINE))


def _whole_safetensors(path: Path) -> bool:
    """A safetensors file whose header accounts for its size exactly (the data ends where the file ends)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            (length,) = struct.unpack("<Q", f.read(8))
            if length > min(size - 8, 100 * 2**20):
                return False
            header = json.loads(f.read(length))
        if not isinstance(header, dict):
            return False
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        return 8 + length + max(ends, default=0) == size
    except (OSError, ValueError, struct.error, KeyError, TypeError, IndexError, AttributeError):
        return False


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _safe_relative(name: object) -> bool:
    return isinstance(name, str) and bool(name) and not name.startswith("/") and ".." not in name.split("/")


def _read_json(path: Path) -> Any:
    """The JSON in ``path``, or None for anything that is not a small regular file holding valid JSON."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > READ_LIMIT:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
