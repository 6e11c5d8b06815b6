"""Every bad input of SPEC.md section 4 that concerns local files: exit 2, one `error:` line naming the
problem, nothing written, inputs untouched. Warnings where the spec asks for warnings."""

from __future__ import annotations

import json
import shutil
import struct
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ram_desktop.cli import main
from ram_desktop.core.storage import output as output_module

from .conftest import tree_snapshot


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_refused(capsys, tmp_path, inputs, argv, *fragments):
    """The merge exits 2 with one error line containing ``fragments``; nothing is written anywhere."""
    before = tree_snapshot(*inputs)
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, "merge", *argv, "--out", str(out))
    assert code == 2, err
    lines = [l for l in err.strip().splitlines() if l]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert not out.exists()
    assert not list(tmp_path.glob("out.partial-*"))
    assert tree_snapshot(*inputs) == before
    return lines[0]


def test_missing_path(capsys, tmp_path, models):
    base, _agents = models
    assert_refused(capsys, tmp_path, [base.parent], [str(base), str(tmp_path / "nope")], "nope", "no such file")


def test_folder_without_weights(capsys, tmp_path, models):
    base, _agents = models
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    assert_refused(capsys, tmp_path, [base.parent, empty], [str(base), str(empty)], str(empty), "no model weights")


def _corrupt_copy(src: Path, dst: Path, mutate) -> Path:
    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    f.write_bytes(mutate(f.read_bytes()))
    return dst


@pytest.mark.parametrize(
    "kind,mutate,message",
    [
        ("truncated", lambda b: b[: len(b) // 2], "truncated"),
        ("header-length", lambda b: struct.pack("<Q", 10**12) + b[8:], "header length"),
        ("bad-json", lambda b: b[:8] + b"{not json" + b[17:], "invalid JSON"),
        ("tiny", lambda b: b[:5], "not a safetensors file"),
    ],
)
def test_corrupt_safetensors(capsys, tmp_path, models, kind, mutate, message):
    base, agents = models
    bad = _corrupt_copy(agents[0], tmp_path / f"bad-{kind}", mutate)
    line = assert_refused(capsys, tmp_path, [base.parent, bad], [str(base), str(bad), str(agents[1])], message)
    assert "model.safetensors" in line


def test_offsets_outside_file(capsys, tmp_path, models):
    base, agents = models
    bad = tmp_path / "bad-offsets"
    shutil.copytree(agents[0], bad)
    f = bad / "model.safetensors"
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin + 10**9, end + 10**9]
    new = json.dumps(header).encode()
    new += b" " * (n - len(new)) if len(new) <= n else b""
    f.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])
    assert_refused(capsys, tmp_path, [base.parent, bad], [str(base), str(bad)], "outside the file", name)


def test_index_names_missing_shard(capsys, tmp_path, sharded_models):
    base, agents = sharded_models
    shard = sorted(agents[0].glob("model-*.safetensors"))[1]
    shard.unlink()
    assert_refused(capsys, tmp_path, [base.parent], [str(base), str(agents[0])], shard.name, "missing")


def test_index_names_file_outside_folder(capsys, tmp_path, sharded_models):
    base, agents = sharded_models
    index = agents[0] / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    first = next(iter(data["weight_map"]))
    data["weight_map"][first] = "../base/model-00001-of-00003.safetensors"
    index.write_text(json.dumps(data))
    assert_refused(capsys, tmp_path, [base.parent], [str(base), str(agents[0])], "outside the model folder")


def test_tensor_names_differ(capsys, tmp_path, models):
    base, agents = models
    from .reference import load_model

    tensors = load_model(agents[0])
    dropped = sorted(tensors)[:7]
    for name in dropped:
        del tensors[name]
    tensors["extra.weight"] = torch.zeros(2)
    odd = tmp_path / "odd"
    odd.mkdir()
    save_file(tensors, str(odd / "model.safetensors"))
    line = assert_refused(
        capsys, tmp_path, [base.parent, odd], [str(base), str(odd)], "missing 7", "extra 1", "extra.weight", ", ..."
    )
    assert sum(name in line for name in dropped) == 5  # at most five names listed per checkpoint


def test_shape_mismatch(capsys, tmp_path, models):
    base, agents = models
    from .reference import load_model

    tensors = load_model(agents[0])
    tensors["model.norm.weight"] = torch.zeros(5, dtype=torch.bfloat16)
    odd = tmp_path / "odd"
    odd.mkdir()
    save_file(tensors, str(odd / "model.safetensors"))
    assert_refused(capsys, tmp_path, [base.parent, odd], [str(base), str(odd)], "model.norm.weight", "[5]", "[32]")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_in_task_vector(capsys, tmp_path, models, value):
    base, agents = models
    from .reference import load_model

    tensors = load_model(agents[1])
    t = tensors["model.layers.1.mlp.up_proj.weight"].clone()
    t.view(-1)[5] = value
    tensors["model.layers.1.mlp.up_proj.weight"] = t
    odd = tmp_path / "odd"
    odd.mkdir()
    save_file(tensors, str(odd / "model.safetensors"))
    assert_refused(
        capsys,
        tmp_path,
        [base.parent, odd],
        [str(base), str(agents[0]), str(odd)],
        "model.layers.1.mlp.up_proj.weight",
        "NaN or Inf",
        "odd",
    )


def test_zero_agents(capsys, tmp_path, models):
    base, _ = models
    code, _, err = run_cli(capsys, "merge", str(base), "--out", str(tmp_path / "out"))
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_zero_agents_in_core(models, tmp_path):
    from ram_desktop.core import MergeSpec
    from ram_desktop.core.errors import InputError
    from ram_desktop.core.pipeline import merge

    base, _ = models
    with pytest.raises(InputError, match="no agents"):
        merge(MergeSpec.build(str(base), [], tmp_path / "out"))


@pytest.mark.parametrize("where", ["equal", "inside", "contains"])
def test_output_overlapping_an_input(capsys, tmp_path, models, where):
    base, agents = models
    target = {"equal": agents[0], "inside": agents[0] / "sub", "contains": agents[0].parent}[where]
    before = tree_snapshot(base.parent)
    code, _, err = run_cli(capsys, "merge", str(base), *map(str, agents), "--out", str(target), "--overwrite")
    assert code == 2 and "input" in err and err.count("\n") == 1
    assert tree_snapshot(base.parent) == before
    assert not (agents[0] / "sub").exists()


def test_existing_output_needs_overwrite(capsys, tmp_path, models):
    base, agents = models
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run_cli(capsys, "merge", str(base), *map(str, agents), "--out", str(out))
    # --overwrite would refuse this folder too (keep.txt is the user's): not offered, a free folder is
    assert code == 2 and "--overwrite" not in err and "keep.txt" in err and "choose a new folder" in err, err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    # --overwrite replaces an earlier RAM Desktop output only: an unrelated folder is refused, untouched
    (out / "sub").mkdir()
    (out / "sub" / "data.csv").write_text("1,2\n")
    before = tree_snapshot(out)
    code, _, err = run_cli(capsys, "merge", str(base), *map(str, agents), "--out", str(out), "--overwrite")
    assert code == 2 and "RAM Desktop did not write" in err and "choose a new folder" in err, err
    assert tree_snapshot(out) == before
    fresh = tmp_path / "fresh"
    code, _, err = run_cli(capsys, "merge", str(base), *map(str, agents), "--out", str(fresh))
    assert code == 0, err
    first = (fresh / "model.safetensors").read_bytes()
    code, _, err = run_cli(capsys, "merge", str(base), *map(str, agents), "--out", str(fresh), "--method", "ram")
    assert code == 2 and "earlier RAM Desktop output" in err and "pass --overwrite" in err, err  # offered: it works
    code, _, err = run_cli(
        capsys, "merge", str(base), *map(str, agents), "--out", str(fresh), "--overwrite", "--method", "ram"
    )
    assert code == 0, err
    assert (fresh / "model.safetensors").read_bytes() != first
    assert json.loads((fresh / "merge-report.json").read_text())["method"] == "ram"
    assert not [p.name for p in tmp_path.iterdir() if ".partial-" in p.name or ".old-" in p.name or "lock" in p.name]


def test_not_enough_free_disk(capsys, tmp_path, models, monkeypatch):
    base, agents = models
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(output_module.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    assert_refused(capsys, tmp_path, [base.parent], [str(base), *map(str, agents)], "not enough free disk")


def test_bad_parameters_and_usage(capsys, tmp_path, models):
    base, agents = models
    for argv in (
        ["--r", "-1"],
        ["--method", "ram", "--r", "0.2"],
        ["--shard-size", "lots"],
        ["--eps", "-1"],
        ["--device", "tpu"],
        ["--names", "a,b"],
    ):
        code, _, err = run_cli(capsys, "merge", str(base), *map(str, agents), "--out", str(tmp_path / "o"), *argv)
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (argv, err)
    code, _, err = run_cli(capsys, "merge", str(base))
    assert code == 2 and err.startswith("error: ")
    assert not (tmp_path / "o").exists()


def test_cuda_requested_without_gpu(capsys, tmp_path, models):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    base, agents = models
    code, _, err = run_cli(
        capsys, "merge", str(base), *map(str, agents), "--out", str(tmp_path / "o"), "--device", "cuda"
    )
    assert code == 2 and "no CUDA GPU" in err


def test_warnings_not_errors(capsys, tmp_path, models, caplog):
    """One agent, the same checkpoint twice, an agent identical to the base, mixed dtypes: warned, merged."""
    base, agents = models
    from .reference import load_model

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    save_file({k: v.float() for k, v in load_model(agents[0]).items()}, str(mixed / "model.safetensors"))
    caplog.set_level("WARNING", logger="ram_desktop")
    cases = [
        ([agents[0]], "only one agent"),
        ([agents[0], agents[0]], "same checkpoint"),
        ([agents[0], base], "identical to the base"),
        ([agents[1], mixed], "another dtype"),
    ]
    for i, (chosen, fragment) in enumerate(cases):
        caplog.clear()
        out = tmp_path / f"out{i}"
        code = main(["-q", "merge", str(base), *map(str, chosen), "--out", str(out)])
        capsys.readouterr()
        assert code == 0
        report = json.loads((out / "merge-report.json").read_text())
        assert any(fragment in w for w in report["warnings"]), (fragment, report["warnings"])


def _with_value(src: Path, dst: Path, name: str, index: int | slice, value: float) -> Path:
    """A copy of the model folder ``src`` whose tensor ``name`` holds ``value`` at flat ``index``."""
    from .reference import load_model

    tensors = load_model(src)
    t = tensors[name].clone()
    t.view(-1)[index] = value
    tensors[name] = t
    shutil.copytree(src, dst)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


@pytest.fixture(params=[True, False], ids=["kernels", "torch"])
def kernel_choice(request, monkeypatch):
    """Both merge paths: the fused CPU kernels (forced on for these tiny models) and the torch formulation."""
    from ram_desktop.core.engine import kernels, passes

    if request.param and not kernels.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(passes, "use_kernels", lambda device_type, elements: request.param and device_type == "cpu")
    return request.param


@pytest.mark.parametrize("method", ["ram", "ram-plus", "task-arithmetic", "ties", "dare-ties"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_in_the_base_names_the_base(capsys, tmp_path, models, method, value, kernel_choice):
    base, agents = models
    bad_base = _with_value(base, tmp_path / "badbase", "model.layers.0.mlp.down_proj.weight", 3, value)
    line = assert_refused(
        capsys,
        tmp_path,
        [base.parent, bad_base],
        [str(bad_base), *map(str, agents), "--method", method],
        "model.layers.0.mlp.down_proj.weight",
        "the base",
        "badbase",
    )
    assert not any(a.name in line.replace("badbase", "") for a in agents), line


def test_probe_blames_the_base_for_its_nan(capsys, tmp_path, models):
    base, agents = models
    bad_base = _with_value(base, tmp_path / "badbase", "model.norm.weight", 0, float("nan"))
    code, _, err = run_cli(capsys, "probe", str(bad_base), *map(str, agents))
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "the base" in err, err
    assert "alpha" not in err


@pytest.mark.parametrize("method", ["ram", "ram-plus", "task-arithmetic", "ties", "dare-ties"])
def test_merged_value_beyond_the_output_dtype_is_refused(capsys, tmp_path, models, method, kernel_choice):
    """bfloat16 inputs merged into float16: an agent's weight of 1e6 (fine in bfloat16) cannot be stored,
    and the merge says so instead of writing +Inf."""
    base, agents = models
    # a whole row of them, so that DARE's random drop cannot remove them all
    big = _with_value(agents[0], tmp_path / "big", "model.layers.1.self_attn.q_proj.weight", slice(0, 32), 1e6)
    assert_refused(
        capsys,
        tmp_path,
        [base.parent, big],
        [str(base), str(big), *map(str, agents[1:]), "--method", method, "--out-dtype", "float16"],
        "model.layers.1.self_attn.q_proj.weight",
        method,
        "float16",
    )


def test_task_arithmetic_whose_sum_overflows_is_refused(capsys, tmp_path, models):
    base, agents = models
    name = "model.layers.0.self_attn.v_proj.weight"
    huge = [_with_value(a, tmp_path / f"huge-{a.name}", name, 11, 3e38) for a in agents]
    assert_refused(
        capsys,
        tmp_path,
        [base.parent, *huge],
        [str(base), *map(str, huge), "--method", "task-arithmetic", "--scale", "10", "--out-dtype", "float32"],
        name,
        "task-arithmetic",
        "float32",
    )


def test_merge_into_a_wider_dtype_still_passes_the_range_check(capsys, tmp_path, models):
    base, agents = models
    big = _with_value(agents[0], tmp_path / "big", "model.layers.1.self_attn.q_proj.weight", 7, 1e6)
    code, _, err = run_cli(
        capsys, "merge", str(base), str(big), *map(str, agents[1:]), "--method", "ram", "--out", str(tmp_path / "out")
    )
    assert code == 0, err
