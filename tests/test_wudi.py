"""WUDI merging (docs/methods.md, "WUDI merging") against a plain whole-layer reference of its objective.

The reference is written here from the paper's formula: the objective Σ_t ‖(τ_m − τ_t)τ_tᵀ‖²/‖τ_t‖² in
float64 with its gradient from torch autograd, and Adam written out by hand (β = 0.9, 0.999, ε = 1e-8),
so it shares neither the implementation's closed-form gradient nor its optimiser."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ram_desktop.core import MergeSpec, pipeline
from ram_desktop.core.errors import Cancelled, InputError
from ram_desktop.core.events import Reporter
from ram_desktop.core.methods import METHODS, wudi

from . import reference
from .conftest import make_models
from .subproc import cli, refused

STEPS, LR = 40, 1e-5  # fewer steps than the default 300 keep the tests short; the optimiser is the same


def objective(merged: torch.Tensor, taus: list[torch.Tensor]) -> float:
    """Σ_t ‖(τ_m − τ_t)τ_tᵀ‖_F² / ‖τ_t‖_F² in float64 (an agent with τ_t = 0 contributes 0)."""
    m = merged.double()
    total = torch.zeros((), dtype=torch.float64)
    for t in taus:
        t = t.double()
        norm2 = (t * t).sum()
        if norm2 > 0:
            total = total + (((m - t) @ t.T) ** 2).sum() / norm2
    return float(total)


def reference_wudi(taus: list[torch.Tensor], steps: int, lr: float) -> torch.Tensor:
    """Adam by hand on the objective, gradient by autograd, float64, from Σ_t τ_t."""
    ts = [t.double() for t in taus]
    p = sum(ts[1:], ts[0].clone()).clone()
    m1, m2 = torch.zeros_like(p), torch.zeros_like(p)
    b1, b2, eps = 0.9, 0.999, 1e-8
    for k in range(1, steps + 1):
        x = p.clone().requires_grad_(True)
        loss = sum(((((x - t) @ t.T) ** 2).sum() / (t * t).sum()) for t in ts if (t * t).sum() > 0)
        (g,) = torch.autograd.grad(loss, x)
        m1 = b1 * m1 + (1 - b1) * g
        m2 = b2 * m2 + (1 - b2) * g * g
        p = p - lr * (m1 / (1 - b1**k)) / ((m2 / (1 - b2**k)).sqrt() + eps)
    return p


def sparse_taus(n: int, rows: int, cols: int, seed: int) -> torch.Tensor:
    """RL-like task vectors: a few percent to a half of the elements moved by about 1e-3."""
    gen = torch.Generator().manual_seed(seed)
    density = torch.tensor([0.5, 0.3, 0.05][:n]).view(n, 1, 1)
    moved = torch.rand((n, rows, cols), generator=gen) < density
    return torch.where(moved, torch.randn((n, rows, cols), generator=gen) * 1e-3, 0.0).float()


@pytest.mark.parametrize("shape", [(24, 16), (12, 40)])
def test_layer_lowers_the_objective_like_the_reference_optimiser(shape):
    taus = sparse_taus(3, *shape, seed=sum(shape))
    steps, lr = 300, 1e-5  # the paper's defaults
    ours = wudi.wudi_layer(taus.clone(), steps, lr)
    ref = reference_wudi(list(taus), steps, lr)
    start = taus.double().sum(0)
    assert ours.dtype == torch.float32 and ours.shape == shape
    assert objective(ours, list(taus)) < 0.9 * objective(start, list(taus))
    assert objective(ours, list(taus)) == pytest.approx(objective(ref, list(taus)), rel=1e-4)
    moved = float((ref - start).abs().max())
    assert moved > 0.5 * steps * lr  # the optimiser travelled far from the initialisation
    assert float((ours.double() - ref).abs().max()) < 1e-4 * moved


def test_an_agent_that_left_the_layer_alone_adds_nothing():
    taus = sparse_taus(2, 20, 12, seed=3)
    with_idle = torch.cat([taus[:1], torch.zeros_like(taus[:1]), taus[1:]])
    assert torch.equal(wudi.wudi_layer(with_idle, STEPS, LR), wudi.wudi_layer(taus, STEPS, LR))
    assert torch.equal(wudi.wudi_layer(torch.zeros(2, 5, 4), STEPS, LR), torch.zeros(5, 4))


def test_zero_steps_keep_the_task_arithmetic_sum():
    taus = sparse_taus(3, 8, 6, seed=5)
    assert torch.equal(wudi.wudi_layer(taus, 0, LR), taus[0] + taus[1] + taus[2])


def _merge(base: Path, agents: list[Path], out: Path, chunk_elements: int = 1 << 19, **params) -> pipeline.MergeResult:
    return pipeline.merge(
        pipeline.MergeSpec.build(
            str(base),
            [str(a) for a in agents],
            out,
            "wudi",
            {"steps": STEPS, "lr": LR, **params},
            device="cpu",
            out_dtype="float32",
        ),
        Reporter(),
        options=pipeline.RunOptions(use_cache=False, chunk_elements=chunk_elements),
    )


def test_merge_equals_the_whole_layer_reference(models, tmp_path):
    """Linear layers: base + the reference optimiser's τ_m (float32 rounding apart); every other tensor: the
    mean of τ exactly; slices of a layer (small chunks) give the same bits as whole layers."""
    base, agents = models
    whole = _merge(base, agents, tmp_path / "whole")
    _merge(base, agents, tmp_path / "sliced", chunk_elements=100)  # 3 rows of 32 per chunk
    b = reference.load_model(base)
    a = [reference.load_model(p) for p in agents]
    merged = reference.load_model(tmp_path / "whole")
    again = reference.load_model(tmp_path / "sliced")
    tv = reference.task_vectors(b, a)
    linear = [n for n, t in b.items() if t.ndim == 2 and "embed_tokens" not in n]
    assert len(linear) == 15  # 2 layers × (q, k, v, o, gate, up, down) + lm_head
    for name, t in b.items():
        assert torch.equal(merged[name], again[name]), name
        bn, taus = tv[name]
        if name in linear:
            layer = [torch.from_numpy(x.reshape(t.shape)) for x in taus]
            ref = reference_wudi(layer, STEPS, LR)
            got = merged[name].double() - torch.from_numpy(bn.reshape(t.shape)).double()
            assert float((got - ref).abs().max()) < 1e-6 * max(1.0, float(ref.abs().max())) + 1e-9, name
            assert objective(got, layer) < objective(sum(layer), layer), name
        else:
            expected = bn + reference.average_tau(taus)
            assert np.array_equal(merged[name].numpy().reshape(-1), expected.astype(np.float32)), name
    assert whole.report["method"] == "wudi" and whole.report["method_params"] == {"steps": STEPS, "lr": LR}
    recipe = MergeSpec.load(tmp_path / "whole" / "ram-recipe.yaml")
    assert (recipe.method, recipe.params) == ("wudi", {"steps": STEPS, "lr": LR})
    assert MergeSpec.from_dict(yaml.safe_load(recipe.to_yaml())).params == {"steps": STEPS, "lr": LR}


def test_cancel_between_layers_with_progress_after_each(models, tmp_path, monkeypatch):
    """Every layer's optimisation is followed by a merge progress event (where the cancel is checked); a
    cancel after the first layer stops the merge before the next one and writes nothing."""
    base, agents = models
    events: list[str] = []
    optimise = wudi.wudi_layer

    def counted(taus, steps, lr, cancel=None):
        events.append("layer")
        return optimise(taus, steps, lr, cancel)

    monkeypatch.setattr(wudi, "wudi_layer", counted)
    reporter = Reporter(lambda e: events.append("progress") if e.stage == "merge" and e.done else None)
    out = tmp_path / "all"
    pipeline.merge(
        pipeline.MergeSpec.build(str(base), [str(a) for a in agents], out, "wudi", {"steps": 2}, device="cpu"),
        reporter,
        options=pipeline.RunOptions(use_cache=False),
    )
    layers = [i for i, e in enumerate(events) if e == "layer"]
    assert len(layers) == 15
    assert all("progress" in events[i + 1 : j] for i, j in itertools.pairwise(layers))

    events.clear()
    cancelling = Reporter()

    def cancel_after_first_layer(e) -> None:
        if e.stage == "merge" and "layer" in events:
            cancelling.cancel.cancel()

    cancelling._on_progress = cancel_after_first_layer
    out = tmp_path / "cancelled"
    with pytest.raises(Cancelled):
        pipeline.merge(
            pipeline.MergeSpec.build(str(base), [str(a) for a in agents], out, "wudi", {"steps": 2}, device="cpu"),
            cancelling,
            options=pipeline.RunOptions(use_cache=False),
        )
    assert events.count("layer") == 1
    assert not out.exists() and not list(tmp_path.glob("cancelled.partial-*"))


def test_cancel_inside_a_layer_stops_its_optimisation(models, tmp_path):
    """A cancel while a layer is being optimised stops it at the next step (issue 47: a WUDI merge cancelled at
    0.6 s stopped at 4.1 s, after its layer). 100,000 steps per layer take minutes: the merge must end with
    Cancelled as soon as the token is set from another thread, with nothing written."""
    import threading

    base, agents = models
    cancelling = Reporter()
    started = threading.Event()
    cancelling._on_progress = lambda e: started.set() if e.stage == "merge" else None
    out = tmp_path / "cancelled"
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.merge(
                pipeline.MergeSpec.build(str(base), [str(a) for a in agents], out, "wudi", {"steps": 100000}),
                cancelling,
                options=pipeline.RunOptions(use_cache=False),
            )
        except BaseException as e:  # noqa: BLE001 — the outcome is what this test reads
            outcome.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(60)
    cancelling.cancel.cancel()
    worker.join(120)
    assert not worker.is_alive() and len(outcome) == 1 and isinstance(outcome[0], Cancelled), outcome
    assert not out.exists() and not list(tmp_path.glob("cancelled.partial-*"))


def test_cli_merge_in_a_fresh_process_loads_with_transformers(models, tmp_path):
    from transformers import AutoModelForCausalLM

    base, agents = models
    out = tmp_path / "merged"
    done = cli(
        tmp_path,
        "merge",
        str(base),
        *map(str, agents),
        "--out",
        str(out),
        "--method",
        "wudi",
        "--steps",
        "5",
        "--lr",
        "2e-5",
        "--device",
        "cpu",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "merge-report.json").read_text())
    assert report["method"] == "wudi" and report["method_params"] == {"steps": 5, "lr": 2e-5}
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert sum(p.numel() for p in model.parameters()) > 0
    assert "Cheng et al." in (out / "README.md").read_text()


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--steps", "-1"], "--steps must be at least 0"),
        (["--lr", "0"], "--lr must be at least"),
        (["--lr", "nan"], "--lr must be a finite number"),
        (["--lr", "2"], "--lr must be at most 1.0"),
    ],
)
def test_bad_parameters_are_refused(models, tmp_path, flags, fragment):
    base, agents = models
    out = tmp_path / "out"
    done = cli(tmp_path, "merge", str(base), *map(str, agents), "--out", str(out), "--method", "wudi", *flags)
    refused(done, fragment)
    assert not out.exists()


def test_a_non_integer_step_count_is_refused(tmp_path, models):
    base, agents = models
    done = cli(
        tmp_path,
        "merge",
        str(base),
        *map(str, agents),
        "--out",
        str(tmp_path / "o"),
        "--method",
        "wudi",
        "--steps",
        "1.5",
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr and "--steps" in done.stderr
    with pytest.raises(InputError, match="--steps must be a int"):
        METHODS["wudi"].resolve({"steps": 1.5})


def test_compare_includes_it_beside_another_method(tmp_path, capsys):
    """``ram-merge compare`` with a WUDI variant and task arithmetic: one read of the inputs, both written,
    WUDI's output the same bits as its own merge."""
    from ram_desktop.cli import main

    base, agents = make_models(tmp_path / "in")
    out = tmp_path / "cmp"
    code = main(
        [
            "-q",
            "compare",
            str(base),
            *map(str, agents),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--out-dtype",
            "float32",
            "--variant",
            f"wudi:steps={STEPS},name=w",
            "--variant",
            "task-arithmetic",
        ]
    )
    assert code == 0, capsys.readouterr().err
    compared = json.loads((out / "compare.json").read_text())
    assert [v["method"] for v in compared["variants"]] == ["wudi", "task-arithmetic"]
    _merge(base, agents, tmp_path / "alone")
    together, alone = reference.load_model(out / "w"), reference.load_model(tmp_path / "alone")
    assert all(torch.equal(together[n], alone[n]) for n in alone)


def test_schema_reaches_the_faces(capsys):
    """The generic checks every method passes (tests/test_method_registry.py): CLI flags and help, the
    GUI form's fields, the comparison's default sweep; no would-keep chart, no mergekit mapping."""
    from ram_desktop.cli import build_parser, main
    from ram_desktop.core.ecosystem.mergekit import to_mergekit
    from ram_desktop.core.methods.would_keep import keep_methods

    args = build_parser().parse_args(
        ["merge", "b", "a", "--out", "o", "--method", "wudi", "--steps", "7", "--lr", "3e-5"]
    )
    assert (args.method, args.param_steps, args.param_lr) == ("wudi", 7, 3e-5)
    with pytest.raises(SystemExit):
        main(["merge", "--help"])
    text = capsys.readouterr().out
    assert "wudi" in text and "--steps" in text and "Adam learning rate" in text
    assert "wudi" not in keep_methods()
    with pytest.raises(InputError, match="method wudi has no mergekit equivalent"):
        to_mergekit(MergeSpec.build("base", ["a1", "a2"], method="wudi", params={"steps": 300, "lr": 1e-5}))


def test_gui_form_and_comparison_row(qtbot):
    pytest.importorskip("PySide6")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from ram_desktop.gui.evaluate.compare_panel import MethodRow
    from ram_desktop.gui.method.panel import MethodPanel

    panel = MethodPanel()
    qtbot.addWidget(panel)
    panel.set_method("wudi", {"steps": 12, "lr": 2e-5})
    assert panel.current is METHODS["wudi"]
    assert set(panel.fields) == {"steps", "lr"} and panel.params() == {"steps": 12, "lr": 2e-5}
    row = MethodRow("wudi")
    qtbot.addWidget(row.check)
    assert row.param.currentData() == "steps" and row.values.text() == "300"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_path_matches_the_cpu_path(models, tmp_path):
    """``--device cuda``: the same reads, transfer and optimisation on the GPU; the products' summation order
    is cuBLAS's, so τ_m agrees with the CPU's to float32 rounding (TF32 stays off: torch's default)."""
    base, agents = models
    _merge(base, agents, tmp_path / "cpu")
    pipeline.merge(
        pipeline.MergeSpec.build(
            str(base),
            [str(a) for a in agents],
            tmp_path / "gpu",
            "wudi",
            {"steps": STEPS, "lr": LR},
            device="cuda",
            out_dtype="float32",
        ),
        Reporter(),
        options=pipeline.RunOptions(use_cache=False),
    )
    cpu, gpu = reference.load_model(tmp_path / "cpu"), reference.load_model(tmp_path / "gpu")
    b = reference.load_model(base)
    for name, t in b.items():
        moved = float((cpu[name].double() - t.double()).abs().max())
        assert float((gpu[name].double() - cpu[name].double()).abs().max()) <= 1e-5 * moved + 1e-7, name
