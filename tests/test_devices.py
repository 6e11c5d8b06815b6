"""Device names (core/devices.py): cpu, cuda[:N], rocm[:N] (a ROCm build's GPUs, which torch reports as cuda), mps
and auto resolve in one place; a device the running torch cannot use is one InputError naming it."""

from __future__ import annotations

import pytest
import torch

from ram_desktop.core import devices
from ram_desktop.core.errors import InputError

from .subproc import cli, refused
from .synthetic import write_synthetic


def test_cpu_and_auto_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.resolve_device(" CPU ") == torch.device("cpu")
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert devices.resolve_device("") == torch.device("cpu")


@pytest.mark.parametrize("name", ["tpu", "cpu:0", "cuda:x", "mps:1", "rocm:", "cuda:-1"])
def test_unknown_names_are_refused_naming_them(name):
    with pytest.raises(InputError, match=f"unknown device '{name}'; use auto, cpu, cuda, cuda:N, rocm, rocm:N or mps"):
        devices.resolve_device(name)


def _build(monkeypatch, hip: str | None, cuda: str | None, gpus: int) -> None:
    """The running torch as another build: its version fields and how many GPUs it sees."""
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)


def test_a_rocm_build_answers_to_cuda_and_rocm(monkeypatch):
    _build(monkeypatch, "6.4.43482", None, 2)
    assert devices.torch_build() == "rocm"
    assert devices.resolve_device("rocm:1") == torch.device("cuda", 1)
    assert devices.resolve_device("rocm") == torch.device("cuda")
    assert devices.resolve_device("cuda:0") == torch.device("cuda", 0)
    assert devices.resolve_device("auto") == torch.device("cuda")
    with pytest.raises(InputError, match=r"^device rocm:2 does not exist; 2 ROCm device\(s\) found$"):
        devices.resolve_device("rocm:2")


def test_rocm_on_a_cuda_build_and_cuda_without_a_gpu_name_the_build(monkeypatch):
    _build(monkeypatch, None, "12.4", 1)
    assert devices.torch_build() == "cuda"
    assert devices.resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(InputError, match=r"device rocm requested but torch .* \(a CUDA build\) is not a ROCm build"):
        devices.resolve_device("rocm")
    _build(monkeypatch, None, "12.4", 0)
    with pytest.raises(
        InputError, match=r"device cuda:1 requested but no CUDA GPU is available to torch .*use --device"
    ):
        devices.resolve_device("cuda:1")


def test_mps_only_where_torch_can_use_it(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(InputError, match=r"^device mps requested but torch \S+ \(.*\) cannot use it here"):
        devices.resolve_device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert devices.resolve_device("mps") == torch.device("mps")
    assert devices.resolve_device("auto").type != "mps"  # MPS is chosen by name only (float32 only)


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this torch can use MPS")
def test_the_cli_refuses_a_device_this_torch_cannot_use_in_one_line(tmp_path):
    base, agents = write_synthetic(tmp_path / "in")
    done = cli(tmp_path, "merge", str(base), *map(str, agents), "--out", str(tmp_path / "out"), "--device", "mps")
    refused(done, "device mps", "cannot use it")
    assert not (tmp_path / "out").exists()


def _gpu_present(monkeypatch, gpus: int) -> None:
    _build(monkeypatch, None, "12.4", gpus)
    monkeypatch.setattr(devices, "gpu_possible", lambda: gpus > 0)


def test_auto_takes_the_cpu_where_every_step_has_a_fused_cpu_kernel(monkeypatch):
    _gpu_present(monkeypatch, 1)
    asked: list[bool] = []

    def kernels(answer: bool):
        def ask() -> bool:
            asked.append(answer)
            return answer

        return ask

    chosen = devices.choose_device("auto", kernels(True))
    assert chosen.name == "cpu" and "fused kernels" in chosen.reason and "(cuda)" in chosen.reason
    chosen = devices.choose_device("auto", kernels(False))
    assert chosen.name == "cuda" and chosen.reason.startswith("auto: the GPU")
    chosen = devices.choose_device("cuda", kernels(True))  # a device named is the device used
    assert chosen == devices.DeviceChoice("cuda", "cuda as chosen")
    assert asked == [True, False]


def test_auto_without_a_gpu_never_asks_for_the_kernels(monkeypatch):
    _gpu_present(monkeypatch, 0)

    def never() -> bool:
        raise AssertionError("numba need not load where no GPU is present")

    assert devices.choose_device("auto", never) == devices.DeviceChoice("cpu", "auto: no CUDA or ROCm GPU here")
    assert devices.choose_device("cpu", never).name == "cpu"


def test_the_merge_report_and_the_log_say_which_device_ran_and_why(tmp_path, caplog):
    from ram_desktop.core import pipeline
    from ram_desktop.core.spec import MergeSpec

    base, agents = write_synthetic(tmp_path / "in")
    spec = MergeSpec.build(base, agents, output=tmp_path / "out", method="ram-plus", device="cpu")
    with caplog.at_level("INFO", logger="ram_desktop"):
        result = pipeline.merge(spec)
    assert result.report["device"] == "cpu" and result.report["device_reason"] == "cpu as chosen"
    assert "device: cpu (cpu as chosen)" in caplog.text
