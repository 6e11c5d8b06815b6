"""Hub sources checked from their remote safetensors headers before any weight file is requested, and
downloaded concurrently with one combined progress and cancel, at the huggingface_hub boundary."""

from __future__ import annotations

import itertools
import threading
from collections import namedtuple
from pathlib import Path

import pytest

from ram_desktop.cli import main
from ram_desktop.core import MergeSpec
from ram_desktop.core.ecosystem.hub import check as hub_check
from ram_desktop.core.errors import Cancelled
from ram_desktop.core.events import Reporter
from ram_desktop.core.pipeline import merge

from .conftest import SMALL_CONFIG, make_models
from .hubcache import FakeHub, sha_of


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(root))
    monkeypatch.setenv("HF_HUB_CACHE", str(root / "hub"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return root / "hub"


def _weights(names: list[str]) -> list[str]:
    return [n for n in names if n.endswith(".safetensors")]


def _serve(monkeypatch, folders: dict[str, Path]) -> FakeHub:
    return FakeHub(monkeypatch, {repo: (folder, sha_of(repo)) for repo, folder in folders.items()})


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"intermediate_size": 40}, "has shape [32, 40]"),
        ({"vocab_size": 80}, "vocabulary rows"),
    ],
)
def test_mismatch_between_remote_repositories_before_any_weight_file(
    tmp_path, cache, monkeypatch, capsys, change, needle
):
    base, agents = make_models(tmp_path / "a")
    _, other = make_models(tmp_path / "b", config=dict(SMALL_CONFIG, **change), agents={"odd": 0.5})
    hub = _serve(monkeypatch, {"org/base": base, "org/alpha": agents[0], "org/odd": other[0]})
    code = main(["-q", "merge", "org/base", "org/alpha", "org/odd", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0] and "org/odd" in err[0], err
    assert _weights(hub.downloads) == []  # nothing but config.json was fetched
    assert set(hub.metadata_requests) == {"org/base", "org/alpha", "org/odd"}
    assert not (tmp_path / "out").exists()


def test_remote_agent_against_a_local_base_is_checked_from_headers(tmp_path, cache, monkeypatch, capsys):
    base, _ = make_models(tmp_path / "a")
    _, other = make_models(tmp_path / "b", config=dict(SMALL_CONFIG, vocab_size=80), agents={"odd": 0.5})
    hub = _serve(monkeypatch, {"org/odd": other[0]})
    assert main(["-q", "probe", str(base), "org/odd"]) == 2
    assert "vocabulary rows" in capsys.readouterr().err
    assert _weights(hub.downloads) == []


def test_not_enough_disk_is_reported_before_downloading(tmp_path, cache, monkeypatch, capsys):
    base, agents = make_models(tmp_path / "a")
    hub = _serve(monkeypatch, {"org/base": base, "org/alpha": agents[0]})
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(hub_check.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    assert main(["-q", "merge", "org/base", "org/alpha", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "not enough free disk space" in err and "downloads" in err and "output" in err
    assert _weights(hub.downloads) == []


def test_concurrent_downloads_with_one_combined_progress(tmp_path, cache, monkeypatch):
    base, agents = make_models(tmp_path / "a")
    hub = _serve(monkeypatch, {f"org/{f.name}": f for f in [base, *agents]})
    hub.step_delay = 0.002
    events = []
    lock = threading.Lock()

    def on_progress(event):
        with lock:
            events.append(event)

    merge(MergeSpec.build("org/base", ["org/alpha", "org/beta", "org/gamma"], tmp_path / "out"), Reporter(on_progress))
    assert hub.max_active >= 2  # several repositories were downloading at the same time
    downloads = [e for e in events if e.stage == "download"]
    weight_bytes = sum(f.stat().st_size for d in [base, *agents] for f in d.glob("*.safetensors"))
    assert downloads[-1].done == downloads[-1].total >= weight_bytes
    assert all(a.done <= b.done for a, b in itertools.pairwise(downloads))
    details = {e.detail.split(":")[0] for e in downloads}
    assert {"org/base", "org/alpha", "org/beta", "org/gamma"} <= details


def test_cancel_stops_every_concurrent_download(tmp_path, cache, monkeypatch):
    base, agents = make_models(tmp_path / "a")
    hub = _serve(monkeypatch, {f"org/{f.name}": f for f in [base, *agents]})
    hub.step_delay = 0.002
    reporter = Reporter()

    def on_progress(event):
        if event.stage == "download" and event.done > 20000:
            reporter.cancel.cancel()

    reporter._on_progress = on_progress
    with pytest.raises(Cancelled):
        merge(MergeSpec.build("org/base", ["org/alpha", "org/beta", "org/gamma"], tmp_path / "out"), reporter)
    assert not (tmp_path / "out").exists()
    assert hub.active == 0  # every transfer has stopped
    assert not [t for t in threading.enumerate() if t.name.startswith("hub-download")]
    assert len(_weights(hub.downloads)) < 4


def test_one_failing_repository_stops_the_others(tmp_path, cache, monkeypatch, capsys):
    base, agents = make_models(tmp_path / "a")
    hub = _serve(monkeypatch, {f"org/{f.name}": f for f in [base, *agents]})
    real = hub.hf_hub_download

    def flaky(repo_id, filename, **kw):
        if repo_id == "org/beta" and filename.endswith(".safetensors"):
            raise ConnectionError("connection reset")
        return real(repo_id, filename, **kw)

    monkeypatch.setattr(hub_check.hf, "hf_hub_download", flaky)
    assert main(["-q", "merge", "org/base", "org/alpha", "org/beta", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "org/beta" in err and "cannot reach" in err
    assert not (tmp_path / "out").exists()
