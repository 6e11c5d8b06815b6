"""Lay out a real huggingface_hub cache (models--org--name/{refs,snapshots,blobs}) from local model folders,
and a fake Hub (model_info + hf_hub_download) that serves those folders into the cache."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub as hf
from huggingface_hub.hf_api import RepoSibling
from huggingface_hub.utils import SafetensorsFileMetadata, SafetensorsRepoMetadata, TensorInfo as SafetensorsTensorInfo


def repo_dir(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def add_file(cache: Path, repo_id: str, sha: str, name: str, data: bytes) -> Path:
    """Store ``data`` as a blob and link ``snapshots/<sha>/<name>`` to it, as huggingface_hub does."""
    repo = repo_dir(cache, repo_id)
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.exists():
        blob.write_bytes(data)
    link = repo / "snapshots" / sha / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.exists() or link.is_symlink():
        link.unlink()
    os.symlink(os.path.relpath(blob, link.parent), link)
    return link


def populate(
    cache: Path, repo_id: str, folder: Path, sha: str, refs: tuple[str, ...] = ("main",), only: list[str] | None = None
) -> Path:
    """Put every file of ``folder`` (or ``only`` those) into the cache at commit ``sha``; point ``refs`` at it."""
    for f in sorted(folder.iterdir()):
        if f.is_file() and (only is None or f.name in only):
            add_file(cache, repo_id, sha, f.name, f.read_bytes())
    (repo_dir(cache, repo_id) / "snapshots" / sha).mkdir(parents=True, exist_ok=True)
    for ref in refs:
        path = repo_dir(cache, repo_id) / "refs" / ref
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(sha)
    return repo_dir(cache, repo_id) / "snapshots" / sha


def sha_of(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


class FakeHub:
    """Serves local folders as Hub repositories: ``model_info`` lists files with sizes, ``hf_hub_download``
    copies a file into the cache in 1000-byte steps through the given tqdm class. Records every call."""

    def __init__(self, monkeypatch, repos: dict[str, tuple[Path, str]], extra_files: dict[str, bytes] | None = None):
        self.repos = repos  # repo_id -> (folder, sha)
        self.extra = extra_files or {}
        self.downloads: list[str] = []
        self.tokens: list[object] = []
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        monkeypatch.setattr(hf, "model_info", self.model_info)
        monkeypatch.setattr(hf, "hf_hub_download", self.hf_hub_download)
        monkeypatch.setattr(hf, "get_safetensors_metadata", self.get_safetensors_metadata)
        self.metadata_requests: list[str] = []
        self.step_delay = 0.0  # seconds per 1000-byte step of a download (to overlap concurrent downloads)
        self._lock = threading.Lock()
        self.active = 0
        self.max_active = 0

    def _files(self, repo_id: str) -> dict[str, bytes]:
        folder, _ = self.repos[repo_id]
        files = {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()}
        files.update(self.extra)
        return files

    def model_info(self, repo_id, *, revision=None, files_metadata=False, token=None, **kw):
        self.tokens.append(token)
        if repo_id not in self.repos:
            raise not_found(hf.errors.RepositoryNotFoundError, repo_id)
        _, sha = self.repos[repo_id]
        if revision not in (None, "main", sha):
            raise not_found(hf.errors.RevisionNotFoundError, repo_id)
        siblings = [RepoSibling(rfilename=n, size=len(d)) for n, d in self._files(repo_id).items()]
        return SimpleNamespace(id=repo_id, sha=sha, siblings=siblings, gated=False, private=False)

    def hf_hub_download(self, repo_id, filename, *, revision=None, cache_dir=None, token=None, tqdm_class=None, **kw):
        self.tokens.append(token)
        _, sha = self.repos[repo_id]
        assert revision == sha, "downloads must be pinned to the resolved commit"
        data = self._files(repo_id)[filename]
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if tqdm_class is not None:
                bar = tqdm_class(total=len(data), initial=0, desc=filename, unit="B", unit_scale=True)
                for i in range(0, len(data), 1000):
                    if self.step_delay:
                        time.sleep(self.step_delay)
                    bar.update(min(1000, len(data) - i))
                bar.close()
        finally:
            with self._lock:
                self.active -= 1
        self.downloads.append(filename)
        return str(add_file(Path(cache_dir), repo_id, sha, filename, data))

    def get_safetensors_metadata(self, repo_id, *, revision=None, token=None, **kw):
        """The safetensors headers of the served folder, as huggingface_hub returns them (no weights read)."""
        self.tokens.append(token)
        self.metadata_requests.append(repo_id)
        if repo_id not in self.repos:
            raise not_found(hf.errors.RepositoryNotFoundError, repo_id)
        folder, sha = self.repos[repo_id]
        assert revision == sha, "header reads must be pinned to the resolved commit"
        files = {}
        for f in sorted(folder.glob("*.safetensors")):
            raw = f.read_bytes()
            n = struct.unpack("<Q", raw[:8])[0]
            header = json.loads(raw[8 : 8 + n])
            meta = header.pop("__metadata__", {}) or {}
            files[f.name] = SafetensorsFileMetadata(
                metadata=meta,
                tensors={
                    name: SafetensorsTensorInfo(
                        dtype=t["dtype"], shape=t["shape"], data_offsets=tuple(t["data_offsets"])
                    )
                    for name, t in header.items()
                },
            )
        weight_map = {name: fn for fn, fm in files.items() for name in fm.tensors}
        return SafetensorsRepoMetadata(
            metadata=None, sharded=len(files) > 1, weight_map=weight_map, files_metadata=files
        )


def not_found(cls, repo_id: str, status: int = 404):
    import httpx2

    response = httpx2.Response(status, request=httpx2.Request("GET", f"https://huggingface.co/api/models/{repo_id}"))
    return cls(f"{status} Client Error for {repo_id}", response=response)
