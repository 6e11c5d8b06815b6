"""Fisher merging (SPEC.md section 7) against a whole-tensor numpy reference written here, and its bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ram_desktop.core import MergeSpec, RunOptions
from ram_desktop.core.pipeline import merge

from .conftest import make_models
from .reference import load_model
from .test_bad_input import assert_refused


def write_fisher(folder: Path, tensors: dict[str, torch.Tensor], shards: int = 1) -> Path:
    """A Fisher folder as ``ram-merge fisher`` lays it out, written here with safetensors directly."""
    folder.mkdir(parents=True)
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(folder / "fisher.safetensors"))
        return folder
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        file = f"fisher-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(folder / file))
        weight_map.update({n: file for n in part})
    (folder / "fisher.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def random_fishers(agents: list[Path], root: Path, shards: int = 1) -> tuple[list[Path], list[dict]]:
    """Non-negative F per agent with exact zeros: some elements zero for every agent (the fallback) and
    one whole tensor zero for every agent."""
    agent_tensors = [load_model(a) for a in agents]
    names = sorted(n for n, t in agent_tensors[0].items() if t.is_floating_point())
    zero_everywhere = {
        n: torch.rand(agent_tensors[0][n].shape, generator=torch.Generator().manual_seed(99)) < 0.3 for n in names
    }
    fishers = []
    for t in range(len(agents)):
        g = torch.Generator().manual_seed(t)
        f = {}
        for n in names:
            values = torch.rand(agent_tensors[t][n].shape, generator=g) ** 3 * 10.0 ** (t - 2)
            values[torch.rand(values.shape, generator=g) < 0.2] = 0.0  # zero for this agent only
            values[zero_everywhere[n]] = 0.0
            if n == names[0]:
                values.zero_()
            f[n] = values.to(torch.float32)
        fishers.append(f)
    folders = [write_fisher(root / f"fisher{t}", f, shards) for t, f in enumerate(fishers)]
    return folders, fishers


def reference_fisher(base: dict, agents: list[dict], fishers: list[dict], scale: float) -> dict[str, np.ndarray]:
    """SPEC 7 on whole tensors in float32: λ·((Σ_t F_t·τ_t)/(Σ_t F_t)), λ·mean_t τ_t where Σ_t F_t = 0."""
    out = {}
    for name, b in base.items():
        if not b.is_floating_point():
            continue
        bn = b.to(torch.float32).numpy()
        taus = [a[name].to(torch.float32).numpy() - bn for a in agents]
        fs = [f[name].numpy() for f in fishers]
        num = np.zeros_like(bn)
        den = np.zeros_like(bn)
        tau_sum = np.zeros_like(bn)
        for tau, f in zip(taus, fs):
            num = num + f * tau
            den = den + f
            tau_sum = tau_sum + tau
        with np.errstate(divide="ignore", invalid="ignore"):
            weighted = num / den
        mean = tau_sum / np.float32(len(agents))
        merged = np.where(den > 0, weighted, mean) * np.float32(scale)
        out[name] = bn + merged
    return out


@pytest.mark.parametrize("shards,out_dtype,chunk", [(1, "float32", 7), (3, "float32", 1000), (3, "base", 1 << 22)])
def test_merge_equals_reference(tmp_path, shards, out_dtype, chunk):
    base_dir, agent_dirs = make_models(tmp_path / "in", shards=shards)
    folders, fishers = random_fishers(agent_dirs, tmp_path, shards)
    scale = 0.7
    request = MergeSpec.build(
        str(base_dir),
        [str(a) for a in agent_dirs],
        tmp_path / "out",
        "fisher",
        {"fisher": [str(f) for f in folders], "scale": scale},
        out_dtype=out_dtype,
    )
    merge(request, options=RunOptions(chunk_elements=chunk))
    base = load_model(base_dir)
    expected = reference_fisher(base, [load_model(a) for a in agent_dirs], fishers, scale)
    got = load_model(tmp_path / "out")
    fallback = 0
    for name, value in expected.items():
        want = torch.from_numpy(value).to(base[name].dtype if out_dtype == "base" else torch.float32)
        assert torch.equal(got[name], want), name
        fallback += int(sum(f[name] for f in fishers).eq(0).sum())
    assert fallback > 1000  # the Σ F = 0 branch is exercised (a whole tensor and ~30 % of the rest)
    for name, t in base.items():
        if not t.is_floating_point():
            assert torch.equal(got[name], t)
    report = json.loads((tmp_path / "out" / "merge-report.json").read_text())
    assert report["method"] == "fisher" and report["method_params"]["scale"] == scale


def test_fisher_weighting_is_not_the_mean(tmp_path):
    """With F concentrated on one agent the merge follows that agent: the test above could not tell a
    weighted average from a plain one if F were ignored."""
    base_dir, agent_dirs = make_models(tmp_path / "in")
    agents = [load_model(a) for a in agent_dirs]
    names = [n for n, t in agents[0].items() if t.is_floating_point()]
    fishers = [{n: torch.full(agents[t][n].shape, 1.0 if t == 1 else 0.0) for n in names} for t in range(3)]
    folders = [write_fisher(tmp_path / f"f{t}", f) for t, f in enumerate(fishers)]
    merge(
        MergeSpec.build(
            str(base_dir),
            [str(a) for a in agent_dirs],
            tmp_path / "out",
            "fisher",
            {"fisher": [str(f) for f in folders], "scale": 1.0},
            out_dtype="float32",
        )
    )
    got = load_model(tmp_path / "out")
    for n in names:
        assert torch.equal(got[n], agents[1][n].to(torch.float32)), n


# --- bad inputs ----------------------------------------------------------------------------------


@pytest.fixture
def fisher_inputs(tmp_path):
    base_dir, agent_dirs = make_models(tmp_path / "in")
    folders, _ = random_fishers(agent_dirs, tmp_path / "in")
    return base_dir, agent_dirs, folders


def _argv(base, agents, *more):
    return [str(base), *map(str, agents), "--method", "fisher", *more]


def test_neither_fisher_nor_suite(capsys, tmp_path, fisher_inputs):
    base, agents, _ = fisher_inputs
    assert_refused(capsys, tmp_path, [tmp_path / "in"], _argv(base, agents), "--fisher-suite", "--fisher")


def test_fisher_count_differs_from_agents(capsys, tmp_path, fisher_inputs):
    base, agents, folders = fisher_inputs
    assert_refused(
        capsys,
        tmp_path,
        [tmp_path / "in"],
        _argv(base, agents, "--fisher", ",".join(map(str, folders[:2]))),
        "--fisher: 2 values for 3 agents",
    )


def test_suite_count_differs_from_agents(capsys, tmp_path, fisher_inputs):
    base, agents, _ = fisher_inputs
    suite = tmp_path / "in" / "s.jsonl"
    suite.write_text('{"prompt": "hi", "answer": "x"}\n')
    assert_refused(
        capsys,
        tmp_path,
        [tmp_path / "in"],
        _argv(base, agents, "--fisher-suite", f"{suite},{suite}"),
        "--fisher-suite: 2 values for 3 agents",
    )


def test_missing_suite(capsys, tmp_path, fisher_inputs):
    base, agents, _ = fisher_inputs
    missing = tmp_path / "nowhere" / "suite.jsonl"
    assert_refused(
        capsys,
        tmp_path,
        [tmp_path / "in"],
        _argv(base, agents, "--fisher-suite", ",".join([str(missing)] * 3)),
        str(missing),
    )


def test_missing_fisher_folder(capsys, tmp_path, fisher_inputs):
    base, agents, folders = fisher_inputs
    missing = tmp_path / "nofisher"
    assert_refused(
        capsys,
        tmp_path,
        [tmp_path / "in"],
        _argv(base, agents, "--fisher", ",".join(map(str, [folders[0], missing, folders[2]]))),
        str(missing),
        "ram-merge fisher",
    )


def test_fisher_lacks_a_tensor(capsys, tmp_path, fisher_inputs):
    base, agents, folders = fisher_inputs
    file = folders[1] / "fisher.safetensors"
    tensors = load_file(str(file))
    dropped = sorted(tensors)[3]
    del tensors[dropped]
    save_file(tensors, str(file))
    assert_refused(
        capsys,
        tmp_path,
        [tmp_path / "in"],
        _argv(base, agents, "--fisher", ",".join(map(str, folders))),
        str(folders[1]),
        "lacks",
        dropped,
        "'beta'",
    )


def test_fisher_has_a_foreign_tensor(capsys, tmp_path, fisher_inputs):
    base, agents, folders = fisher_inputs
    file = folders[0] / "fisher.safetensors"
    tensors = load_file(str(file))
    tensors["model.extra.weight"] = torch.zeros(3)
    save_file(tensors, str(file))
    assert_refused(
        capsys,
        tmp_path,
        [tmp_path / "in"],
        _argv(base, agents, "--fisher", ",".join(map(str, folders))),
        "model.extra.weight",
        "does not",
    )


def test_fisher_shape_differs(capsys, tmp_path, fisher_inputs):
    base, agents, folders = fisher_inputs
    file = folders[2] / "fisher.safetensors"
    tensors = load_file(str(file))
    name = "model.layers.0.mlp.down_proj.weight"
    shape = list(tensors[name].shape)
    tensors[name] = torch.zeros(shape[0], shape[1] + 1)
    save_file(tensors, str(file))
    assert_refused(
        capsys,
        tmp_path,
        [tmp_path / "in"],
        _argv(base, agents, "--fisher", ",".join(map(str, folders))),
        name,
        str([shape[0], shape[1] + 1]),
        str(shape),
    )


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_fisher_value_not_a_fisher(capsys, tmp_path, fisher_inputs, value):
    base, agents, folders = fisher_inputs
    file = folders[1] / "fisher.safetensors"
    tensors = load_file(str(file))
    name = "model.layers.1.self_attn.q_proj.weight"
    tensors[name].view(-1)[5] = value
    save_file(tensors, str(file))
    assert_refused(
        capsys,
        tmp_path,
        [tmp_path / "in"],
        _argv(base, agents, "--fisher", ",".join(map(str, folders))),
        str(folders[1]),
        name,
    )


def test_compare_fisher_variants_equal_separate_merges(tmp_path, capsys):
    """``compare`` takes --fisher (and --scale) as shared values for its fisher variants; each variant's
    weights are those of a separate merge."""
    from ram_desktop.cli import main

    base_dir, agent_dirs = make_models(tmp_path / "in")
    folders, _ = random_fishers(agent_dirs, tmp_path)
    fisher_flag = ",".join(map(str, folders))
    argv = [str(base_dir), *map(str, agent_dirs), "--fisher", fisher_flag, "--out-dtype", "float32"]
    assert (
        main(
            [
                "-q",
                "compare",
                *argv,
                "--out",
                str(tmp_path / "cmp"),
                "--scale",
                "0.6",
                "--variant",
                "fisher",
                "--variant",
                "fisher:scale=0.25,name=quarter",
                "--variant",
                "ram",
            ]
        )
        == 0
    ), capsys.readouterr().err
    for name, scale in (("fisher", "0.6"), ("quarter", "0.25")):
        assert main(["-q", "merge", *argv, "--method", "fisher", "--scale", scale, "--out", str(tmp_path / name)]) == 0
        assert (tmp_path / "cmp" / name / "model.safetensors").read_bytes() == (
            tmp_path / name / "model.safetensors"
        ).read_bytes()
