"""The command line and output-folder contracts of SPEC.md section 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ram_desktop.cli import main

from .conftest import make_models
from .reference import load_model

REPO = Path(__file__).resolve().parents[1]


def test_probe_json_format(capsys, tmp_path, models):
    base, agents = models
    out = tmp_path / "probe.json"
    assert main(["-q", "probe", str(base), *map(str, agents), "--names", "c,t,m", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "density" in table and "c " in table
    report = json.loads(out.read_text())
    assert report["format"] == "ram-probe/1"
    assert report["eps"] == 1e-05
    assert report["tensors"] == 2 * 12 + 3 and report["params"] > 0
    assert [a["name"] for a in report["agents"]] == ["c", "t", "m"]
    for a in report["agents"]:
        assert set(a) >= {"name", "source", "updated", "density", "unique", "shared", "rho", "overlap"}
        assert a["updated"] == a["unique"] + a["shared"] == sum(a["overlap"])
        assert a["overlap"][0] == a["unique"] and len(a["overlap"]) == 3
        assert a["rho"] == pytest.approx(a["shared"] / a["unique"])
    layer_names = [l["name"] for l in report["layers"]]
    assert "model.layers.0" in layer_names and "model.layers.1" in layer_names
    assert {"self_attn.q_proj", "mlp.down_proj"} <= {m["name"] for m in report["modules"]}


def test_merge_output_folder(capsys, tmp_path, models):
    base, agents = models
    out = tmp_path / "merged"
    code = main(
        [
            "-q",
            "merge",
            str(base),
            *map(str, agents),
            "--out",
            str(out),
            "--shard-size",
            "20KB",
            "--out-dtype",
            "float32",
            "--names",
            "coder,tool,memory",
        ]
    )
    assert code == 0, capsys.readouterr().err
    names = sorted(p.name for p in out.iterdir())
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) > 2 and all(n.endswith(f"-of-{len(shards):05d}.safetensors") for n in shards)
    for required in (
        "model.safetensors.index.json",
        "config.json",
        "README.md",
        "ram-recipe.yaml",
        "merge-report.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ):
        assert required in names
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    merged = load_model(out)
    assert set(merged) == set(index["weight_map"]) == set(load_model(base))
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in merged.values())
    for shard in shards:  # every shard within budget unless one tensor alone exceeds it
        from ram_desktop.core.storage.formats.safetensors_format import read_header

        tensors, meta = read_header(out / shard)
        assert meta == {"format": "pt"}
        assert len(tensors) == 1 or sum(t.nbytes for t in tensors.values()) <= 20_000
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"
    card = (out / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    assert front["library_name"] == "transformers" and "ram-plus" in front["tags"] and "merge" in front["tags"]
    assert "| coder |" in card and "λ" in card
    report = json.loads((out / "merge-report.json").read_text())
    assert report["format"] == "ram-probe/1" and report["method"] == "ram-plus"
    assert report["method_params"] == {"r": 0.1, "alpha": 2.0}
    assert len(report["lambda"]) == 3 and all(1.0 <= l <= 1.2 for l in report["lambda"])
    assert set(report["timings"]) >= {"merge_s", "total_s"} and "torch" in report["versions"]
    assert not list(tmp_path.glob("merged.*"))


def test_recipe_reproduces_bit_for_bit(capsys, tmp_path, sharded_models):
    base, agents = sharded_models
    first = tmp_path / "first"
    assert (
        main(
            [
                "-q",
                "merge",
                str(base),
                *map(str, agents),
                "--out",
                str(first),
                "--method",
                "ram-plus",
                "--r",
                "0.2",
                "--alpha",
                "1.5",
                "--eps",
                "2e-5",
            ]
        )
        == 0
    )
    recipe = yaml.safe_load((first / "ram-recipe.yaml").read_text())
    assert recipe["parameters"] == {"r": 0.2, "alpha": 1.5} and recipe["eps"] == 2e-5
    second = tmp_path / "second"
    assert main(["-q", "run", str(first / "ram-recipe.yaml"), "--out", str(second)]) == 0
    capsys.readouterr()
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    assert (first / "ram-recipe.yaml").read_text().replace(str(first), "X") == (
        second / "ram-recipe.yaml"
    ).read_text().replace(str(second), "X")


def test_bad_recipe(capsys, tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("format: something-else\n")
    assert main(["-q", "run", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "not a RAM Desktop recipe" in capsys.readouterr().err
    bad.write_text(": : :\n  - [")
    assert main(["-q", "run", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert main(["-q", "run", str(tmp_path / "missing.yaml")]) == 2


def _cli(*args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "ram_desktop", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_exit_code_and_no_traceback_in_a_real_process(tmp_path):
    proc = _cli("merge", str(tmp_path / "missing-base"), str(tmp_path / "a"), "--out", str(tmp_path / "o"))
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err.strip().splitlines() == [f"error: {tmp_path / 'missing-base'}: no such file or folder; check the path"]


def test_real_process_prints_everything_and_exits_0(tmp_path, models):
    """``entry`` ends the process with os._exit after the command: block-buffered stdout (a pipe, no
    PYTHONUNBUFFERED) must still arrive whole, the exit status must be the command's, and the output
    folder must be complete; an atexit hook (Python's teardown) does not run."""
    base, agents = models
    out = tmp_path / "merged"
    code = (
        "import atexit, sys; atexit.register(lambda: print('TEARDOWN RAN', file=sys.stderr)); "
        "from ram_desktop.cli import entry; sys.argv[0] = 'ram-merge'; entry()"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "merge",
            str(base),
            *map(str, agents),
            "--out",
            str(out),
            "--names",
            "coder,tool,memory",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].endswith("eps = 1e-05") and [l.split()[0] for l in lines[2:5]] == ["coder", "tool", "memory"]
    assert lines[-1].startswith(f"merged model written to {out} (")
    assert "TEARDOWN RAN" not in proc.stderr and "INFO: merged 3 agents" in proc.stderr
    assert (out / "merge-report.json").is_file() and not list(tmp_path.glob("merged.*"))


def test_card_reads_back_with_huggingface_hub(capsys, tmp_path, models):
    """The card is written without huggingface_hub's ModelCard class: the file must be exactly what
    ``ModelCard(text).save`` writes, and ``ModelCard.load`` must read its front matter back."""
    from huggingface_hub import ModelCard

    base, agents = models
    out = tmp_path / "merged"
    assert main(["-q", "merge", str(base), *map(str, agents), "--out", str(out), "--names", "coder,tool,memory"]) == 0
    raw = (out / "README.md").read_bytes()
    card = ModelCard.load(out / "README.md")
    assert card.data.tags == ["merge", "ram-desktop", "ram-plus", "reinforcement-learning", "agent"]
    assert card.data.library_name == "transformers" and card.data.base_model is None
    assert "| coder |" in card.text and "λ" in card.text
    card.save(tmp_path / "again.md")
    assert (tmp_path / "again.md").read_bytes() == raw


def test_local_merge_does_not_load_the_hub_client(tmp_path, models):
    """A merge of local folders imports no Hub client (huggingface_hub.repocard pulls hf_api and the
    HTTP stack: ~0.3 CPU-s of every run)."""
    base, agents = models
    code = (
        "import sys; from ram_desktop.cli import main; "
        f"assert main(['-q', 'merge', *sys.argv[1:], '--out', {str(tmp_path / 'o')!r}]) == 0; "
        "print(sorted(m for m in ('huggingface_hub.repocard', 'huggingface_hub.hf_api', 'httpx') "
        "if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(base), *map(str, agents)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_ctrl_c_cancels_cleanly(tmp_path):
    """SIGINT mid-merge: exit 130 and neither the output nor a partial folder is left."""
    big = dict(
        __import__("tests.conftest", fromlist=["SMALL_CONFIG"]).SMALL_CONFIG,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=6,
        vocab_size=2048,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    )
    base, agents = make_models(tmp_path / "in", config=big)
    out = tmp_path / "out"
    # a tiny chunk size makes the merge slow enough to interrupt
    # Ctrl-C in a terminal: SIGINT raises KeyboardInterrupt (a runner that starts tests in the background
    # may hand the child SIGINT ignored, as shells do for background jobs)
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "import sys, ram_desktop.core.engine.chunks as c; c.DEFAULT_CHUNK_ELEMENTS = 64; "
        "import ram_desktop.core.pipeline as e; e.DEFAULT_CHUNK_ELEMENTS = 64; "
        "import ram_desktop.core.spec as s; s.RunOptions.__init__.__defaults__ = (False, 64, True, None, 0); "
        "from ram_desktop.cli import entry; sys.argv[0] = 'ram-merge'; entry()"
    )
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAM_DESKTOP_KERNELS="0")  # the torch path: slow enough at 64 elements
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "merge", str(base), *map(str, agents), "--out", str(out), "--method", "ram"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while not list(tmp_path.glob("out.partial-*")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert list(tmp_path.glob("out.partial-*")), "the merge never started writing"
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "cancelled" in err and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob("out.*"))


def test_core_imports_without_qt(tmp_path):
    """ram_desktop.core and ram_desktop.evaluate must never import Qt (ARCHITECTURE.md: the one rule
    between layers)."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('PySide6', 'shiboken6', 'pyqtgraph', 'PyQt5', 'PyQt6'):\n"
        "            raise ImportError('Qt is blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import pkgutil, importlib, ram_desktop.core as core, ram_desktop.evaluate as evaluate, ram_desktop.cli\n"
        "for package in (core, evaluate):\n"
        "    for m in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "import transformers, transformers.generation\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.stdout.strip() == "ok", result.stderr


def test_card_shows_lambda_only_for_rescaling_methods(capsys, tmp_path, models):
    base, agents = models
    for method, has_lambda in (("ram-plus", True), ("task-arithmetic", False)):
        out = tmp_path / method
        assert main(["-q", "merge", str(base), *map(str, agents), "--out", str(out), "--method", method]) == 0
        header = next(l for l in (out / "README.md").read_text().splitlines() if l.startswith("| agent | source"))
        assert header.endswith("| λ |") == has_lambda
