"""The method form and the session's draft (``gui/draft.py``): the form writes the draft on every edit and shows
a draft written elsewhere (``bind_draft``); recipes in and out, and how the window runs a merge or an analysis
of the spec made from the session (the CLI builds the same spec from its flags). A per-agent field's rows are kept
by the agents' row keys, so what the form shows for an agent is what that agent gets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import workflow
from ...core import (
    OUT_DTYPES,
    VOCAB_MODES,
    Checkpoint,
    InputError,
    MergeResult,
    MergeSpec,
    ProbeReport,
    Reporter,
    RunOptions,
    thaw,
)
from ...core.storage.output import check_apart, check_replaceable
from ..draft import Draft
from ..session import Topic
from .fields import PerAgentField
from .panel import MethodPanel

# Window jobs run the fused CPU kernels only on passes over this many elements or more: loading numba's
# kernels holds the GIL long enough to freeze the event loop once, which a 300M-parameter merge or Analyze
# repays many times over and a small model's does not (``RunOptions.kernel_min_elements``).
KERNEL_MIN_ELEMENTS = 50_000_000


def read_draft(method: MethodPanel) -> Draft:
    """The draft the form's widgets show."""
    params: dict[str, Any] = {}
    rows: dict[str, dict[Any, Any]] = {}
    for name, field in method.fields.items():
        if isinstance(field, PerAgentField):
            rows[name] = field.by_key()
            value = field.param.default if field.param.setting else None  # while no row is filled
        else:
            value = field.value()
        if value is not None:
            params[name] = value
    return Draft(
        method=method.current.name,
        params=params,
        per_agent=rows,
        eps=method.eps.text(),
        device=method.device.currentData(),
        out_dtype=method.out_dtype.currentData(),
        shard_size=method.shard_size.text(),
        output=method.out_dir.text(),
        vocab=method.vocab.currentData(),
        layer_map=method.layer_map,
        tokenizer=method.tokenizer_settings(),
        chat_template=method.chat_template,
    )


def show_draft(method: MethodPanel, draft: Draft) -> None:
    """Show ``draft`` in the form, changing only the widgets that differ (a field being typed in keeps its cursor):
    its layer map, its method (a new one starts from its defaults, a per-agent field no row of the draft fills
    from the agents' defaults, e.g. the demo's suites), each value, ε and the output settings."""
    if draft.layer_map != method.layer_map:
        method.set_bound_layer_map(draft.layer_map)
    new = draft.method != method.current.name
    if new and method.method.findData(draft.method) >= 0:
        method.method.setCurrentIndex(method.method.findData(draft.method))
    for name, field in method.fields.items():
        if isinstance(field, PerAgentField):
            if (name in draft.per_agent or not new) and field.by_key() != draft.per_agent.get(name, {}):
                field.set_by_key(draft.per_agent.get(name, {}))
        elif name in draft.params or not new:
            value = draft.params.get(name, field.param.default)
            if field.value() != value:
                field.set_value(thaw(value))
    for edit, text in ((method.eps, draft.eps), (method.shard_size, draft.shard_size), (method.out_dir, draft.output)):
        if edit.text() != text:
            edit.setText(text)
    method.set_out_dtype(draft.out_dtype)
    method.set_vocab(draft.vocab)
    if draft.tokenizer != method.tokenizer_settings() or draft.chat_template != method.chat_template:
        method.set_tokenizer(thaw(draft.tokenizer), draft.chat_template)
    if draft.device != method.device.currentData():
        method.set_device(draft.device)


def bind_draft(method: MethodPanel) -> None:
    """The form and its session's draft (``Topic.DRAFT``): every edit of the form writes the draft (``edited``),
    and a draft another part of the window writes is shown, then written back as the form reads it (the same
    draft, or one the form completed). Showing a draft writes nothing until it is all shown."""
    session = method.session
    showing = [False]

    def write() -> None:
        if not showing[0]:
            session.set_draft(read_draft(method))

    def show(draft: Draft) -> None:
        if showing[0] or draft == read_draft(method):
            return
        showing[0] = True
        try:
            show_draft(method, draft)
        finally:
            showing[0] = False
        write()

    method.edited.connect(write)
    session.watch(Topic.DRAFT, show)
    write()


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
