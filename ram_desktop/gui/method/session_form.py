"""The Session that the sources and method panels describe, and back: the window's one way to a
merge request or a recipe (the CLI builds the same Session from its flags)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...core import (
    OUT_DTYPES,
    VOCAB_MODES,
    Checkpoint,
    InputError,
    MergeRequest,
    MergeResult,
    ProbeReport,
    Recipe,
    Reporter,
    Session,
    check_eps,
    defaults,
    merge,
    probe,
)
from ...core.storage.output import check_apart, is_earlier_output
from ..sources.panel import SourcesPanel
from ..widgets.common import free_folder
from .panel import MethodPanel


def read_session(sources: SourcesPanel, method: MethodPanel) -> Session:
    """The Session the panels show. Raises ``InputError`` when ε is not a number."""
    try:
        eps = method.eps_value()
    except ValueError:
        raise _bad_eps(method) from None
    return Session(
        base=sources.base.spec if sources.base else "",
        agents=[r.spec for r in sources.agents],
        names=sources.names or None,
        method=method.current.name,
        params=method.params(),
        eps=eps,
        device=method.device.currentData(),
        out_dtype=method.out_dtype.currentData(),
        shard_size=method.shard_size.text().strip() or defaults.SHARD_SIZE,
        out=method.out_dir.text().strip() or None,
        vocab=method.vocab.currentData(),
    )


def checked_session(sources: SourcesPanel, method: MethodPanel) -> Session:
    """The Session, validated as the engine will validate it (ε, parameters); raises ``InputError``."""
    session = read_session(sources, method)
    if not (session.eps >= 0 and session.eps != float("inf")):
        raise _bad_eps(method)
    session.resolved_params()
    return session


def _bad_eps(method: MethodPanel) -> InputError:
    return InputError(f"threshold ε {method.eps.text()!r} is not a non-negative number; write it like 1e-5")


def show_session(method: MethodPanel, session: Session) -> None:
    """Show a validated Session's method and output settings in the method panel (cannot fail halfway)."""
    method.set_method(session.method, session.params)
    method.eps.setText(repr(float(session.eps)))
    method.set_out_dtype(session.out_dtype)
    method.set_vocab(session.vocab)
    method.shard_size.setText(str(session.shard_size))
    method.set_device(session.device)
    method.out_dir.setText(session.out or "")


def load_session(path: Path) -> Session:
    """The Session of a recipe file, every value checked first, so a bad recipe changes nothing.
    Raises ``InputError`` naming the file."""
    session = Session.from_recipe(Recipe.load(Path(path)))
    refuse_slices(session, path)
    session.resolved_params()  # unknown method or parameter, out-of-range value
    if session.out_dtype not in OUT_DTYPES:
        raise InputError(f"{path}: unknown out_dtype {session.out_dtype!r}; choose one of {', '.join(OUT_DTYPES)}")
    if session.vocab not in VOCAB_MODES:
        raise InputError(f"{path}: unknown vocab {session.vocab!r}; choose exact or common")
    check_eps(session.eps, f"{path}: eps")
    return session


def refuse_slices(session: Session, path: Path) -> None:
    """The window shows whole-model merges only: a layer map (``slices``) would be lost from the form, and the
    merge would silently become a different one. ``InputError`` pointing to ``ram-merge run``."""
    if session.slices:
        raise InputError(
            f"{path}: slices (layer ranges or layer stacking) cannot be shown in the window yet; "
            f"run it with: ram-merge run {path} --out DIR"
        )


def write_from_recipe(window: Any, path: Path, write: Callable[[Recipe, Path], None], doing: str, what: str) -> bool:
    """``write(recipe, path)`` with the window's current recipe (saving it, exporting it); False, with a readable
    message in the window, when the sources are incomplete (``doing``: what needs them) or writing ``what`` fails."""
    if window.sources.base is None or not window.sources.agents:
        window.show_error(f"add a base and at least one agent before {doing}")
        return False
    try:
        write(window.current_recipe(), Path(path))
    except InputError as e:
        window.show_error(str(e))
        return False
    except OSError as e:
        window.show_error(f"{path}: cannot write {what} ({e.strerror})")
        return False
    return True


class NotReplaceable(InputError):
    """The output folder holds files RAM Desktop did not write: refused, never replaced; ``free`` may be used instead."""

    def __init__(self, out: Path, free: Path) -> None:
        super().__init__(
            f"output folder {out} holds files that RAM Desktop did not write, and they are never "
            f"replaced; choose a new folder (such as {free.name})"
        )
        self.out, self.free = out, free


def merge_request(
    session: Session,
    inputs: list[Checkpoint],
    confirm_replace: Callable[[Path], bool],
    token: str | None,
    chunk_elements: int,
) -> MergeRequest | None:
    """The engine's request for merging ``session``; None when its output folder holds an earlier RAM Desktop
    output and ``confirm_replace(folder)`` says not to replace it. Raises ``InputError`` before asking anything
    (no output folder, an output that is or holds an input, a bad value) and ``NotReplaceable`` for a folder
    holding anything else (the engine's own rules: ``check_apart``, ``is_earlier_output``)."""
    if not session.out:
        raise InputError("choose an output folder (section 3) before merging")
    out = Path(session.out).expanduser()
    resolved = check_apart(out, inputs)
    overwrite = resolved.is_dir() and any(resolved.iterdir())
    if overwrite and not is_earlier_output(resolved):
        raise NotReplaceable(out, free_folder(out))
    if overwrite and not confirm_replace(out):
        return None
    return session.to_request(out, overwrite=overwrite, token=token, chunk_elements=chunk_elements)


def run_probe(session: Session, chunk_elements: int, token: str | None, reporter: Reporter) -> ProbeReport:
    """The analysis (probe pass) of ``session``'s sources."""
    return probe(
        session.base,
        session.agents,
        session.names,
        session.eps,
        session.device,
        reporter,
        chunk_elements=chunk_elements,
        token=token,
        vocab=session.vocab,
    )


def run_merge(request: MergeRequest, reporter: Reporter) -> MergeResult:
    """The merge; Fisher merging with calibration suites first estimates (or takes from the cache) each
    agent's Fisher, with its own progress stage."""
    from ...core import get_method

    if get_method(request.method).calibrated:
        from ...evaluate.fisher import resolve_fisher_params

        request.params = resolve_fisher_params(request.method, request.params, request.agents, request.device, reporter)
    return merge(request, reporter)
