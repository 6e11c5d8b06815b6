"""Hub sources against a real huggingface_hub cache layout (offline), and Hub errors simulated at the
huggingface_hub boundary."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import huggingface_hub as hf
import pytest
import yaml

from ram_desktop.cli import main
from ram_desktop.core import MergeSpec, RunOptions, errors
from ram_desktop.core.ecosystem.hub.source import parse_spec
from ram_desktop.core.errors import Cancelled, InputError
from ram_desktop.core.events import Reporter
from ram_desktop.core.pipeline import merge, probe
from ram_desktop.core.sources import open_checkpoint

from .conftest import make_models
from .hubcache import FakeHub, not_found, populate, sha_of

SHAS = {name: sha_of(name) for name in ("base", "alpha", "beta", "gamma")}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(root))
    monkeypatch.setenv("HF_HUB_CACHE", str(root / "hub"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return root / "hub"


@pytest.fixture
def hub_models(tmp_path, cache):
    """Local folders, and the same folders as Hub repos org/<name> in the cache (base sharded)."""
    base, agents = make_models(tmp_path / "local", shards=2)
    for folder in [base, *agents]:
        populate(cache, f"org/{folder.name}", folder, SHAS[folder.name])
    return base, agents


def _safetensors(out: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(out.iterdir())
        if p.suffix == ".safetensors"
        or p.name in ("model.safetensors.index.json", "config.json", "tokenizer.json", "generation_config.json")
    }


def test_parse_spec():
    assert parse_spec("org/name") == ("org/name", None)
    assert parse_spec("org/name@v1.0") == ("org/name", "v1.0")
    assert parse_spec("hf://Qwen/Qwen2.5-7B-Instruct@" + "a" * 40) == ("Qwen/Qwen2.5-7B-Instruct", "a" * 40)
    with pytest.raises(InputError, match="not a Hugging Face repository id"):
        parse_spec("hf://noslash")


@pytest.mark.parametrize("form", ["plain", "sha", "hf"])
def test_merge_from_hub_cache_equals_local_merge(hub_models, tmp_path, form):
    base, agents = hub_models
    spell = {
        "plain": lambda n: f"org/{n}",
        "sha": lambda n: f"org/{n}@{SHAS[n]}",
        "hf": lambda n: f"hf://org/{n}@main",
    }[form]
    local = merge(
        MergeSpec.build(str(base), [str(a) for a in agents], tmp_path / "local-out"),
        options=RunOptions(use_cache=False),
    )
    hub = merge(
        MergeSpec.build(spell("base"), [spell(a.name) for a in agents], tmp_path / "hub-out"),
        options=RunOptions(use_cache=False),
    )
    assert _safetensors(tmp_path / "hub-out") == _safetensors(tmp_path / "local-out")
    assert hub.lambdas == local.lambdas
    recipe = yaml.safe_load((tmp_path / "hub-out" / "ram-recipe.yaml").read_text())
    assert recipe["base"] == f"org/base@{SHAS['base']}"
    assert [a["source"] for a in recipe["agents"]] == [f"org/{a.name}@{SHAS[a.name]}" for a in agents]
    assert [a["name"] for a in recipe["agents"]] == ["alpha", "beta", "gamma"]
    report = json.loads((tmp_path / "hub-out" / "merge-report.json").read_text())
    assert report["sources"]["base"] == f"org/base@{SHAS['base']}"
    assert report["agents"][0]["source"] == f"org/alpha@{SHAS['alpha']}"
    card = (tmp_path / "hub-out" / "README.md").read_text()
    assert "base_model: org/base" in card and f"org/gamma@{SHAS['gamma']}" in card


def test_recipe_with_pinned_hub_sources_reruns(hub_models, tmp_path):
    merge(MergeSpec.build("org/base", ["org/alpha", "org/beta"], tmp_path / "one"))
    assert main(["-q", "run", str(tmp_path / "one" / "ram-recipe.yaml"), "--out", str(tmp_path / "two")]) == 0
    assert _safetensors(tmp_path / "two") == _safetensors(tmp_path / "one")


def test_cli_merge_and_probe_from_hub_ids(hub_models, tmp_path, capsys):
    assert main(["-q", "merge", "org/base", "org/alpha", "org/beta@main", "--out", str(tmp_path / "o")]) == 0
    assert main(["-q", "probe", "org/base", "org/alpha", "--json", str(tmp_path / "p.json")]) == 0
    assert json.loads((tmp_path / "p.json").read_text())["agents"][0]["source"] == f"org/alpha@{SHAS['alpha']}"


def test_local_path_wins_over_hub_id(hub_models, tmp_path, monkeypatch):
    base, _ = hub_models
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    import shutil

    shutil.copytree(base, tmp_path / "org" / "alpha")
    ckpt = open_checkpoint("org/alpha")
    assert ckpt.repo_id is None and ckpt.path == (tmp_path / "org" / "alpha").resolve()
    assert open_checkpoint("hf://org/alpha").repo_id == "org/alpha"


def test_offline_and_not_cached(cache, tmp_path, capsys):
    with pytest.raises(InputError, match=r"org/missing: offline \(HF_HUB_OFFLINE=1\) and revision 'main' is not in"):
        open_checkpoint("org/missing")
    assert main(["merge", "org/missing", "org/other", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: org/missing: offline") and "Traceback" not in err[0]
    assert err[0].endswith("(no local folder or file 'org/missing' exists either)")
    with pytest.raises(InputError) as info:
        open_checkpoint("hf://org/missing")
    assert "exists either" not in str(info.value)
    assert not (tmp_path / "o").exists()


def test_offline_unknown_revision_and_incomplete_snapshot(hub_models, cache):
    with pytest.raises(InputError, match="org/alpha: offline .* revision 'v2' is not in the local cache"):
        open_checkpoint("org/alpha@v2")
    # a snapshot holding only the config (someone fetched config.json alone) is not enough
    _, agents = hub_models
    populate(cache, "org/partial", agents[0], sha_of("partial"), only=["config.json"])
    with pytest.raises(InputError, match="org/partial: offline"):
        open_checkpoint("org/partial")
    # an index whose shard is missing from the cache is incomplete too
    populate(
        cache,
        "org/half",
        hub_models[0],
        sha_of("half"),
        only=["model.safetensors.index.json", "model-00001-of-00002.safetensors"],
    )
    with pytest.raises(InputError, match="org/half: offline"):
        open_checkpoint("org/half")


def _hub_failure(monkeypatch, error):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(hf, "model_info", fail)
    monkeypatch.setattr(hf, "hf_hub_download", fail)


@pytest.mark.parametrize(
    "make_error,message,kind",
    [
        (
            lambda: not_found(hf.errors.RepositoryNotFoundError, "org/nope", 401),
            r"org/nope: repository not found on the Hugging Face Hub \(or it is private",
            errors.RepoNotFound,
        ),
        (
            lambda: not_found(hf.errors.GatedRepoError, "org/nope", 403),
            r"org/nope: gated repository — you need access\. Accept its conditions at https://huggingface.co/org/nope",
            errors.GatedRepo,
        ),
        (
            lambda: not_found(hf.errors.RevisionNotFoundError, "org/nope"),
            r"org/nope: revision 'v9' not found; check the branch, tag or commit sha",
            errors.RevisionNotFound,
        ),
        (
            lambda: hf.errors.LocalEntryNotFoundError("connection error"),
            r"org/nope: cannot reach the Hugging Face Hub \(LocalEntryNotFoundError\) and no complete copy",
            errors.HubUnreachable,
        ),
        (
            lambda: __import__("httpx2").ConnectError("[Errno -3] Temporary failure in name resolution"),
            r"org/nope: cannot reach the Hugging Face Hub \(ConnectError\)",
            errors.HubUnreachable,
        ),
        (
            lambda: hf.errors.OfflineModeIsEnabled("offline"),
            r"org/nope: offline \(HF_HUB_OFFLINE=1\)",
            errors.HubOffline,
        ),
        (
            lambda: not_found(hf.errors.HfHubHTTPError, "org/nope", 401),
            r"org/nope: the Hub refused the token \(401",
            errors.HubAuthError,
        ),
    ],
)
def test_hub_errors_give_clear_messages(cache, tmp_path, monkeypatch, capsys, make_error, message, kind):
    _hub_failure(monkeypatch, make_error())
    spec = "org/nope@v9" if "revision" in message else "org/nope"
    with pytest.raises(InputError, match=message) as info:
        open_checkpoint(spec)
    assert type(info.value) is kind and info.value.repo_id == "org/nope"  # told apart by class, not by text
    assert info.value.revision == ("v9" if "@" in spec else None)
    code = main(["merge", spec, "org/x", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: org/nope")


def test_gated_error_while_downloading(cache, tmp_path, monkeypatch):
    base, _ = make_models(tmp_path / "local")
    hub = FakeHub(monkeypatch, {"org/gated": (base, sha_of("gated"))})

    def gated(*args, **kwargs):
        raise not_found(hf.errors.GatedRepoError, "org/gated", 403)

    monkeypatch.setattr(hf, "hf_hub_download", gated)
    with pytest.raises(InputError, match="org/gated: gated repository"):
        open_checkpoint("org/gated")
    assert hub.tokens == [None]


def test_network_failure_falls_back_to_cached_snapshot(hub_models, monkeypatch, caplog):
    import httpx2

    _hub_failure(monkeypatch, httpx2.ConnectError("down"))
    caplog.set_level("WARNING", logger="ram_desktop")
    ckpt = open_checkpoint("org/alpha")
    assert ckpt.revision == SHAS["alpha"]
    assert "cannot be reached; using the cached snapshot" in caplog.text


def test_fallback_follows_the_error_class_not_its_text(hub_models, monkeypatch):
    from ram_desktop.core.ecosystem.hub import source as hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")

    def unreachable(repo_id, *args, **kwargs):
        raise errors.HubUnreachable("worded any way", repo_id)

    monkeypatch.setattr(hub, "download", unreachable)
    assert open_checkpoint("org/alpha").revision == SHAS["alpha"]  # the cached snapshot is used

    def other(repo_id, *args, **kwargs):
        raise InputError(f"{repo_id}: cannot reach the Hugging Face Hub (but not an unreachable Hub)")

    monkeypatch.setattr(hub, "download", other)
    with pytest.raises(InputError, match="but not an unreachable Hub"):
        open_checkpoint("org/alpha")


def test_cached_commit_needs_no_network(hub_models, monkeypatch):
    _hub_failure(monkeypatch, AssertionError("the Hub must not be asked"))
    assert open_checkpoint(f"org/beta@{SHAS['beta']}").revision == SHAS["beta"]


def test_download_only_needed_files_with_progress_then_reuse_cache(tmp_path, cache, monkeypatch):
    base, agents = make_models(tmp_path / "local", shards=2)
    repos = {f"org/{f.name}": (f, sha_of("remote-" + f.name)) for f in [base, *agents]}
    extra = {
        "README.md": b"# card",
        "original/consolidated.pth": b"x" * 5000,
        "pytorch_model.bin": b"y" * 7000,
        "onnx/model.onnx": b"z",
    }
    hub = FakeHub(monkeypatch, repos, extra)
    events = []
    reporter = Reporter(events.append)
    result = merge(MergeSpec.build("org/base", ["org/alpha", "org/beta", "org/gamma"], tmp_path / "out"), reporter)
    needed = {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    base_files = sorted(
        needed
        | {"model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    )
    assert sorted(hub.downloads) == sorted(base_files * 4)  # the four repositories download concurrently
    assert not {"README.md", "original/consolidated.pth", "pytorch_model.bin", "onnx/model.onnx"} & set(hub.downloads)
    downloads = [e for e in events if e.stage == "download"]
    assert downloads and all(e.unit == "B" for e in downloads)
    ends = [e for e in downloads if e.detail.endswith("done")]
    assert len({e.detail.split(":")[0] for e in ends}) == 4  # each repository finished
    # one combined progress: bytes of all repositories (config.json came with the header check, the index
    # is read before the shard list is known)
    served = sum(
        len(d)
        for repo in repos
        for n, d in hub._files(repo).items()
        if n in set(base_files) - {"config.json", "model.safetensors.index.json"}
    )
    assert downloads[-1].done == downloads[-1].total == served
    assert all(a.done <= b.done for a, b in itertools.pairwise(downloads))
    assert any("model-00001-of-00002.safetensors" in e.detail and "MB of" in e.detail for e in downloads)
    assert result.report["sources"]["base"] == f"org/base@{repos['org/base'][1]}"
    # equal to the local merge
    merge(MergeSpec.build(str(base), [str(a) for a in agents], tmp_path / "local-out"))
    assert _safetensors(tmp_path / "out") == _safetensors(tmp_path / "local-out")
    # second run: one model_info per source, nothing downloaded again
    hub.downloads.clear()
    merge(MergeSpec.build("org/base", ["org/alpha", "org/beta", "org/gamma"], tmp_path / "out2"))
    assert hub.downloads == []


def test_cancel_during_download_leaves_no_output(tmp_path, cache, monkeypatch):
    base, agents = make_models(tmp_path / "local")
    FakeHub(monkeypatch, {f"org/{f.name}": (f, sha_of(f.name)) for f in [base, *agents]})  # serves the repos
    reporter = Reporter()
    seen = []

    def on_progress(event):
        seen.append(event)
        if event.stage == "download" and event.done > 3000:
            reporter.cancel.cancel()

    reporter._on_progress = on_progress
    with pytest.raises(Cancelled):
        merge(MergeSpec.build("org/base", ["org/alpha"], tmp_path / "out"), reporter)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob("out.partial-*"))
    assert {e.stage for e in seen} == {"download"}


def test_token_reaches_the_hub_and_is_never_written(tmp_path, cache, monkeypatch, caplog, capsys):
    secret, env_secret = "hf_explicitSECRETtoken123", "hf_environmentSECRET456"
    base, agents = make_models(tmp_path / "local")
    hub = FakeHub(monkeypatch, {f"org/{f.name}": (f, sha_of(f.name)) for f in [base, *agents]})
    monkeypatch.setenv("HF_TOKEN", env_secret)
    caplog.set_level("DEBUG")
    request = MergeSpec.build("org/base", ["org/alpha", "org/beta"], tmp_path / "out")
    options = RunOptions(token=secret)
    assert secret not in repr(request) and secret not in repr(options)
    merge(request, options=options)
    assert set(hub.tokens) == {secret}
    # without an explicit token, huggingface_hub is left to find HF_TOKEN / the stored login
    assert main(["merge", "org/base", "org/alpha", "org/gamma", "--out", str(tmp_path / "out2")]) == 0
    assert hub.tokens[-1] is None
    written = "".join(
        p.read_text(errors="replace")
        for out in ("out", "out2")
        for p in (tmp_path / out).iterdir()
        if p.suffix != ".safetensors"
    )
    captured = capsys.readouterr()
    for text in (written, caplog.text, captured.out, captured.err):
        assert secret not in text and env_secret not in text


def test_probe_from_hub_sources(hub_models):
    base, agents = hub_models
    a = probe(MergeSpec.build("org/base", ["org/alpha", "org/beta", "org/gamma"]), RunOptions(use_cache=False))
    b = probe(MergeSpec.build(str(base), [str(x) for x in agents]), RunOptions(use_cache=False))
    assert [x.unique for x in a.agents] == [x.unique for x in b.agents]
    assert a.agents[0].source == f"org/alpha@{SHAS['alpha']}"


def test_progress_class_fits_huggingface_hub_progress_machinery(cache):
    """The tqdm stand-in works with huggingface_hub's own bar factory (plain HTTP downloads) and its Xet
    progress reporter, and cancels from inside them."""
    from types import SimpleNamespace

    from huggingface_hub.utils._xet_progress_reporting import XetDownloadProgressReporter
    from huggingface_hub.utils.tqdm import _get_progress_bar_context

    from ram_desktop.core.ecosystem.hub.source import _Download

    events = []
    reporter = Reporter(events.append)
    progress = _Download(reporter, "org/x", 3000)
    with _get_progress_bar_context(
        desc="f", log_level=logging.INFO, total=1000, initial=100, tqdm_class=progress.bar_class("a.safetensors")
    ) as bar:
        bar.update(900)
    with XetDownloadProgressReporter(
        reconstruction_desc="r", total=2000, log_level=logging.INFO, tqdm_class=progress.bar_class("b.safetensors")
    ) as xet:
        xet.update_progress(
            SimpleNamespace(
                total_bytes_completed=1500,
                total_transfer_bytes_completed=1200,
                total_bytes_completion_rate=None,
                total_transfer_bytes_completion_rate=None,
                total_bytes=2000,
            )
        )
        reporter.cancel.cancel()
        with pytest.raises(Cancelled):
            xet.update_progress(
                SimpleNamespace(
                    total_bytes_completed=2000,
                    total_transfer_bytes_completed=1900,
                    total_bytes_completion_rate=None,
                    total_transfer_bytes_completion_rate=None,
                    total_bytes=2000,
                )
            )
    assert [e.done for e in events][:2] == [100, 1000] and events[-1].done == 3000
    assert events[-1].total == 3000 and "b.safetensors" in events[-1].detail
