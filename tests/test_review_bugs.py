"""The bugs a review found on e2a12d1, each reproduced from the command line the way a user met it.

Every test here failed on that commit (checked by running this file against it) and passes now."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ram_desktop.cli import main
from ram_desktop.core.storage import output as output_module

from .conftest import SMALL_CONFIG, make_models, tree_snapshot
from .synthetic import demo_shapes, generate_tensors, write_model

ROOT = Path(__file__).resolve().parents[1]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def output_bytes(folder: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(folder.iterdir())
        if p.name.endswith(".safetensors") or p.name == "model.safetensors.index.json"
    }


# --- TIES model scope must not depend on how the files are split -----------------------------------


def _same_weights_two_layouts(folder: Path) -> tuple[list[Path], list[Path]]:
    """The same base and agents saved as one file each, and as two shards holding the tensors in
    reverse name order (so file order differs from name order)."""
    base, agents = generate_tensors(demo_shapes(SMALL_CONFIG), 11, {"a": 0.5, "b": 0.45, "c": 0.05})
    models = {"base": base, **agents}
    one, shards = [], []
    for name, tensors in models.items():
        tensors = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
        one.append(write_model(folder / "one" / name, tensors, SMALL_CONFIG, shards=1))
        reverse = dict(sorted(tensors.items(), reverse=True))
        shards.append(write_model(folder / "shards" / name, reverse, SMALL_CONFIG, shards=2))
    return one, shards


@pytest.mark.parametrize(
    "flags",
    [
        ["--method", "ties", "--ties-scope", "model", "--density", "0.2"],
        ["--method", "ties", "--ties-scope", "tensor", "--density", "0.3"],
        ["--method", "ram-plus", "--out-dtype", "float32"],
    ],
)
def test_file_split_never_changes_the_output(capsys, tmp_path, flags):
    one, shards = _same_weights_two_layouts(tmp_path / "in")
    outs = []
    for i, models in enumerate((one, shards)):
        out = tmp_path / f"out{i}"
        code, _, err = run_cli(capsys, "merge", *map(str, models), "--out", str(out), *flags)
        assert code == 0, err
        outs.append(output_bytes(out))
    assert outs[0] == outs[1]


# --- ε = 0 with subnormal float32 differences ---------------------------------------------------------


def test_eps_zero_with_subnormal_task_vectors(capsys, tmp_path):
    tiny = torch.finfo(torch.float32).tiny  # smallest normal; below it differences are subnormal
    base = {"w": torch.zeros(4, 8, dtype=torch.float32), "v": torch.linspace(-1, 1, 32).reshape(4, 8)}
    agent = {k: v.clone() for k, v in base.items()}
    agent["w"][0, :5] = torch.tensor([tiny / 2, tiny / 8, -tiny / 4, 2.0**-149, -(2.0**-149)])
    agent["v"][1, 2] = torch.nextafter(agent["v"][1, 2], torch.tensor(2.0))
    for name, tensors in (("base", base), ("agent", agent)):
        (tmp_path / name).mkdir()
        save_file(tensors, str(tmp_path / name / "model.safetensors"), metadata={"format": "pt"})
    report = tmp_path / "probe.json"
    code, _, err = run_cli(
        capsys, "probe", str(tmp_path / "base"), str(tmp_path / "agent"), "--eps", "0", "--json", str(report)
    )
    assert code == 0, err
    assert json.loads(report.read_text())["agents"][0]["updated"] == 6  # every nonzero difference counts at ε = 0
    code, _, err = run_cli(
        capsys,
        "merge",
        str(tmp_path / "base"),
        str(tmp_path / "agent"),
        "--eps",
        "0",
        "--out",
        str(tmp_path / "out"),
        "--method",
        "ram-plus",
    )
    assert code == 0, err
    with safe_open(str(tmp_path / "out" / "model.safetensors"), framework="pt") as f:
        # one agent: every update is unique, λ = 1 + 0.1·clip(0) = 1, so θ = θ_agent exactly
        assert torch.equal(f.get_tensor("w"), agent["w"])


# --- FP8 checkpoints ------------------------------------------------------------------------------------


def test_fp8_checkpoints_are_refused_not_copied(capsys, tmp_path):
    for name, shift in (("base", 0.0), ("agent", 0.25)):
        (tmp_path / name).mkdir()
        w = (torch.linspace(-2, 2, 64).reshape(8, 8) + shift).to(torch.float8_e4m3fn)
        save_file(
            {"layer.weight": w, "layer.weight_scale": torch.tensor([0.5 + shift])},
            str(tmp_path / name / "model.safetensors"),
            metadata={"format": "pt"},
        )
    before = tree_snapshot(tmp_path)
    code, _, err = run_cli(
        capsys, "merge", str(tmp_path / "base"), str(tmp_path / "agent"), "--out", str(tmp_path / "out")
    )
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "F8_E4M3" in err and "layer.weight" in err and "dequantise" in err
    assert not (tmp_path / "out").exists()
    assert tree_snapshot(tmp_path) == before


# --- indexes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mutate, fragments",
    [
        (
            lambda m: m.__setitem__("model.ghost.weight", "model-00001-of-00002.safetensors"),
            ["model.ghost.weight", "no shard holds it"],
        ),
        (lambda m: m.__setitem__(next(iter(m)), 7), ["7", "not a file name"]),
        (lambda m: m.__setitem__(next(iter(m)), None), ["None", "not a file name"]),
    ],
)
def test_index_errors_are_clear(capsys, tmp_path, mutate, fragments):
    base, agents = make_models(tmp_path / "in", shards=2)
    index = agents[0] / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    mutate(data["weight_map"])
    index.write_text(json.dumps(data))
    code, _, err = run_cli(capsys, "merge", str(base), *map(str, agents), "--out", str(tmp_path / "out"))
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert str(index) in err
    for fragment in fragments:
        assert fragment in err
    assert not (tmp_path / "out").exists()


# --- staging folders of killed runs ------------------------------------------------------------------------

HOLD_STAGING = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from ram_desktop.core.storage.output import staging_folder
    with staging_folder(Path(sys.argv[1])) as tmp:
        (tmp / "model.safetensors").write_bytes(b"x" * 1000)
        print(tmp, flush=True)
        time.sleep(600)
""")


def _holder(out: Path) -> tuple[subprocess.Popen, Path]:
    """A process that opened a staging folder for ``out`` (as a merge does) and keeps it open."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", HOLD_STAGING, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    folder = Path(proc.stdout.readline().strip())
    assert folder.is_dir() and ".partial-" in folder.name
    return proc, folder


def test_killed_runs_staging_is_removed_by_the_next_run_and_a_live_ones_kept(capsys, tmp_path, models, caplog):
    base, agents = models
    killed, killed_folder = _holder(tmp_path / "merged")
    live, live_folder = _holder(tmp_path / "other")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        assert killed_folder.is_dir()  # SIGKILL runs no cleanup: the folder is left behind
        code = main(["merge", str(base), *map(str, agents), "--out", str(tmp_path / "merged")])  # not quiet: logs
        assert code == 0, capsys.readouterr().err
        assert not killed_folder.exists()
        assert any(
            f"removed {killed_folder}, left behind by a run that was killed" in r.getMessage() for r in caplog.records
        )
        assert live_folder.is_dir() and (live_folder / "model.safetensors").is_file()  # a live run's folder stays
        assert (tmp_path / "merged" / "model.safetensors").is_file()
        assert not list((tmp_path / "merged").glob(".ram-desktop-owner"))
    finally:
        live.kill()
        live.wait(10)


# --- NaN / Inf when the probe comes from the cache -----------------------------------------------------------


def test_nan_is_refused_when_the_merge_reuses_a_cached_probe(capsys, tmp_path):
    base, agents = make_models(tmp_path / "in", dtype=torch.float32)
    code, _, err = run_cli(capsys, "probe", str(base), *map(str, agents))  # caches the probe of these files
    assert code == 0, err
    target = agents[1] / "model.safetensors"
    stat = target.stat()
    with safe_open(str(target), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 — safe_open is not iterable
    name = sorted(tensors)[3]
    tensors[name].view(-1)[5] = float("nan")
    save_file(tensors, str(target), metadata={"format": "pt"})
    assert target.stat().st_size == stat.st_size
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and time: the cache cannot tell
    code, _, err = run_cli(capsys, "merge", str(base), *map(str, agents), "--out", str(tmp_path / "out"))
    assert code == 2, err
    assert "NaN or Inf" in err and name in err and agents[1].name in err
    assert not (tmp_path / "out").exists()


# --- messages ------------------------------------------------------------------------------------------------


def test_free_disk_message_uses_units_that_fit(capsys, tmp_path, models, monkeypatch):
    base, agents = models
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(output_module.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 999, 999))
    code, _, err = run_cli(capsys, "merge", str(base), *map(str, agents), "--out", str(tmp_path / "out"))
    assert code == 2
    assert "0.00 GB" not in err
    assert "999 B are free" in err
    assert " MB " in err  # the small model's output plus the margin, in MB


def test_model_card_summary_punctuation(capsys, tmp_path, models):
    base, agents = models
    for method in ("ram", "ram-plus", "ties"):
        out = tmp_path / method
        code, _, err = run_cli(capsys, "merge", str(base), *map(str, agents), "--out", str(out), "--method", method)
        assert code == 0, err
        card = (out / "README.md").read_text()
        assert ".)" not in card and ")." not in card.split("— *Behavior")[0].splitlines()[-1]
