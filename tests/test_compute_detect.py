"""Compute detection and the plan (docs/compute.md): recorded ``nvidia-smi`` / ``rocminfo`` outputs served
by fake programs on PATH (several drivers, none, broken ones), and the build each machine gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ram_desktop.core.compute import builds, detect
from ram_desktop.core.compute.detect import Detection, NvidiaGpu

from . import compute_recordings as rec

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_path(tmp_path, monkeypatch):
    """PATH = one folder of fake programs; no ROCm folder."""
    folder = tmp_path / "bin"
    monkeypatch.setenv("PATH", rec.path_with(folder))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    return folder


def test_h100_with_driver_580(fake_path):
    rec.fake_program(fake_path, "nvidia-smi", {"query": (0, rec.H100_580_QUERY), "plain": (0, rec.H100_580_HEADER)})
    gpus, driver, cuda, notes = detect.detect_nvidia()
    assert gpus == (NvidiaGpu("NVIDIA H100 80GB HBM3", 81559, "580.159.04"),)
    assert (driver, cuda, notes) == ("580.159.04", "13.0", [])


def test_two_gpus_with_driver_535(fake_path):
    rec.fake_program(fake_path, "nvidia-smi", {"query": (0, rec.RTX_535_QUERY), "plain": (0, rec.RTX_535_HEADER)})
    gpus, driver, cuda, notes = detect.detect_nvidia()
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 3090"] * 2 and gpus[0].memory_mib == 24576
    assert (driver, cuda, notes) == ("535.183.01", "12.2", [])


def test_no_nvidia_smi_means_no_gpu_and_no_note(fake_path):
    assert detect.detect_nvidia() == ((), None, None, [])
    found = detect.detect()
    assert found.kind in ("cpu", "mps") and found.nvidia == () and found.notes == ()


@pytest.mark.parametrize(
    "code,text,expect",
    [
        (9, rec.NO_DRIVER, "nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't communicate"),
        (18, rec.MISMATCH, "nvidia-smi failed (exit 18): Failed to initialize NVML: Driver/library version mismatch"),
        (0, rec.GARBAGE, "nvidia-smi printed something unexpected"),
        (0, "", "nvidia-smi listed no GPU"),
    ],
)
def test_a_broken_nvidia_smi_gives_no_gpu_and_says_why(fake_path, code, text, expect):
    rec.fake_program(fake_path, "nvidia-smi", {"query": (code, text), "plain": (code, text)})
    gpus, driver, cuda, notes = detect.detect_nvidia()
    assert gpus == () and driver is None and cuda is None
    assert len(notes) == 1 and notes[0].startswith(expect), notes


def test_a_header_without_cuda_version_is_a_note_not_a_failure(fake_path):
    rec.fake_program(fake_path, "nvidia-smi", {"query": (0, rec.TESLA_470_QUERY), "plain": (0, "no header here\n")})
    gpus, driver, cuda, notes = detect.detect_nvidia()
    assert gpus and driver == "470.256.02" and cuda is None
    assert notes == ["nvidia-smi did not name the CUDA version its driver supports"]


def test_rocminfo_lists_the_gpu_agents(fake_path, tmp_path, monkeypatch):
    rocm = tmp_path / "rocm"
    (rocm / ".info").mkdir(parents=True)
    (rocm / ".info" / "version").write_text("6.4.1-120\n")
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    rec.fake_program(fake_path, "rocminfo", {"plain": (0, rec.ROCMINFO_7900)})
    assert detect.detect_rocm() == ("6.4.1", ("Radeon RX 7900 XTX (gfx1100)",), [])


def test_a_broken_rocminfo_says_why(fake_path):
    rec.fake_program(fake_path, "rocminfo", {"plain": (1, "ROCk module is NOT loaded, possibly no GPU devices\n")})
    version, gpus, notes = detect.detect_rocm()
    assert version is None and gpus == ()
    assert notes == ["rocminfo failed (exit 1): ROCk module is NOT loaded, possibly no GPU devices"]


# --- the plan ---------------------------------------------------------------------------------------


def linux(**kw) -> Detection:
    return Detection("linux", "x86_64", "3.11", **kw)


H100 = (NvidiaGpu("NVIDIA H100 80GB HBM3", 81559, "580.159.04"),)


@pytest.fixture
def locks(tmp_path):
    """A locks folder with a CUDA 13 lock (and its sizes) for Linux x86-64, Python 3.11."""
    folder = tmp_path / "locks"
    folder.mkdir()
    (folder / "cuda13-linux-x86_64-py3.11.txt").write_text("torch==2.13.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    (folder / "cuda13-linux-x86_64-py3.11.json").write_text(
        json.dumps(
            {
                "packages": [
                    {"name": "torch", "version": "2.13.0", "bytes": 900_000_000},
                    {"name": "triton", "version": "3.7.1", "bytes": 200_000_000},
                ]
            }
        )
    )
    return folder


def test_driver_580_gets_pypis_cuda13_build(locks, tmp_path):
    plan = builds.choose(
        linux(nvidia=H100, driver="580.159.04", cuda="13.0"), "auto", locks=locks, runtimes=tmp_path / "rt"
    )
    assert (plan.action, plan.variant, plan.build.key) == ("install", "cuda", "cuda13")
    assert plan.index == "https://pypi.org/simple" and plan.lock == locks / "cuda13-linux-x86_64-py3.11.txt"
    assert plan.download_bytes == 1_100_000_000 and [p.name for p in plan.packages] == ["torch", "triton"]
    assert plan.folder == tmp_path / "rt" / "cuda-torch2.13.0"
    assert any("download 1.1 GB" in line for line in plan.describe())


def test_driver_535_is_told_which_build_or_driver_would_do(locks, tmp_path):
    det = linux(nvidia=(NvidiaGpu("NVIDIA GeForce RTX 3090", 24576, "535.183.01"),), driver="535.183.01", cuda="12.2")
    plan = builds.choose(det, "auto", locks=locks, runtimes=tmp_path)
    assert plan.action == "impossible"
    assert "CUDA 12.6 build from PyTorch's index (https://download.pytorch.org/whl/cu126)" in plan.reason
    assert "update the NVIDIA driver to 580.65.06 or newer" in plan.reason
    # with that build's lock present (made by the release workflow), it is installed
    (locks / "cu126-linux-x86_64-py3.11.txt").write_text("torch==2.13.0\n")
    plan = builds.choose(det, "cuda", locks=locks, runtimes=tmp_path)
    assert (plan.action, plan.build.key, plan.index) == ("install", "cu126", "https://download.pytorch.org/whl/cu126")


def test_driver_470_is_too_old_for_any_build(locks, tmp_path):
    det = linux(nvidia=(NvidiaGpu("Tesla V100-SXM2-16GB", 16160, "470.256.02"),), driver="470.256.02", cuda="11.4")
    plan = builds.choose(det, "auto", locks=locks, runtimes=tmp_path)
    assert plan.action == "impossible"
    assert plan.reason.startswith("NVIDIA driver 470.256.02 is too old for torch 2.13.0: it needs driver 580.65.06")
    assert "525.60.13 for the CUDA 12.6 build" in plan.reason and "Update the NVIDIA driver" in plan.reason


def test_no_gpu(locks, tmp_path):
    auto = builds.choose(linux(), "auto", locks=locks, runtimes=tmp_path)
    assert (auto.action, auto.variant) == ("none", "cpu")
    cuda = builds.choose(linux(), "cuda", locks=locks, runtimes=tmp_path)  # asked for explicitly: installed
    assert cuda.action == "install" and cuda.build.key == "cuda13"
    assert cuda.warnings == ("no NVIDIA GPU was found: this torch will compute on the CPU until one is",)


def test_rocm_mps_and_cpu(locks, tmp_path):
    amd = linux(rocm="6.4.1", amd_gpus=("Radeon RX 7900 XTX (gfx1100)",))
    plan = builds.choose(amd, "auto", locks=locks, runtimes=tmp_path)
    assert plan.variant == "rocm" and plan.action == "impossible"
    assert "ROCm 6.4 build from PyTorch's index (https://download.pytorch.org/whl/rocm6.4)" in plan.reason
    # in a user's words: what is missing and what to do, no build-system terms
    assert not [w for w in ("lock file", "release workflow", "wheels", "bundled") if w in plan.reason], plan.reason
    assert "torch files (.whl) you downloaded" in plan.reason and "Settings → Compute" in plan.reason
    mac = Detection("macos", "arm64", "3.11", apple_silicon=True)
    assert builds.choose(mac, "auto", locks=locks).action == "none"
    assert builds.choose(mac, "cuda", locks=locks).action == "impossible"
    assert builds.choose(linux(), "mps", locks=locks).action == "impossible"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    local = builds.choose(linux(), "cpu", find_links=wheels, locks=locks, runtimes=tmp_path)
    assert (local.action, local.find_links, [p.name for p in local.packages]) == ("install", wheels, ["torch"])
    with pytest.raises(ValueError):
        builds.choose(linux(), "tpu")


def test_the_committed_locks_are_hash_locked_and_sized():
    """packaging/locks/ holds what make-locks.py made here: PyPI's CUDA 13 build for Linux x86-64."""
    lock = ROOT / "packaging" / "locks" / "cuda13-linux-x86_64-py3.11.txt"
    text = lock.read_text()
    requirements = [ln for ln in text.splitlines() if ln and not ln.startswith((" ", "#"))]
    assert any(ln.startswith("torch==2.13.0") for ln in requirements)
    assert any(ln.startswith("triton==") for ln in requirements)
    assert text.count("--hash=sha256:") >= len(requirements)
    sizes = json.loads(lock.with_suffix(".json").read_text())
    assert {p["name"] for p in sizes["packages"]} == {ln.split("==")[0] for ln in requirements}
    assert sizes["download_bytes"] > 2_000_000_000 and all(p["bytes"] > 0 for p in sizes["packages"])


def _face(tmp_path: Path, *args: str, path: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAM_DESKTOP_", "XDG_"))}
    env.update(
        PATH=path,
        XDG_DATA_HOME=str(tmp_path / "data"),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        ROCM_PATH=str(tmp_path / "no-rocm"),
    )
    return subprocess.run(
        [sys.executable, "-m", "ram_desktop", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )


def test_dry_run_prints_detection_and_plan_and_exits_0(tmp_path):
    fake = tmp_path / "bin"
    rec.fake_program(fake, "nvidia-smi", {"query": (0, rec.H100_580_QUERY), "plain": (0, rec.H100_580_HEADER)})
    done = _face(tmp_path, "--setup-compute", "auto", "--dry-run", path=rec.path_with(fake))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "NVIDIA GPU 0: NVIDIA H100 80GB HBM3, 80 GiB" in out
    assert "NVIDIA driver 580.159.04 (supports CUDA up to 13.0)" in out
    assert "plan: install — torch 2.13.0, CUDA 13.0 build from PyPI" in out
    assert "download 2.7 GB" in out and "  torch==2.13.0" in out
    assert f"target folder: {tmp_path / 'data' / 'ram-desktop' / 'runtimes' / 'cuda-torch2.13.0'}" in out
    assert not (tmp_path / "data").exists()  # a dry run changes nothing


def test_dry_run_with_a_broken_driver_and_json(tmp_path):
    fake = tmp_path / "bin"
    rec.fake_program(fake, "nvidia-smi", {"query": (9, rec.NO_DRIVER), "plain": (9, rec.NO_DRIVER)})
    done = _face(tmp_path, "--setup-compute", "--dry-run", "--json", path=rec.path_with(fake))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["detection"]["kind"] == "cpu" and data["plan"]["action"] == "none"
    assert data["detection"]["notes"][0].startswith("nvidia-smi failed (exit 9)")


def test_an_old_driver_without_dry_run_is_refused_with_one_line(tmp_path):
    fake = tmp_path / "bin"
    rec.fake_program(fake, "nvidia-smi", {"query": (0, rec.TESLA_470_QUERY), "plain": (0, rec.TESLA_470_HEADER)})
    done = _face(tmp_path, "--setup-compute", "cuda", path=rec.path_with(fake))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1
    assert lines[0].startswith("error: NVIDIA driver 470.256.02 is too old")
    assert not (tmp_path / "data").exists()
