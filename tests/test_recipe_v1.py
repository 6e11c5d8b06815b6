"""Recipes written by the version before ``MergeSpec`` (``format: ram-recipe/1``, per-agent values as lists in agent
order) still open and merge to the same bytes. ``tests/data/recipes_v1`` holds recipes that version (commit
cf9d8cb) wrote when merging the built-in demo (weighted TIES with per-agent weights and densities, RAM+, DELLA with
per-agent densities, linear with named agents, Fisher from ``--fisher`` folders) and the sha256 of the model files
it wrote. The demo is written afresh here (``ram-merge demo``, deterministic), the Fisher folders by the formula
below (what the old merge read), and every recipe is run by today's ``ram-merge run``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from tests.subproc import cli

DATA = Path(__file__).parent / "data" / "recipes_v1"
OLD_DEMO, OLD_FISHER, OLD_OUT = "/tmp/oldfx/demo", "/tmp/oldfx/fisher2", "/tmp/oldfx/out"
HASHES = json.loads((DATA / "hashes.json").read_text())


def write_fisher(demo: Path, out: Path) -> None:
    """Each demo agent's stand-in Fisher information: (θ_agent − θ_base)² + 1e-6, float32."""
    base = load_file(str(demo / "base" / "model.safetensors"))
    for agent in ("coder", "tool", "memory"):
        tensors = load_file(str(demo / agent / "model.safetensors"))
        fisher = {k: ((v.float() - base[k].float()) ** 2 + 1e-6).contiguous() for k, v in tensors.items()}
        (out / agent).mkdir(parents=True, exist_ok=True)
        save_file(fisher, str(out / agent / "fisher.safetensors"), metadata={"ram_desktop": "ram-fisher/1"})


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("v1")
    done = cli(root, "-q", "demo", str(root / "demo"))
    assert done.returncode == 0, done.stderr
    write_fisher(root / "demo", root / "fisher")
    return root / "demo", root / "fisher"


def _hashes(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.glob("*.safetensors"))}


def _moved(name: str, demo: tuple[Path, Path], tmp_path: Path) -> Path:
    """The old recipe with its sources pointing at this test's demo and Fisher folders."""
    text = (DATA / f"{name}.yaml").read_text()
    text = text.replace(OLD_DEMO, str(demo[0])).replace(OLD_FISHER, str(demo[1]))
    text = text.replace(f"{OLD_OUT}/{name}", str(tmp_path / "unused"))
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", sorted(HASHES))
def test_an_old_recipe_merges_to_the_same_bytes(name, demo, tmp_path):
    recipe = _moved(name, demo, tmp_path)
    assert "format: ram-recipe/1" in recipe.read_text()
    done = cli(tmp_path, "-q", "run", str(recipe), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert _hashes(tmp_path / "out") == HASHES[name]
    # what it writes is the new format, per-agent values keyed by agent name, and it merges the same again
    written = yaml.safe_load((tmp_path / "out" / "ram-recipe.yaml").read_text())
    assert written["format"] == "ram-recipe/2"
    old = yaml.safe_load(recipe.read_text())
    names = [a["name"] for a in old["agents"]]
    for key, value in old["parameters"].items():
        if isinstance(value, list):
            assert written["parameters"][key] == dict(zip(names, value)), key
    again = cli(tmp_path, "-q", "run", str(tmp_path / "out" / "ram-recipe.yaml"), "--out", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr
    assert _hashes(tmp_path / "again") == HASHES[name]


def test_an_old_recipe_without_names_keys_its_lists_by_the_derived_names(demo, tmp_path):
    """A hand-written /1 recipe naming no agent: its lists go to the names derived from the folders."""
    recipe = _moved("weighted-ties", demo, tmp_path)
    data = yaml.safe_load(recipe.read_text())
    data["agents"] = [a["source"] for a in data["agents"]]
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    done = cli(tmp_path, "-q", "run", str(recipe), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert _hashes(tmp_path / "out") == HASHES["weighted-ties"]
    written = yaml.safe_load((tmp_path / "out" / "ram-recipe.yaml").read_text())
    assert written["parameters"]["weight"] == {"coder": 0.1, "tool": 0.2, "memory": 0.3}


def test_reordered_agents_keep_their_values(demo, tmp_path):
    """The same merge with the agents listed in another order in a /2 recipe: each agent's weight and density go
    with it, so only the order of the agents changes, not which values they get."""
    recipe = _moved("weighted-ties", demo, tmp_path)
    done = cli(tmp_path, "-q", "run", str(recipe), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    written = yaml.safe_load((tmp_path / "out" / "ram-recipe.yaml").read_text())
    written["agents"] = written["agents"][::-1]
    written["output"] = str(tmp_path / "reordered")
    (tmp_path / "reordered.yaml").write_text(yaml.safe_dump(written, sort_keys=False))
    done = cli(tmp_path, "-q", "run", str(tmp_path / "reordered.yaml"))
    assert done.returncode == 0, done.stderr
    again = yaml.safe_load((tmp_path / "reordered" / "ram-recipe.yaml").read_text())
    assert [a["name"] for a in again["agents"]] == ["memory", "tool", "coder"]
    assert again["parameters"]["weight"] == {"memory": 0.3, "tool": 0.2, "coder": 0.1}
    assert again["parameters"]["density"] == {"memory": 0.9, "tool": 0.7, "coder": 0.5}
    torch.testing.assert_close(  # TIES's weighted mean does not depend on the agents' order (up to rounding)
        load_file(str(tmp_path / "reordered" / "model.safetensors"))["lm_head.weight"].float(),
        load_file(str(tmp_path / "out" / "model.safetensors"))["lm_head.weight"].float(),
        atol=1e-2,
        rtol=0,
    )
