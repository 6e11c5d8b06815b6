"""Search trials merged in memory (``pipeline.InMemory``, ``output.MemoryShards``): the tensors kept are the written
merge's, bit for bit (plain, sharded, a rebuilt vocabulary); a search scores the same with trials in memory as with
trials written to folders; and no trial is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ram_desktop.core import InMemory, MergeSpec, merge_variants
from tests.subproc import cli
from tests.synthetic import write_synthetic
from tests.tinylm import write_tokens_lm

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, list[Path]]:
    return write_synthetic(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A base and two agents whose vocabularies differ (the union vocabulary is rebuilt)."""
    root = tmp_path_factory.mktemp("vocab")
    base = write_tokens_lm(root / "base", [], [], TEMPLATE, 0)
    tool = write_tokens_lm(root / "tool", ["<tool_call>", "</tool_call>"], [], TEMPLATE, 1)
    think = write_tokens_lm(root / "think", [], ["<think>"], TEMPLATE, 2)
    return base, tool, think


def _written(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(f))
    return tensors


def _same_bits(kept: dict[str, torch.Tensor], written: dict[str, torch.Tensor]) -> None:
    assert sorted(kept) == sorted(written)
    for name, w in written.items():
        k = kept[name]
        assert k.dtype == w.dtype and k.shape == w.shape, name
        assert torch.equal(k.contiguous().view(torch.uint8), w.contiguous().view(torch.uint8)), name


CASES = {
    # method, parameters, spec fields beyond them
    "ram-plus": ("ram-plus", {}, {}),
    "ties sharded": ("ties", {"density": 0.3}, {"shard_size": "200KB"}),
    "task-arithmetic fp16": ("task-arithmetic", {"scale": 0.7}, {"out_dtype": "float16"}),
    "della": ("della", {}, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_in_memory_merge_holds_the_written_merges_bytes(synthetic, tmp_path, case):
    method, params, extra = CASES[case]
    base, agents = synthetic
    spec = MergeSpec.build(str(base), [str(a) for a in agents], method=method, params=params, **extra)
    recipe = tmp_path / "recipe.yaml"
    spec.replace(output=str(tmp_path / "written")).save(recipe)
    done = cli(tmp_path, "run", str(recipe))
    assert done.returncode == 0, done.stderr
    written = _written(tmp_path / "written")
    if "sharded" in case:
        assert len(list((tmp_path / "written").glob("*.safetensors"))) > 1
    frame = tmp_path / "frame"
    frame.mkdir()
    # two variants from one read, as a search's workers merge them: the second is the same spec again
    specs = [spec.replace(output=str(tmp_path / "never" / n)) for n in ("a", "b")]
    kept = merge_variants(specs, in_memory=InMemory(frame))
    for result in kept:
        assert result.tensors is not None and result.out == frame
        _same_bits(result.tensors, written)
    assert not (tmp_path / "never").exists()
    assert not list(frame.glob("*.safetensors"))
    # the frame is what the written folder holds for transformers beside its weights
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (frame / name).read_bytes() == (tmp_path / "written" / name).read_bytes(), name


def test_in_memory_merge_with_a_rebuilt_vocabulary(family, tmp_path):
    base, tool, think = family
    spec = MergeSpec.build(
        str(base),
        [str(tool), str(think)],
        method="task-arithmetic",
        params={"scale": 1.0},
        out_dtype="float32",
        tokenizer={"source": "union"},
    )
    recipe = tmp_path / "recipe.yaml"
    spec.replace(output=str(tmp_path / "written")).save(recipe)
    done = cli(tmp_path, "run", str(recipe))
    assert done.returncode == 0, done.stderr
    written = _written(tmp_path / "written")
    frame = tmp_path / "frame"
    frame.mkdir()
    (result,) = merge_variants([spec.replace(output=str(tmp_path / "never"))], in_memory=InMemory(frame))
    assert result.tensors is not None
    _same_bits(result.tensors, written)
    assert json.loads((frame / "tokenizer.json").read_text()) == json.loads(
        (tmp_path / "written" / "tokenizer.json").read_text()
    )
    assert (frame / "config.json").read_bytes() == (tmp_path / "written" / "config.json").read_bytes()


def test_too_large_for_memory_is_written_to_its_folder(synthetic, tmp_path):
    base, agents = synthetic
    spec = MergeSpec.build(str(base), [str(a) for a in agents], method="task-arithmetic", params={"scale": 0.5})
    frame = tmp_path / "frame"
    frame.mkdir()
    asked: list[int] = []
    (result,) = merge_variants(
        [spec.replace(output=str(tmp_path / "out"))],
        in_memory=InMemory(frame, fits=lambda nbytes: asked.append(nbytes) or False),
    )
    assert result.tensors is None and result.out == (tmp_path / "out").resolve()
    assert asked and asked[0] > 0
    assert list((tmp_path / "out").glob("*.safetensors"))


# ---- a search's trials --------------------------------------------------------------------------------

TASKS = ("code", "tool", "memory")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    pytest.importorskip("optuna")
    from ram_desktop.core.demo import write_demo

    folder = tmp_path_factory.mktemp("demo")
    write_demo(folder)
    return folder


def _search(demo: Path, out: Path, tests: bool = False):
    from ram_desktop.evaluate.search import SearchOptions, search

    spec = MergeSpec.build(str(demo / "base"), [str(demo / n) for n in ("coder", "tool", "memory")])
    options = SearchOptions(
        spec=spec,
        suites=[str(demo / "suites" / "validation" / t) for t in TASKS],
        test_suites=[str(demo / "suites" / t) for t in TASKS] if tests else [],
        folder=out,
        trials=5,
        methods=("ram-plus", "task-arithmetic", "ties"),
        workers=2,
        batch_size=16,
        limit=6,
    )
    return search(options)


def _spied(monkeypatch) -> tuple[list[Path], list[list]]:
    """Every folder a merge writes (``staging_folder``'s outputs) and every list of models ``evaluate`` scores."""
    import ram_desktop.evaluate
    from ram_desktop.core import pipeline
    from ram_desktop.evaluate import runner

    written: list[Path] = []
    scored: list[list] = []
    staging, evaluate = pipeline.staging_folder, runner.evaluate

    def staging_spy(out, *a, **k):
        written.append(Path(out))
        return staging(out, *a, **k)

    def evaluate_spy(models, *a, **k):
        scored.append(list(models))
        return evaluate(models, *a, **k)

    monkeypatch.setattr(pipeline, "staging_folder", staging_spy)
    monkeypatch.setattr(runner, "evaluate", evaluate_spy)
    # the package keeps a name once loaded (``lazy_exports``), and search takes it from there: in whatever order the
    # suite runs, the spy must be what search finds
    monkeypatch.setattr(ram_desktop.evaluate, "evaluate", evaluate_spy)
    return written, scored


def test_a_search_scores_the_same_with_trials_in_memory_as_with_trials_on_disk(demo, tmp_path, monkeypatch):
    from ram_desktop.evaluate import InMemoryModel

    monkeypatch.setenv("RAM_DESKTOP_TRIALS_ON_DISK", "1")
    written, scored = _spied(monkeypatch)
    _search(demo, tmp_path / "disk")
    assert written and scored and all(not isinstance(m, InMemoryModel) for models in scored for m in models)
    monkeypatch.delenv("RAM_DESKTOP_TRIALS_ON_DISK")
    written.clear()
    scored.clear()
    _search(demo, tmp_path / "memory")
    trial_models = [m for models in scored for m in models]
    assert trial_models and all(isinstance(m, InMemoryModel) for m in trial_models)
    disk = json.loads((tmp_path / "disk" / "search.json").read_text())["trials"]
    memory = json.loads((tmp_path / "memory" / "search.json").read_text())["trials"]
    assert [(t["method"], t["params"]) for t in memory] == [(t["method"], t["params"]) for t in disk]
    assert [t["scores"] for t in memory] == [
        t["scores"] for t in disk
    ]  # exactly: the same weights, the same greedy text
    assert [t["validation"] for t in memory] == [t["validation"] for t in disk]


def test_no_trial_is_written(demo, tmp_path, monkeypatch):
    monkeypatch.delenv("RAM_DESKTOP_TRIALS_ON_DISK", raising=False)
    written, _ = _spied(monkeypatch)
    out = tmp_path / "search"
    _search(demo, out, tests=True)
    # what is kept: best/, and the references scored beside it (temporary folders, as before)
    trials_written = [w for w in written if w != out / "best" and not w.parent.name.startswith("ram-search-ref-")]
    assert trials_written == []
    assert out / "best" in written
    assert list((out / "best").glob("*.safetensors"))
