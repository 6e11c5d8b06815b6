"""``ram-merge compare``: every variant from one read of the inputs, each folder byte-identical to a
separate ``merge``; with suites, the same scores as a separate ``ram-merge eval``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ram_desktop.cli import main
from ram_desktop.core.engine import chunks

from .conftest import tree_snapshot

VARIANTS = [
    "ram-plus:r=0.2,alpha=1.0",
    "ties:density=0.3,ties_scope=model,name=ties-model",
    "dare-ties:drop=0.4,seed=9",
]
SEPARATE = [
    ["--method", "ram-plus", "--r", "0.2", "--alpha", "1.0"],
    ["--method", "ties", "--density", "0.3", "--ties-scope", "model"],
    ["--method", "dare-ties", "--drop", "0.4", "--seed", "9"],
]
FOLDERS = ["ram-plus_r=0.2_alpha=1.0", "ties-model", "dare-ties_drop=0.4_seed=9"]


def weights(folder: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(folder.iterdir())
        if p.name.endswith(".safetensors") or p.name.endswith(".index.json")
    }


def count_reads(monkeypatch) -> dict[str, int]:
    """Bytes the streaming reader reads, counted at the reader itself."""
    counter = {"bytes": 0}
    real = chunks.SliceReader.read

    def read(self, file, name, span, shape):
        data = real(self, file, name, span, shape)
        counter["bytes"] += data.nbytes if isinstance(data, np.ndarray) else data.numel() * data.element_size()
        return data

    monkeypatch.setattr(chunks.SliceReader, "read", read)
    return counter


def test_three_variants_equal_three_merges_and_read_the_inputs_once(tmp_path, sharded_models, monkeypatch, capsys):
    base, agents = sharded_models
    inputs = [base, *agents]
    before = tree_snapshot(*inputs)
    counter = count_reads(monkeypatch)
    argv = [
        "-q",
        "compare",
        str(base),
        *map(str, agents),
        "--out",
        str(tmp_path / "cmp"),
        "--out-dtype",
        "float32",
        "--shard-size",
        "30KB",
    ]
    for v in VARIANTS:
        argv += ["--variant", v]
    assert main(argv) == 0, capsys.readouterr().err
    compare_reads = counter["bytes"]
    input_bytes = sum(f.stat().st_size for d in inputs for f in d.glob("*.safetensors"))
    # ram-plus needs the probe and ties its cut (two refinement passes over float32 keys read the data
    # again): one pass for all statistics, the refinement passes, and one merge pass for all three variants
    separate_reads = 0
    for flags, folder in zip(SEPARATE, FOLDERS):
        counter["bytes"] = 0
        out = tmp_path / "separate" / folder
        assert (
            main(
                [
                    "-q",
                    "merge",
                    str(base),
                    *map(str, agents),
                    "--out",
                    str(out),
                    "--out-dtype",
                    "float32",
                    "--shard-size",
                    "30KB",
                    *flags,
                ]
            )
            == 0
        )
        separate_reads += counter["bytes"]
        assert weights(tmp_path / "cmp" / folder) == weights(out)
        assert len(weights(out)) > 2
        for name in ("config.json", "README.md", "ram-recipe.yaml", "merge-report.json"):
            assert (tmp_path / "cmp" / folder / name).is_file()
    data_bytes = input_bytes - sum(
        8 + int.from_bytes(f.read_bytes()[:8], "little") for d in inputs for f in d.glob("*.safetensors")
    )  # headers are not tensor data
    # the merge pass reads everything once for all variants (the statistics passes are shared too)
    assert compare_reads < separate_reads
    passes = compare_reads / data_bytes
    assert passes <= 4.01, passes  # probe + 2 TIES refinements + 1 merge pass, however many variants
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [v["name"] for v in data["variants"]] == FOLDERS
    assert data["variants"][0] == {"name": FOLDERS[0], "method": "ram-plus", "params": {"r": 0.2, "alpha": 1.0}}
    assert data["variants"][2]["params"] == {"drop": 0.4, "seed": 9, "scale": 1.0}
    assert tree_snapshot(*inputs) == before


def test_a_compare_of_merge_only_variants_reads_the_data_once(tmp_path, models, monkeypatch):
    base, agents = models
    counter = count_reads(monkeypatch)
    argv = ["-q", "compare", str(base), *map(str, agents), "--out", str(tmp_path / "cmp")]
    for v in ("ram", "average", "task-arithmetic:scale=0.5", "dare-ta:drop=0.2"):
        argv += ["--variant", v]
    assert main(argv) == 0
    tensor_bytes = 0
    for d in [base, *agents]:
        for f in d.glob("*.safetensors"):
            with safe_open(str(f), framework="pt") as h:
                tensor_bytes += sum(h.get_tensor(k).numel() * h.get_tensor(k).element_size() for k in h.keys())  # noqa: SIM118 — safe_open is not iterable
    assert counter["bytes"] == tensor_bytes  # four variants, one read of every input byte


def test_ram_family_variants_merge_in_one_kernel_call_with_the_bytes_of_separate_merges(
    tmp_path, models, monkeypatch, capsys
):
    """RAM, RAM+ and RAM+s in one compare go through the family's group kernel together (one call per chunk for
    the three), each folder's weights byte-identical to a separate merge of that method."""
    from ram_desktop.core.methods import ram

    base, agents = models
    calls = {"group": 0, "one": 0}
    group, one = ram.selective_merge_group, ram.selective_merge_into
    monkeypatch.setattr(
        ram, "selective_merge_group", lambda *a: calls.__setitem__("group", calls["group"] + 1) or group(*a)
    )
    monkeypatch.setattr(ram, "selective_merge_into", lambda *a: calls.__setitem__("one", calls["one"] + 1) or one(*a))
    variants = {  # variant → (its folder, the separate merge's flags)
        "ram": ("ram", ["--method", "ram"]),
        "ram-plus:r=0.3": ("ram-plus_r=0.3", ["--method", "ram-plus", "--r", "0.3"]),
        "ram-plus-soft": ("ram-plus-soft", ["--method", "ram-plus-soft"]),
    }
    argv = ["-q", "compare", str(base), *map(str, agents), "--out", str(tmp_path / "cmp")]
    for v in variants:
        argv += ["--variant", v]
    assert main(argv) == 0, capsys.readouterr().err
    assert calls["group"] > 0 and calls["one"] == 0, calls
    monkeypatch.undo()
    assert {p.name for p in (tmp_path / "cmp").iterdir() if p.is_dir()} == {f for f, _ in variants.values()}
    for folder, flags in variants.values():
        out = tmp_path / "separate" / folder
        assert main(["-q", "merge", str(base), *map(str, agents), "--out", str(out), *flags]) == 0
        assert weights(out) and weights(tmp_path / "cmp" / folder) == weights(out), folder


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--variant", "nope"], "unknown method"),
        (["--variant", "ram-plus:r"], "is not key=value"),
        (["--variant", "ram-plus:q=1"], "takes no parameter q"),
        (["--variant", "ram-plus:r=abc"], "--r must be a float"),
        (["--variant", "ram", "--variant", "ram"], "two variants are named 'ram'"),
        (["--variant", "ram", "--suite", "/nowhere/suite.jsonl"], "/nowhere/suite.jsonl"),
    ],
)
def test_bad_variants_and_suites_are_refused_before_anything_is_written(tmp_path, models, capsys, argv, fragment):
    base, agents = models
    code = main(["-q", "compare", str(base), *map(str, agents), "--out", str(tmp_path / "cmp"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert fragment in err
    assert not (tmp_path / "cmp").exists()


def _tiny_agents(folder: Path) -> tuple[Path, list[Path]]:
    """A tiny transformers model as the base and two agents that move a few of its weights."""
    from .tinylm import write_tiny_lm

    base = write_tiny_lm(folder / "base", chat_template=False)
    agents = []
    for k, name in enumerate(("left", "right")):
        agent = folder / name
        shutil.copytree(base, agent)
        weights_file = agent / "model.safetensors"
        with safe_open(str(weights_file), framework="pt") as f:
            tensors = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118 — safe_open is not iterable
        gen = torch.Generator().manual_seed(k)
        for n in sorted(tensors)[k::3]:
            t = tensors[n]
            if t.is_floating_point():
                tensors[n] = t + 0.3 * torch.randn(t.shape, generator=gen) * (torch.rand(t.shape, generator=gen) < 0.3)
        save_file(tensors, str(weights_file), metadata={"format": "pt"})
        agents.append(agent)
    return base, agents


def test_compare_with_suites_scores_like_a_separate_eval(tmp_path, capsys):
    base, agents = _tiny_agents(tmp_path / "in")
    suite = tmp_path / "suite.jsonl"
    suite.write_text(
        "".join(
            json.dumps({"prompt": p, "answer": a}) + "\n"
            for p, a in [
                ("What is 2 + 3?", "5"),
                ("Say hello", "hello"),
                ("def add(a, b):", "return"),
                ("Remember the number 42", "42"),
            ]
        )
    )
    (tmp_path / "suite.yaml").write_text("name: toy\nscorer: contains\nmax_new_tokens: 6\n")
    (tmp_path / "two").mkdir()
    second = tmp_path / "two" / "data.jsonl"
    second.write_text(json.dumps({"prompt": "What is 2 + 3?", "answer": "5"}) + "\n")
    (tmp_path / "two" / "suite.yaml").write_text("name: two\nscorer: contains\nmax_new_tokens: 4\n")
    out = tmp_path / "cmp"
    code = main(
        [
            "-q",
            "compare",
            str(base),
            *map(str, agents),
            "--out",
            str(out),
            "--variant",
            "ram",
            "--variant",
            "task-arithmetic:scale=1.0,name=ta",
            "--suite",
            str(suite),
            str(tmp_path / "two"),
            "--device",
            "cpu",
            "--out-dtype",
            "float32",
        ]
    )  # --suite A B
    assert code == 0, capsys.readouterr().err
    data = json.loads((out / "compare.json").read_text())
    assert data["format"] == "ram-eval/2"
    assert [m["name"] for m in data["models"]] == ["base", "left", "right", "ram", "ta"]
    assert [s["name"] for s in data["suites"]] == ["toy", "two"]
    separate = tmp_path / "eval.json"
    assert (
        main(
            [
                "-q",
                "eval",
                str(base),
                *map(str, agents),
                str(out / "ram"),
                str(out / "ta"),
                "--suite",
                str(suite),
                "--suite",
                str(tmp_path / "two"),
                "--json",
                str(separate),
                "--device",
                "cpu",
            ]
        )
        == 0
    )  # --suite A --suite B
    alone = json.loads(separate.read_text())
    for key in ("scores", "per_example", "intervals", "differences", "at_floor", "suites"):
        assert alone[key] == data[key], key
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
