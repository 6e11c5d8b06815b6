"""``ram-merge publish`` against a fake of huggingface_hub's ``HfApi``: what is uploaded, the card, the
private flag, errors, and the token in no file, log or output."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import ClassVar

import huggingface_hub as hf
import pytest
from huggingface_hub import errors as hf_errors

from ram_desktop.cli import main
from ram_desktop.core import MergeSpec
from ram_desktop.core.ecosystem.hub.publish import publish
from ram_desktop.core.errors import InputError
from ram_desktop.core.pipeline import merge

SECRET = "hf_typedSECRETtoken789"
ENV_SECRET = "hf_environmentSECRET012"


class FakeHfApi:
    """Stands in for ``huggingface_hub.HfApi``: a repository is a folder under ``remote``; uploads copy files."""

    instances: ClassVar[list[FakeHfApi]] = []

    def __init__(
        self, remote: Path, existing: set[str], status: int | None = None, token: str | None = None, **kwargs
    ) -> None:
        self.remote, self.existing, self.status = remote, existing, status
        self.token = token
        self.calls: list[tuple] = []
        FakeHfApi.instances.append(self)

    def _effective_token(self):
        return self.token or hf.get_token()

    def create_repo(self, repo_id, *, repo_type=None, private=None, exist_ok=False, **kwargs):
        self.calls.append(("create_repo", repo_id, repo_type, private, exist_ok, self._effective_token()))
        if self.status is not None:
            raise hf_errors.HfHubHTTPError("refused", response=_Response(self.status))
        if repo_id in self.existing and not exist_ok:
            raise hf_errors.HfHubHTTPError("exists", response=_Response(409))
        self.existing.add(repo_id)
        (self.remote / repo_id).mkdir(parents=True)
        return hf.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(
        self, *, folder_path, repo_id, repo_type=None, commit_message=None, ignore_patterns=None, **kwargs
    ):
        self.calls.append(("upload_folder", repo_id, repo_type, self._effective_token()))
        assert repo_id in self.existing
        src = Path(folder_path)
        for f in src.rglob("*"):
            rel = f.relative_to(src)
            if f.is_file() and not any(p.startswith(".") for p in rel.parts):
                (self.remote / repo_id / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, self.remote / repo_id / rel)


class _Response:
    def __init__(self, status: int) -> None:
        self.status_code = status
        self.headers: dict = {}
        self.request = None
        self.url = "https://huggingface.co/api/repos/create"

    def json(self):
        return {}


@pytest.fixture
def fake_api(tmp_path, monkeypatch):
    remote = tmp_path / "remote"
    remote.mkdir()
    state = {"existing": set(), "status": None}
    FakeHfApi.instances = []
    monkeypatch.setattr(
        hf, "HfApi", lambda token=None, **kw: FakeHfApi(remote, state["existing"], state["status"], token=token)
    )
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(hf.constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))  # no stored login
    monkeypatch.setattr(hf.constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens"))
    return remote, state


@pytest.fixture
def merged(models, tmp_path) -> Path:
    base, agents = models
    merge(MergeSpec.build(str(base), [str(a) for a in agents], tmp_path / "out"))
    return tmp_path / "out"


def test_publish_uploads_the_folder_with_its_card(merged, fake_api, capsys, caplog, monkeypatch):
    remote, _ = fake_api
    monkeypatch.setenv("HF_TOKEN", ENV_SECRET)
    caplog.set_level("DEBUG")
    assert main(["publish", str(merged), "me/merged-agents", "--private"]) == 0
    out = capsys.readouterr().out
    assert "https://huggingface.co/me/merged-agents" in out
    api = FakeHfApi.instances[-1]
    assert api.calls[0][:5] == ("create_repo", "me/merged-agents", "model", True, False)
    assert api.token is None and api.calls[0][5] == ENV_SECRET  # huggingface_hub found HF_TOKEN itself
    uploaded = sorted(str(p.relative_to(remote / "me/merged-agents")) for p in (remote / "me/merged-agents").rglob("*"))
    local = sorted(str(p.relative_to(merged)) for p in merged.rglob("*") if p.is_file())
    assert uploaded == local
    assert {"README.md", "ram-recipe.yaml", "merge-report.json", "config.json"} <= set(uploaded)
    assert (remote / "me/merged-agents" / "README.md").read_bytes() == (merged / "README.md").read_bytes()
    assert ENV_SECRET not in caplog.text + out


def test_public_by_default_and_typed_token_goes_only_to_the_api(merged, fake_api, tmp_path, caplog, capsys):
    caplog.set_level("DEBUG")
    result = publish(merged, "me/public", token=SECRET)
    assert result.url == "https://huggingface.co/me/public" and not result.private
    api = FakeHfApi.instances[-1]
    assert api.token == SECRET and api.calls[0][3] is False
    assert SECRET not in repr(result)
    written = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert SECRET.encode() not in written
    assert SECRET not in caplog.text + capsys.readouterr().err


@pytest.mark.parametrize(
    "problem,needle",
    [
        ("no card", "README.md"),
        ("no weights", ".safetensors"),
        ("no folder", "no such folder"),
        ("bad id", "not a Hugging Face repository id"),
        ("exists", "already exists"),
        ("refused", "refused the token"),
        ("no token", "no Hugging Face token"),
    ],
)
def test_publish_errors_are_one_line_exit_2(merged, fake_api, tmp_path, capsys, monkeypatch, problem, needle):
    _, state = fake_api
    folder, repo = merged, "me/model"
    if problem != "no token":
        monkeypatch.setenv("HF_TOKEN", ENV_SECRET)
    if problem == "no card":
        (merged / "README.md").unlink()
    elif problem == "no weights":
        for f in merged.glob("*.safetensors"):
            f.unlink()
    elif problem == "no folder":
        folder = tmp_path / "nowhere"
    elif problem == "bad id":
        repo = "not a repo"
    elif problem == "exists":
        state["existing"].add(repo)
    elif problem == "refused":
        state["status"] = 403
    code = main(["-q", "publish", str(folder), repo])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
    assert ENV_SECRET not in err[0]
    uploaded = [c for api in FakeHfApi.instances for c in api.calls if c[0] == "upload_folder"]
    assert uploaded == []


def test_hidden_files_are_not_uploaded(merged, fake_api):
    remote, _ = fake_api
    (merged / ".cache").mkdir()
    (merged / ".cache" / "x").write_text("local")
    publish(merged, "me/m", token=SECRET)
    assert not (remote / "me/m" / ".cache").exists()
    with pytest.raises(InputError):
        publish(merged, "me/m", token=SECRET)
