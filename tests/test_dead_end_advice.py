"""Advice that leads somewhere (issue 47): a refusal offers --overwrite only where --overwrite would work, and a
mergekit YAML with a misspelt key is told which key and what it is close to, as a recipe's typo is. Each case
in a fresh ``ram-merge`` process."""

from __future__ import annotations

from tests.conftest import make_models
from tests.subproc import cli, refused


def test_a_folder_holding_the_users_file_is_never_offered_overwrite(tmp_path):
    base, agents = make_models(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    line = refused(cli(tmp_path, "merge", str(base), *map(str, agents), "--out", "out"), "notes.txt", "out-2")
    assert "--overwrite" not in line
    refused(cli(tmp_path, "merge", str(base), *map(str, agents), "--out", "out", "--overwrite"), "notes.txt")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_an_earlier_output_is_offered_overwrite_and_it_works(tmp_path):
    base, agents = make_models(tmp_path / "in")
    args = ("merge", str(base), *map(str, agents), "--out", "out")
    assert cli(tmp_path, *args).returncode == 0
    refused(cli(tmp_path, *args), "earlier RAM Desktop output", "pass --overwrite")
    done = cli(tmp_path, *args, "--overwrite")
    assert done.returncode == 0, done.stderr


MISSPELT = """merge_methd: ties
base_model: {base}
models:
  - model: {a}
    parameters: {{density: 0.5, weight: 1.0}}
  - model: {b}
    parameters: {{density: 0.5, weight: 1.0}}
"""


def test_a_misspelt_merge_method_is_named_with_its_correction(tmp_path):
    base, agents = make_models(tmp_path / "in")
    (tmp_path / "mk.yaml").write_text(MISSPELT.format(base=base, a=agents[0], b=agents[1]))
    line = refused(cli(tmp_path, "run", "mk.yaml", "--out", "out"), "merge_methd", "did you mean merge_method?")
    assert "format" not in line and "RAM Desktop recipe" not in line
    assert not (tmp_path / "out").exists()


def test_a_mergekit_yaml_is_told_apart_by_its_keys_alone(tmp_path):
    """Only keys that mergekit and a recipe share (slices) beside the typo: still read as mergekit's."""
    (tmp_path / "mk.yaml").write_text("slices:\n  - sources: [{model: a, layer_range: [0, 2]}]\nmerge_methd: slerp\n")
    refused(cli(tmp_path, "run", "mk.yaml", "--out", "out"), "merge_methd", "did you mean merge_method?")
    (tmp_path / "mk.yaml").write_text("base_model: a\nmodels: [{model: b}]\n")  # no merge_method at all
    refused(cli(tmp_path, "run", "mk.yaml", "--out", "out"), "merge_method: missing")
