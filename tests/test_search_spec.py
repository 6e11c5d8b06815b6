"""``ram-merge search`` from a whole spec, in fresh processes: a recipe with a tokenizer block, a chat template,
a layer map and an output dtype reaches every trial and ``DIR/best`` (which holds what ``ram-merge run`` makes of
the same recipe with the best trial's method and parameters); ``--recipe`` reads a ram-recipe or a mergekit
YAML as ``run`` does, and its bad inputs are one line; a study resumed with another tokenizer block, layer map
or dtype is refused before anything is merged, while a study written before those keys existed resumes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("transformers")
pytest.importorskip("optuna")

from .subproc import cli, refused
from .test_search import LIMIT, search_command

AGENTS = ("coder", "tool", "memory")
# a merge layer map that repeats the last layer (the demo has 3): every model names one range per slice
SLICES = [
    {"sources": [{"model": m, "layer_range": [0, 3]} for m in range(4)]},
    {"sources": [{"model": m, "layer_range": [2, 3]} for m in range(4)]},
]
TOKENIZER = {"source": "base", "tokens": {"<tool_call>": {"source": {"kind": "zero"}}}}
# a merge's own records, which name its output folder, timings and versions: every other file is compared
RECORDS = ("README.md", "ram-recipe.yaml", "merge-report.json", "ram-manifest.json")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    from ram_desktop.core.demo import write_demo

    folder = tmp_path_factory.mktemp("demo")
    write_demo(folder)
    return folder


def recipe_data(demo: Path, method: str = "task-arithmetic", params: dict | None = None, **more) -> dict:
    data = {
        "format": "ram-recipe/2",
        "method": method,
        "parameters": {"scale": 0.5} if params is None else params,
        "base": str(demo / "base"),
        "agents": [{"name": n, "source": str(demo / n)} for n in AGENTS],
        "out_dtype": "float32",
        "tokenizer": TOKENIZER,
        "chat_template": "chatml",
        "slices": SLICES,
    }
    data.update(more)
    return {k: v for k, v in data.items() if v is not None}


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def search_args(demo: Path, out: Path, trials: int, *inputs: str) -> list[str]:
    return search_command(demo, out, trials, inputs)


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def assert_same_model(got: Path, want: Path) -> None:
    """The same tensors (names, dtypes, values) and the same other files (config, tokenizer, chat template,
    generation config), byte for byte."""
    a, b = tensors(got), tensors(want)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    files = sorted(p.name for p in got.iterdir() if p.suffix != ".safetensors" and p.name not in RECORDS)
    assert files == sorted(p.name for p in want.iterdir() if p.suffix != ".safetensors" and p.name not in RECORDS)
    assert "tokenizer.json" in files and "config.json" in files
    for name in files:
        assert (got / name).read_bytes() == (want / name).read_bytes(), name


def test_best_holds_what_run_makes_of_the_recipe_with_the_best_trial(demo, tmp_path):
    """Tokenizer block, chat template, layer map and dtype reach DIR/best: it equals ``ram-merge run`` of the
    same recipe with the best trial's method and parameters, written here by hand."""
    recipe = write(tmp_path / "recipe.yaml", recipe_data(demo))
    out = tmp_path / "search"
    done = cli(tmp_path, *search_args(demo, out, 2, "--recipe", str(recipe), "--methods", "task-arithmetic,ties"))
    assert done.returncode == 0, done.stderr
    data = json.loads((out / "search.json").read_text())
    first = data["trials"][0]
    assert (first["method"], first["params"]) == ("task-arithmetic", {"scale": 0.5})  # the recipe's merge first
    best = data["best"]

    reference = write(tmp_path / "reference.yaml", recipe_data(demo, best["method"], best["params"]))
    ran = cli(tmp_path, "run", str(reference), "--out", str(tmp_path / "reference"))
    assert ran.returncode == 0, ran.stderr
    assert_same_model(out / "best", tmp_path / "reference")

    # and the spec's parts are there, read without the implementation: 4 layers, one token more, float32
    from transformers import AutoTokenizer

    config = json.loads((out / "best" / "config.json").read_text())
    vocab = AutoTokenizer.from_pretrained(out / "best").get_vocab()
    base_size = len(AutoTokenizer.from_pretrained(demo / "base"))
    assert config["num_hidden_layers"] == 4 and "<tool_call>" in vocab and len(vocab) == base_size + 1
    weights = tensors(out / "best")
    assert weights["model.embed_tokens.weight"].shape[0] == base_size + 1
    assert all(t.dtype == torch.float32 for t in weights.values())
    assert "im_start" in (out / "best" / "chat_template.jinja").read_text()
    written = yaml.safe_load((out / "best" / "ram-recipe.yaml").read_text())
    assert written["tokenizer"] == TOKENIZER and written["slices"] == SLICES and written["out_dtype"] == "float32"


def test_a_mergekit_recipe_starts_the_search_from_its_own_merge(demo, tmp_path):
    """A mergekit YAML read as ``run`` reads it: its method (with its per-model values) is searched too and is
    the first trial, so one trial's DIR/best is ``ram-merge run`` of that file."""
    config = {
        "merge_method": "ties",
        "base_model": str(demo / "base"),
        "models": [{"model": str(demo / n), "parameters": {"weight": 1.0, "density": 0.5}} for n in AGENTS],
        "parameters": {"normalize": True},
        "dtype": "float32",
        "tokenizer": {"source": "base"},
    }
    mergekit = write(tmp_path / "mergekit.yaml", config)
    out = tmp_path / "search"
    done = cli(tmp_path, *search_args(demo, out, 1, "--recipe", str(mergekit)))
    assert done.returncode == 0, done.stderr
    data = json.loads((out / "search.json").read_text())
    assert data["methods"][0] == "weighted-ties" and "ram-plus" in data["methods"]
    (trial,) = data["trials"]
    assert trial["method"] == "weighted-ties"
    assert trial["params"]["density"] == [0.5, 0.5, 0.5] and trial["params"]["normalize"] is True
    ran = cli(tmp_path, "run", str(mergekit), "--out", str(tmp_path / "reference"))
    assert ran.returncode == 0, ran.stderr
    assert_same_model(out / "best", tmp_path / "reference")


def test_recipe_bad_inputs_are_one_line_and_nothing_is_written(demo, tmp_path):
    out = tmp_path / "search"
    recipe = write(tmp_path / "recipe.yaml", recipe_data(demo))
    sources = [str(demo / n) for n in ("base", *AGENTS)]
    refused(cli(tmp_path, *search_args(demo, out, 1, "--recipe", str(recipe), *sources)), "not both")
    refused(cli(tmp_path, *search_args(demo, out, 1)), "BASE AGENT...", "--recipe")
    refused(cli(tmp_path, *search_args(demo, out, 1, "--recipe", str(recipe), "--eps", "0.1")), "--eps", "recipe")
    refused(
        cli(tmp_path, *search_args(demo, out, 1, "--recipe", str(recipe), "--out-dtype", "bfloat16")), "--out-dtype"
    )
    # an unreadable recipe: the very line run gives for it
    typo = write(tmp_path / "typo.yaml", {**recipe_data(demo), "metod": "ties"})
    for bad in (tmp_path / "missing.yaml", typo):
        line = refused(cli(tmp_path, *search_args(demo, out, 1, "--recipe", str(bad))))
        assert line == refused(cli(tmp_path, "run", str(bad), "--out", str(tmp_path / "run-out")))
    assert not out.exists() and not (tmp_path / "run-out").exists()


def _state(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_study_resumed_with_another_tokenizer_layer_map_or_dtype_is_refused(demo, tmp_path):
    recipe = write(tmp_path / "recipe.yaml", recipe_data(demo))
    out = tmp_path / "search"
    done = cli(tmp_path, *search_args(demo, out, 1, "--recipe", str(recipe), "--methods", "average"))
    assert done.returncode == 0, done.stderr
    before = _state(out)
    changes = {
        "tokenizer": {"tokenizer": {"source": "base"}},
        "slices": {"slices": [{"sources": [{"model": m, "layer_range": [0, 3]} for m in range(4)]}]},
        "out_dtype": {"out_dtype": "bfloat16"},
        "chat_template": {"chat_template": "llama3"},
    }
    for key, change in changes.items():
        other = write(tmp_path / f"{key}.yaml", {**recipe_data(demo), **change})
        refused(
            cli(tmp_path, *search_args(demo, out, 2, "--recipe", str(other), "--methods", "average")),
            "belongs to another search",
            f"its {key} ",
        )
        assert _state(out) == before, key  # nothing merged, the study untouched
    # the same recipe again continues (the one more trial repeats average's merge: nothing new to merge)
    again = cli(tmp_path, *search_args(demo, out, 2, "--recipe", str(recipe), "--methods", "average"))
    assert again.returncode == 0, again.stderr


def test_the_api_refuses_another_tokenizer_block_before_merging(demo, tmp_path):
    """The same refusal through ``search`` itself (what the window calls), with spec objects."""
    from ram_desktop.core import InputError, MergeSpec
    from ram_desktop.evaluate.search import SearchOptions, search

    out = tmp_path / "search"
    suites = [demo / "suites" / "validation" / t for t in ("code", "tool", "memory")]

    def options(spec: MergeSpec, trials: int) -> SearchOptions:
        return SearchOptions(spec, suites, [], out, trials, ["average"], limit=int(LIMIT), batch_size=16)

    search(options(MergeSpec.from_dict(recipe_data(demo)), 1))
    before = _state(out)
    other = MergeSpec.from_dict(recipe_data(demo, tokenizer={"source": "base"}))
    with pytest.raises(InputError, match="belongs to another search: its tokenizer"):
        search(options(other, 2))
    assert _state(out) == before


def test_a_study_made_before_the_spec_keys_existed_still_resumes(demo, tmp_path):
    """A study.db whose identity has no tokenizer, chat_template, slices or kept (as earlier versions wrote it)
    continues for a spec without them."""
    sources = [str(demo / n) for n in ("base", *AGENTS)]
    out = tmp_path / "search"
    done = cli(tmp_path, *search_args(demo, out, 1, *sources, "--methods", "average"))
    assert done.returncode == 0, done.stderr
    con = sqlite3.connect(out / "study.db")
    try:
        (stored,) = con.execute("SELECT value_json FROM study_user_attributes WHERE key = 'search'").fetchone()
        old = {k: v for k, v in json.loads(stored).items() if k not in ("tokenizer", "chat_template", "slices", "kept")}
        con.execute("UPDATE study_user_attributes SET value_json = ? WHERE key = 'search'", (json.dumps(old),))
        con.commit()
    finally:
        con.close()
    again = cli(tmp_path, *search_args(demo, out, 2, *sources, "--methods", "average"))
    assert again.returncode == 0, again.stderr
    assert [t["number"] for t in json.loads((out / "search.json").read_text())["trials"]] == [0, 1]


def test_trials_travel_to_ray_workers_with_the_whole_spec(demo):
    """What a Ray task receives (pickled) keeps every part of the spec, and its trials are deltas of it."""
    import pickle

    from ram_desktop.core import MergeSpec
    from ram_desktop.evaluate.search import Inputs

    spec = MergeSpec.from_dict(recipe_data(demo, shard_size="1MB"))
    inputs = Inputs(spec, ("suite",), 4, None)
    again = pickle.loads(pickle.dumps(inputs))
    assert again == inputs
    (trial,) = again.merge_specs([("t", "ties", {"density": 0.4})], "/tmp/x")
    assert (trial.method, dict(trial.params), trial.output) == ("ties", {"density": 0.4}, "/tmp/x/t")
    kept = ("base", "agents", "eps", "out_dtype", "vocab", "tokenizer", "chat_template", "slices", "shard_size")
    for key in kept:
        assert getattr(trial, key) == getattr(spec, key), key
