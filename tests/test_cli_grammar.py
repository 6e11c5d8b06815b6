"""One command-line grammar: a method parameter never shares a flag with a global option (multislerp's norm
epsilon is ``--norm-eps``, ``--eps`` stays the probe's threshold), and ``--suite`` reads ``--suite A B`` and
``--suite A --suite B`` alike wherever it exists; a wrong form is refused naming the flag."""

from __future__ import annotations

import argparse

import pytest
import yaml

from ram_desktop.cli import build_parser, main
from ram_desktop.core import METHODS

from .subproc import cli, refused


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_norm_eps_reaches_the_recipe_and_eps_stays_the_probes(models, tmp_path):
    base, agents = models
    out = tmp_path / "out"
    done = cli(
        tmp_path,
        "-q",
        "merge",
        str(base),
        *map(str, agents),
        "--out",
        str(out),
        "--method",
        "multislerp",
        "--norm-eps",
        "1e-3",
        "--eps",
        "2e-4",
        "--device",
        "cpu",
    )
    assert done.returncode == 0, done.stderr
    recipe = yaml.safe_load((out / "ram-recipe.yaml").read_text())
    assert recipe["parameters"]["eps"] == 1e-3  # multislerp's own epsilon, under mergekit's name
    assert recipe["eps"] == 2e-4  # the probe's threshold
    report = (out / "merge-report.json").read_text()
    assert '"eps": 0.0002' in report


def test_eps_alone_leaves_multislerps_epsilon_at_its_default(models, tmp_path):
    base, agents = models
    out = tmp_path / "out"
    done = cli(
        tmp_path,
        "-q",
        "merge",
        str(base),
        *map(str, agents),
        "--out",
        str(out),
        "--method",
        "multislerp",
        "--eps",
        "1e-3",
        "--device",
        "cpu",
    )
    assert done.returncode == 0, done.stderr
    recipe = yaml.safe_load((out / "ram-recipe.yaml").read_text())
    assert recipe["eps"] == 1e-3 and recipe["parameters"]["eps"] == 1e-8


def test_no_method_flag_is_a_global_option():
    for name, parser in _subparsers().items():
        own = {s for a in parser._actions if not (a.dest or "").startswith("param_") for s in a.option_strings}
        params = {s for a in parser._actions if (a.dest or "").startswith("param_") for s in a.option_strings}
        assert not own & params, (name, own & params)
    assert any(p.flag == "--norm-eps" and p.name == "eps" for p in METHODS["multislerp"].params)
    assert any(p.flag == "--fisher-suite" and p.name == "suite" for p in METHODS["fisher"].params)


@pytest.mark.parametrize(
    "command,head",
    [
        ("eval", ["m1", "m2"]),
        ("compare", ["b", "a", "--out", "o", "--variant", "ram"]),
        ("search", ["b", "a", "--trials", "2", "--out", "o"]),
        ("search", ["--recipe", "r.yaml", "--trials", "2", "--out", "o"]),
    ],
)
def test_suite_takes_both_forms(command, head):
    parser = build_parser()
    together = parser.parse_args([command, *head, "--suite", "A", "B"])
    repeated = parser.parse_args([command, *head, "--suite", "A", "--suite", "B"])
    assert together.suite == repeated.suite == ["A", "B"]
    mixed = parser.parse_args([command, *head, "--suite", "A", "B", "--suite", "C"])
    assert mixed.suite == ["A", "B", "C"]


def test_a_comma_separated_suite_list_is_refused_naming_the_flag(tmp_path, capsys):
    assert main(["eval", str(tmp_path), "--suite", "a.jsonl,b.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --suite a.jsonl,b.jsonl") and "--suite A B" in err
    assert main(["eval", str(tmp_path), "--suite"]) == 2
    assert "--suite" in capsys.readouterr().err


def test_fisher_takes_one_suite(tmp_path):
    line = refused(cli(tmp_path, "fisher", str(tmp_path), "--suite", "a", "b", "--out", str(tmp_path / "f")), "--suite")
    assert "takes 1 suite" in line and "got 2" in line


def test_per_agent_values_by_name_on_the_command_line(models, tmp_path):
    """``--weight NAME=VALUE,...`` keys values by agent, in any order; the recipe keeps them by name."""
    base, agents = models
    done = cli(
        tmp_path,
        "-q",
        "merge",
        str(base),
        *map(str, agents),
        "--out",
        str(tmp_path / "a"),
        "--method",
        "linear",
        "--weight",
        "gamma=3,alpha=1,beta=2",
        "--device",
        "cpu",
    )
    assert done.returncode == 0, done.stderr
    by_name = yaml.safe_load((tmp_path / "a" / "ram-recipe.yaml").read_text())["parameters"]["weight"]
    assert by_name == {"alpha": 1.0, "beta": 2.0, "gamma": 3.0}
    done = cli(
        tmp_path,
        "-q",
        "merge",
        str(base),
        *map(str, agents),
        "--out",
        str(tmp_path / "b"),
        "--method",
        "linear",
        "--weight",
        "1,2,3",
        "--device",
        "cpu",
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
