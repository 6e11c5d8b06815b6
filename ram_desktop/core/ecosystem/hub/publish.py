"""Publish a merged output folder to the Hugging Face Hub: create the repository, upload the folder
(weights, config, tokenizer, the ``README.md`` model card, ``ram-recipe.yaml``, ``merge-report.json``).

The token is an explicit argument (the GUI's password field) or, when None, whatever huggingface_hub
finds itself (``HF_TOKEN``, the login stored by ``hf auth login``). It is only ever handed to
``huggingface_hub.HfApi``: never logged, put in an error message, returned, or written to a file.
Every call goes through the module attribute ``huggingface_hub.HfApi`` (tests replace it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub as hf
from huggingface_hub import constants as hf_constants

from ...errors import HubAuthError, HubError, HubHTTPError, InputError
from ...events import Reporter
from .source import REPO_ID, _network_error_types, hub_error

log = logging.getLogger("ram_desktop")

CARD = "README.md"


@dataclass(frozen=True)
class Published:
    repo_id: str
    url: str
    files: list[str]
    private: bool


def output_files(folder: Path) -> list[str]:
    """The files to upload (relative paths); ``InputError`` unless the folder is a merge output with its card."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder; publish the output folder of a merge")
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and not _hidden(p, folder))
    if CARD not in files:
        raise InputError(f"{folder}: no {CARD} model card; publish the output folder of a merge (it writes one)")
    if not any(f.endswith(".safetensors") for f in files):
        raise InputError(f"{folder}: no .safetensors weights; publish the output folder of a merge")
    return files


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def has_stored_token() -> bool:
    """Whether huggingface_hub finds a token by itself (``HF_TOKEN`` or a stored login)."""
    try:
        return bool(hf.get_token())
    except (OSError, ValueError):  # a broken or unreadable token file must not stop the dialog from opening
        return False


def check_repo_id(repo_id: str) -> str:
    repo_id = repo_id.strip()
    if not REPO_ID.match(repo_id) or ".." in repo_id:
        raise InputError(f"{repo_id!r}: not a Hugging Face repository id; write it as org/name")
    return repo_id


def publish(folder: Path, repo_id: str, private: bool = False, token: str | None = None,
            reporter: Reporter | None = None) -> Published:
    """Create ``repo_id`` (a model repository; it must not exist yet) and upload ``folder`` into it."""
    reporter = reporter or Reporter()
    repo_id = check_repo_id(repo_id)
    files = output_files(Path(folder))
    if token is None and not has_stored_token():
        raise InputError("no Hugging Face token: set HF_TOKEN, run `hf auth login`, or type a token with write "
                         "access")
    total = sum((Path(folder) / f).stat().st_size for f in files)
    api = hf.HfApi(token=token or None)
    reporter.progress("upload", 0, total, "B", f"creating {repo_id}")
    failures: tuple[type[BaseException], ...] = (OSError, *_network_error_types())
    try:
        repo_url = api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=False)
        reporter.progress("upload", 0, total, "B", f"uploading {len(files)} files")
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                          commit_message="Upload merged model (RAM Desktop)", ignore_patterns=[".*", "**/.*"])
    except failures as e:  # the Hub's errors (OSError subclasses) and the network's
        # become one line naming the repository
        raise _publish_error(e, repo_id) from None
    reporter.progress("upload", total, total, "B", "done")
    url = str(getattr(repo_url, "url", None) or f"{hf_constants.ENDPOINT}/{repo_id}")
    log.info("published %s (%d files, %s)", url, len(files), "private" if private else "public")
    return Published(repo_id, url, files, private)


def _publish_error(error: BaseException, repo_id: str) -> BaseException:
    status = getattr(getattr(error, "response", None), "status_code", None)
    if status == 409:
        return HubHTTPError(f"{repo_id}: the repository already exists on the Hub; choose another name (nothing "
                            "was uploaded)", repo_id)
    if status in (401, 403):
        return HubAuthError(f"{repo_id}: the Hub refused the token (HTTP {status}); use a token with write "
                            f"access to {repo_id.split('/')[0]}", repo_id)
    known = hub_error(error, repo_id, None)
    if known is not None:
        return known
    if isinstance(error, OSError):
        return HubError(f"{repo_id}: upload failed ({error.__class__.__name__}); check the connection and "
                        "publish again", repo_id)
    return error
