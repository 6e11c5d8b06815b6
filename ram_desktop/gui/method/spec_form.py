"""The ``MergeSpec`` that the sources and method panels describe, and back: the window's one way to a merge,
an analysis or a recipe (the CLI builds the same spec from its flags). A per-agent field's rows go onto their
agents (by agent name), so what the form shows for an agent is what that agent gets."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ... import workflow
from ...core import (
    OUT_DTYPES,
    VOCAB_MODES,
    Agent,
    Checkpoint,
    InputError,
    MergeResult,
    MergeSpec,
    ProbeReport,
    Reporter,
    RunOptions,
    defaults,
    thaw,
)
from ...core.storage.output import check_apart, check_replaceable
from .fields import PerAgentField
from .panel import MethodPanel

# Window jobs run the fused CPU kernels only on passes over this many elements or more: loading numba's
# kernels holds the GIL long enough to freeze the event loop once, which a 300M-parameter merge or Analyze
# repays many times over and a small model's does not (``RunOptions.kernel_min_elements``).
KERNEL_MIN_ELEMENTS = 50_000_000


def read_spec(base: str, agents: Sequence[Agent], method: MethodPanel) -> MergeSpec:
    """The spec the panels show (``base``, ``agents``: the sources panel's ``chosen``), its layer map included.
    Raises ``InputError`` when ε is not a number or the agents no longer fit the layer map."""
    try:
        eps = method.eps_value()
    except ValueError:
        raise _bad_eps(method) from None
    return MergeSpec(
        base=base,
        agents=_with_values(agents, method),
        method=method.current.name,
        params=_shared_params(method),
        eps=eps,
        device=method.device.currentData(),
        out_dtype=method.out_dtype.currentData(),
        shard_size=method.shard_size.text().strip() or defaults.SHARD_SIZE,
        output=method.out_dir.text().strip() or None,
        vocab=method.vocab.currentData(),
        slices=_tuple_or_none(method.slices()),
        tokenizer=method.tokenizer_settings(),
        chat_template=method.chat_template,
    )


def _shared_params(method: MethodPanel) -> dict[str, Any]:
    """The values the form gives every agent: each field's, but a per-agent field's only when none of its rows
    is filled (a setting then gives its default once)."""
    return {
        key: field.value()
        for key, field in method.fields.items()
        if field.value() is not None and not (isinstance(field, PerAgentField) and field.by_agent() is not None)
    }


def _with_values(agents: Sequence[Agent], method: MethodPanel) -> tuple[Agent, ...]:
    """The agents, each with its own values: its filled rows of the per-agent fields (by agent name)."""
    own: dict[str, dict[str, Any]] = {a.name: {} for a in agents}
    for key, field in method.fields.items():
        given = field.by_agent() if isinstance(field, PerAgentField) else None
        for name, value in (given or {}).items():
            if value is not None and name in own:
                own[name][key] = value
    return tuple(dataclasses.replace(a, params=own[a.name]) for a in agents)


def _show_agent_values(method: MethodPanel, spec: MergeSpec) -> None:
    """Each agent's own values on its rows of the per-agent fields, an agent without one showing the spec's
    value for every agent; a field no agent has a value of keeps what ``set_method`` showed."""
    shared = thaw(spec.params)
    for key, field in method.fields.items():
        if isinstance(field, PerAgentField) and any(key in a.params for a in spec.agents):
            field.set_by_agent(
                {a.name: thaw(a.params[key]) if key in a.params else shared.get(key) for a in spec.agents}
            )


def _tuple_or_none(slices: list[dict[str, Any]] | None) -> tuple[dict[str, Any], ...] | None:
    return tuple(slices) if slices is not None else None


def engine_params(agents: Sequence[Agent], method: MethodPanel) -> dict[str, Any]:
    """The form's parameters as the engine takes them (per-agent values in agent order), for the estimates the
    Analysis view draws; {} while a per-agent value is missing for some agent (the estimate shows the defaults)."""
    try:
        spec = MergeSpec(agents=_with_values(agents, method), method=method.current.name, params=_shared_params(method))
        return spec.engine_params()
    except InputError:
        return {}


def checked_spec(base: str, agents: Sequence[Agent], method: MethodPanel) -> MergeSpec:
    """The spec, validated as the engine will validate it (ε, parameters); raises ``InputError``."""
    spec = read_spec(base, agents, method)
    if not (spec.eps >= 0 and spec.eps != float("inf")):
        raise _bad_eps(method)
    spec.resolved_params()
    return spec


def _bad_eps(method: MethodPanel) -> InputError:
    return InputError(f"threshold ε {method.eps.text()!r} is not a non-negative number; write it like 1e-5")


def show_spec(method: MethodPanel, spec: MergeSpec) -> None:
    """Show a validated spec's method, layer map and output settings in the method panel (cannot fail halfway);
    its agents are in the sources panel already, so each per-agent value lands on its agent's row and the layer
    map binds to the agents' rows."""
    method.set_layer_map(spec.slices, spec.method)
    method.set_method(spec.method, thaw(spec.params))
    _show_agent_values(method, spec)
    method.eps.setText(repr(float(spec.eps)))
    method.set_out_dtype(spec.out_dtype)
    method.set_vocab(spec.vocab)
    method.set_tokenizer(spec.tokenizer, spec.chat_template)
    method.shard_size.setText(str(spec.shard_size))
    method.set_device(spec.device)
    method.out_dir.setText(spec.output or "")


def load_spec(path: Path) -> MergeSpec:
    """The spec of a recipe file, every value checked first, so a bad recipe changes nothing.
    Raises ``InputError`` naming the file."""
    spec = MergeSpec.load(Path(path))
    spec.resolved_params()  # unknown method or parameter, out-of-range value
    if spec.out_dtype not in OUT_DTYPES:
        raise InputError(f"{path}: unknown out_dtype {spec.out_dtype!r}; choose one of {', '.join(OUT_DTYPES)}")
    if spec.vocab not in VOCAB_MODES:
        raise InputError(f"{path}: unknown vocab {spec.vocab!r}; choose exact or common")
    workflow.check_eps(spec.eps, f"{path}: eps")
    return spec


def write_from_recipe(window: Any, path: Path, write: Callable[[MergeSpec, Path], None], doing: str, what: str) -> bool:
    """``write(spec, path)`` with the window's current spec (saving it, exporting it); False, with a readable
    message in the window, when the sources are incomplete (``doing``: what needs them) or writing ``what`` fails."""
    if window.sources.base is None or not window.sources.agents:
        window.show_error(f"add a base and at least one agent before {doing}")
        return False
    try:
        write(window.spec().resolved(), Path(path))
    except InputError as e:
        window.show_error(str(e))
        return False
    except OSError as e:
        window.show_error(f"{path}: cannot write {what} ({e.strerror})")
        return False
    return True


def window_options(chunk_elements: int, token: str | None, overwrite: bool = False) -> RunOptions:
    """How the window runs a job: its chunk size, the Hub token, the fused kernels on big passes only."""
    return RunOptions(
        overwrite=overwrite, chunk_elements=chunk_elements, token=token, kernel_min_elements=KERNEL_MIN_ELEMENTS
    )


def merge_options(
    spec: MergeSpec,
    inputs: list[Checkpoint],
    confirm_replace: Callable[[Path], bool],
    token: str | None,
    chunk_elements: int,
) -> RunOptions | None:
    """The run options for merging ``spec``; None when its output folder holds an earlier RAM Desktop output and
    ``confirm_replace(folder)`` says not to replace it. Raises ``InputError`` before asking anything (no output
    folder, an output that is or holds an input, a bad value) and ``NotReplaceable`` for a folder holding
    anything else, naming what would be lost (the engine's own rules: ``check_apart``, ``check_replaceable``)."""
    if not spec.output:
        raise InputError("choose an output folder (section 3) before merging")
    spec.check_base()
    out = Path(spec.output).expanduser()
    resolved = check_apart(out, inputs)
    overwrite = resolved.is_dir() and any(resolved.iterdir())
    if overwrite:  # what else is wrong with the folder the engine says, in the worker
        check_replaceable(resolved, overwrite)
    if overwrite and not confirm_replace(out):
        return None
    return window_options(chunk_elements, token, overwrite)


def run_probe(spec: MergeSpec, options: RunOptions, reporter: Reporter) -> ProbeReport:
    """The analysis (probe pass) of ``spec``'s sources."""
    return workflow.analyse(spec, options, reporter)


def run_merge(spec: MergeSpec, options: RunOptions, reporter: Reporter) -> MergeResult:
    """The merge (calibrated first when its method needs it: ``workflow.merge``)."""
    return workflow.merge(spec, options, reporter)
