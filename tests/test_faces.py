"""Every face from a fresh process, as a user meets it: the installed ``ram-merge`` command (and the
``ram-desktop`` window offscreen) run in new subprocesses on every source kind — folder, sharded folder,
single file, PyTorch ``.bin``, LoRA adapter, Hub id from a pre-populated cache with ``HF_HUB_OFFLINE=1`` —
and every subcommand. A face that worked only because an earlier test had imported something (the Hub
code once did) fails here."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import make_models
from .hubcache import populate, sha_of
from .subproc import refused

BIN = Path(sys.executable).parent
RAM_MERGE = BIN / "ram-merge"
RAM_DESKTOP = BIN / "ram-desktop"
DEMO_MODELS = ("base", "coder", "tool", "memory")


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "RAM_DESKTOP_", "PYTEST"))}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=str(root / "hub"),
        HF_HOME=str(root / "hf-home"),
        RAM_DESKTOP_CACHE=str(root / "ram-cache"),
        XDG_CONFIG_HOME=str(root / "config"),
        QT_QPA_PLATFORM="offscreen",
    )
    return env


def run(root: Path, command: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``command args`` in a fresh process, in ``root``, with the Hub offline and its cache under ``root``."""
    return subprocess.run(
        [str(command), *args], capture_output=True, text=True, env=_env(root), cwd=root, timeout=timeout, check=False
    )


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    return done


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """The demo's models (real tokenizer and suites) as folders and as Hub repositories ``acme/<name>`` in
    a cache; small generated models as a sharded folder, a single file, a ``.bin`` and a LoRA adapter."""
    if not RAM_MERGE.exists():
        pytest.skip("ram-merge is not installed beside this Python")
    root = tmp_path_factory.mktemp("faces")
    (root / "out").mkdir()  # every test's outputs, in whatever order the tests run
    ok(run(root, RAM_MERGE, "-q", "demo", "demo"))
    for name in DEMO_MODELS:
        populate(root / "hub", f"acme/{name}", root / "demo" / name, sha_of(name))
    _base, _agents = make_models(root / "small", shards=3)
    single = make_models(root / "single")
    from .test_formats import to_bin

    to_bin(single[1][0], root / "bin-agent")
    return root


def test_the_hub_code_loads_in_a_fresh_process(root):
    """The code the CLI and the window call first for a Hub id, with nothing else imported before it."""
    code = (
        "from ram_desktop.core.ecosystem.hub import source; print(source.cache_dir()); "
        "print(source.storage_folder('acme/base')); print(source.is_offline())"
    )
    done = ok(
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=_env(root),
            cwd=root,
            timeout=120,
            check=False,
        )
    )
    assert done.stdout.split() == [str(root / "hub"), str(root / "hub" / "models--acme--base"), "True"]


SOURCES = {
    "folder": ("demo/base", ["demo/coder", "demo/tool", "demo/memory"]),
    "sharded": ("small/base", ["small/alpha", "small/beta", "small/gamma"]),
    "single-file": (
        "single/base/model.safetensors",
        ["single/alpha/model.safetensors", "single/beta/model.safetensors"],
    ),
    "bin": ("single/base", ["bin-agent", "single/beta"]),
    "hub": ("acme/base", ["acme/coder", "acme/tool@main", "acme/memory"]),
}


@pytest.mark.parametrize("kind", SOURCES)
def test_probe_and_merge_from_every_source_kind(root, kind):
    base, agents = SOURCES[kind]
    done = ok(run(root, RAM_MERGE, "probe", base, *agents))
    assert "density" in done.stdout and "unique" in done.stdout
    out = root / "out" / f"merge-{kind}"
    ok(run(root, RAM_MERGE, "-q", "merge", base, *agents, "--out", str(out)))
    report = json.loads((out / "merge-report.json").read_text())
    assert len(report["agents"]) == len(agents)
    assert any(out.glob("*.safetensors")) and (out / "ram-recipe.yaml").exists()
    # the written recipe runs again in another fresh process, to the same bytes
    again = root / "out" / f"rerun-{kind}"
    ok(run(root, RAM_MERGE, "-q", "run", str(out / "ram-recipe.yaml"), "--out", str(again)))
    for f in sorted(out.glob("*.safetensors")):
        assert (again / f.name).read_bytes() == f.read_bytes(), f.name


def test_lora_adapter_agent(root):
    pytest.importorskip("peft")
    from .test_lora import _adapter, _base_model

    _base_model(root / "lora" / "base")
    _adapter(
        root / "lora" / "base",
        root / "lora" / "adapter",
        seed=3,
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj"],
    )
    ok(run(root, RAM_MERGE, "probe", "lora/base", "lora/adapter"))
    out = root / "out" / "merge-lora"
    ok(
        run(
            root,
            RAM_MERGE,
            "-q",
            "merge",
            "lora/base",
            "lora/adapter",
            "--method",
            "task-arithmetic",
            "--out",
            str(out),
        )
    )
    assert (out / "model.safetensors").exists()


def test_every_subcommand_on_hub_ids(root):
    """compare, fisher, eval, export-mergekit and publish on Hub ids from the cache, each in its own process."""
    agents = ["acme/coder", "acme/tool", "acme/memory"]
    suite = str(root / "demo" / "suites" / "code")
    compared = root / "out" / "compare-hub"
    ok(
        run(
            root,
            RAM_MERGE,
            "-q",
            "compare",
            "acme/base",
            *agents,
            "--variant",
            "ram",
            "--variant",
            "ties",
            "--suite",
            suite,
            "--limit",
            "2",
            "--out",
            str(compared),
        )
    )
    assert {v["name"] for v in json.loads((compared / "compare.json").read_text())["variants"]} >= {"ram", "ties"}
    fisher = root / "out" / "fisher-hub"
    ok(run(root, RAM_MERGE, "-q", "fisher", "acme/coder", "--suite", suite, "--examples", "2", "--out", str(fisher)))
    assert (fisher / "fisher.json").exists() and (fisher / "fisher.safetensors").exists()
    scores = root / "out" / "eval-hub.json"
    ok(
        run(
            root,
            RAM_MERGE,
            "-q",
            "eval",
            "acme/base",
            "acme/coder",
            "--suite",
            suite,
            "--limit",
            "2",
            "--json",
            str(scores),
        )
    )
    assert scores.exists()
    recipe = root / "out" / "hub-recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "format": "ram-recipe/1",
                "method": "ties",
                "base": "acme/base",
                "agents": [{"name": a.split("/")[1], "source": a} for a in agents],
            }
        )
    )
    done = ok(run(root, RAM_MERGE, "export-mergekit", str(recipe)))
    assert "acme/coder" in done.stdout and "ties" in done.stdout
    ok(run(root, RAM_MERGE, "-q", "merge", "acme/base", *agents, "--out", str(root / "out" / "to-publish")))
    # publishing needs the network: offline it is refused with one clear line, nothing uploaded
    refused(run(root, RAM_MERGE, "publish", str(root / "out" / "to-publish"), "acme/merged"))


def test_unknown_hub_repository_offline_is_one_line(root):
    refused(run(root, RAM_MERGE, "-q", "probe", "acme/base", "acme/not-in-cache"), "acme/not-in-cache")


def test_refused_pickle_prints_only_the_error_line(root):
    """A protocol-4 pickle that needs code: torch's own warning about the protocol must not precede it."""
    evil = root / "evil"
    shutil.copytree(root / "bin-agent", evil)

    class RunsCode:
        def __reduce__(self):
            return (os.system, ("touch PWNED",))

    with open(evil / "pytorch_model.bin", "wb") as f:
        pickle.dump({"w": RunsCode()}, f, protocol=4)
    refused(
        run(root, RAM_MERGE, "-q", "merge", "single/base", "evil", "--out", str(root / "out" / "evil")),
        "refused",
        "pytorch_model.bin",
    )
    assert not (root / "PWNED").exists() and not (root / "out" / "evil").exists()


def test_window_opens_the_demo_in_a_fresh_process(root):
    pytest.importorskip("PySide6")
    shot = root / "out" / "demo.png"
    ok(run(root, RAM_DESKTOP, "--demo", "--screenshot", str(shot), timeout=600))
    assert shot.stat().st_size > 10_000


def test_window_opens_a_recipe_of_hub_ids_in_a_fresh_process(root):
    """The window's own Hub path (sources resolved, analysis run) in a process that imported nothing first."""
    pytest.importorskip("PySide6")
    recipe = root / "out" / "window-hub.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "format": "ram-recipe/1",
                "method": "ram-plus",
                "base": "acme/base",
                "agents": [{"name": n, "source": f"acme/{n}"} for n in DEMO_MODELS[1:]],
            }
        )
    )
    shot = root / "out" / "hub.png"
    done = ok(run(root, RAM_DESKTOP, str(recipe), "--screenshot", str(shot), timeout=600))
    assert shot.stat().st_size > 10_000, done.stderr


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_window_closes_cleanly_on_termination_signals(root, sig):
    """A logout or ``kill`` closes the window like its close button (running work cancelled), exit 130."""
    pytest.importorskip("PySide6")
    import signal
    import time

    env = _env(root)
    cache = root / f"ram-cache-{sig}"  # its own cache: the demo's probe result appears there once analysed
    env["RAM_DESKTOP_CACHE"] = str(cache)
    proc = subprocess.Popen(
        [str(RAM_DESKTOP), "--demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root
    )
    try:
        # wait until the window is up and has analysed the demo (its handlers are in place by then); a fixed
        # sleep sent the signal during start-up on a loaded machine, before any handler existed
        deadline = time.monotonic() + 240
        while not list(cache.glob("probe/*.json")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()
        assert list(cache.glob("probe/*.json")), "the demo was not analysed within 240 s"
        proc.send_signal(getattr(signal, sig))
        proc.wait(30)
    finally:
        proc.kill()
    assert proc.returncode == 130, proc.stderr.read()
    assert "Traceback" not in proc.stderr.read()
