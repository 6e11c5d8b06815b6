"""The layering rules of docs/architecture.md, checked on the source: no import cycle anywhere in
``ram_desktop`` (imports at module level, inside functions and under ``if TYPE_CHECKING:`` alike)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ram_desktop"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ``ram_desktop`` modules ``name`` imports anywhere in its source (``from X import Y`` counts
    as an import of ``X.Y`` when that is a module, else of ``X``). Imports under ``if TYPE_CHECKING:``
    count too: a cycle that only a type checker walks is still two modules that need each other."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("ram_desktop"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    found.discard(name)
    return {m for m in found if m in modules}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_walker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles_in_ram_desktop():
    modules = all_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert (
        "ram_desktop.core.storage.formats.base" in graph["ram_desktop.core.ecosystem.hub.source"]
    )  # the walker sees imports
    assert "ram_desktop.core.ecosystem.hub.source" in graph["ram_desktop.core.sources"]  # ... function-level ones too
    assert "ram_desktop.core.engine.kernels" in graph["ram_desktop.core.engine.probe"]  # ... and TYPE_CHECKING ones
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_no_two_public_classes_share_a_name():
    """Every public class defined at module level in ``ram_desktop`` has a name no other module's class has: a
    name read in a traceback, a doc or an import means one thing (``core.Variant``, a comparison's spec delta,
    was once also the engine's pass output). Private classes (``_Parser``) are never imported, so they may repeat."""
    where: dict[str, list[str]] = {}
    for name, path in sorted(all_modules().items()):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(name)
    assert "MergeSpec" in where  # the walker sees the classes
    shared = {cls: modules for cls, modules in where.items() if len(modules) > 1}
    assert not shared, f"classes defined in more than one module: {shared}"


def test_core_never_imports_the_faces():
    modules = all_modules()
    for name, path in modules.items():
        if name.startswith(("ram_desktop.core", "ram_desktop.evaluate")):
            faces = {m for m in imports_of(name, path, modules) if m.startswith(("ram_desktop.gui", "ram_desktop.cli"))}
            assert not faces, f"{name} imports {faces}"
            assert "PySide6" not in path.read_text(), name


# The rooms of the core (docs/architecture.md): who may import whom. Shared modules (errors, events,
# lazy, defaults, and the guarded reader storage/safe_read that every room reads files through) sit below
# every room; the entry layer (pipeline, session, recipe, sources) above.
CORE = "ram_desktop.core"
SHARED = {f"{CORE}.errors", f"{CORE}.events", f"{CORE}.lazy", f"{CORE}.defaults", f"{CORE}.storage.safe_read"}
ENTRY = {f"{CORE}.pipeline", f"{CORE}.spec", f"{CORE}.variant", f"{CORE}.recipe", f"{CORE}.sources"}


def _room_imports(prefix: str) -> dict[str, set[str]]:
    modules = all_modules()
    return {
        name: imports_of(name, path, modules)
        for name, path in modules.items()
        if name == prefix or name.startswith(prefix + ".")
    }


def _in(module: str, room: str) -> bool:
    return module == f"{CORE}.{room}" or module.startswith(f"{CORE}.{room}.")


def test_storage_knows_files_not_merges():
    """storage/ imports only itself and the shared modules: no engine, method, ecosystem or entry."""
    for name, found in _room_imports(f"{CORE}.storage").items():
        bad = {m for m in found if not _in(m, "storage") and m not in SHARED}
        assert not bad, f"{name} imports {bad}"


def test_engine_and_methods_never_reach_the_ecosystem_or_the_entry_layer():
    for room in ("engine", "methods"):
        for name, found in _room_imports(f"{CORE}.{room}").items():
            bad = {m for m in found if _in(m, "ecosystem") or m in ENTRY}
            assert not bad, f"{name} imports {bad}"


def test_the_engine_never_imports_the_methods():
    """The methods build on the engine (its contract types, primitives and kernels), never the other way:
    passes read a method through ``engine.contracts``, so no engine module imports ``core.methods``."""
    found = _room_imports(f"{CORE}.engine")
    assert f"{CORE}.engine.contracts" in found[f"{CORE}.engine.passes"]  # the walker sees the engine's imports
    for name, imported in found.items():
        bad = {m for m in imported if _in(m, "methods")}
        assert not bad, f"{name} imports {bad}"


def test_the_ecosystem_never_imports_the_orchestration():
    for name, found in _room_imports(f"{CORE}.ecosystem").items():
        bad = {m for m in found if m in {f"{CORE}.pipeline", f"{CORE}.variant"}}
        assert not bad, f"{name} imports {bad}"


def test_core_never_imports_evaluate():
    for name, found in _room_imports(CORE).items():
        bad = {m for m in found if m.startswith("ram_desktop.evaluate")}
        assert not bad, f"{name} imports {bad}"


def test_the_guarded_reader_leans_only_on_the_errors():
    """storage/safe_read is shared (compute reads its runtime folder's marker through it at start-up): it
    imports no other room, nor the rest of storage."""
    (imported,) = _room_imports(f"{CORE}.storage.safe_read").values()
    assert imported == {f"{CORE}.errors"}


def test_the_application_layer_sits_above_core_and_evaluate():
    """``workflow`` (calibrate -> merge -> evaluate -> compare) is called by the faces and calls core and evaluate;
    core and evaluate never import it, and it never imports a face."""
    modules = all_modules()
    assert "ram_desktop.workflow" in modules
    for name, path in modules.items():
        if name.startswith(("ram_desktop.core", "ram_desktop.evaluate")):
            assert "ram_desktop.workflow" not in imports_of(name, path, modules), name
    found = imports_of("ram_desktop.workflow", modules["ram_desktop.workflow"], modules)
    assert not {m for m in found if m.startswith(("ram_desktop.gui", "ram_desktop.cli"))}, found
    assert not {m for m in found if m.startswith(CORE + ".")}, "workflow reaches the core through its API"
    for face in ("ram_desktop.cli", "ram_desktop.gui.method.spec_form", "ram_desktop.gui.evaluate.compare_panel"):
        assert "ram_desktop.workflow" in imports_of(face, modules[face], modules), face


def test_the_window_never_sets_the_engines_thread_state():
    """What the window tunes in the engine is a run option (``RunOptions``), never a thread-local it sets."""
    for path in (PACKAGE / "gui").rglob("*.py"):
        text = path.read_text()
        assert "kernels.disabled" not in text and "engine import kernels" not in text, path


def test_compute_imports_only_itself_and_the_shared_modules():
    """core/compute/ runs at start-up before torch: it leans on nothing but the shared modules and paths."""
    found = _room_imports(f"{CORE}.compute")
    assert found, "core/compute/ is missing"
    for name, imported in found.items():
        bad = {m for m in imported if not _in(m, "compute") and m not in SHARED and m != "ram_desktop.paths"}
        assert not bad, f"{name} imports {bad}"


# The faces and evaluate reach the core through its public API (``ram_desktop.core``: names loaded lazily)
# and its defaults; these modules are the documented exceptions (docs/architecture.md): the charts' data
# helpers, guarded file reading, the Fisher estimate's output folder, the kernels' warm-up, the Hub dialog.
API_EXCEPTIONS = {
    f"{CORE}.defaults",
    f"{CORE}.engine.inspection",
    f"{CORE}.methods.would_keep",  # the Analyze charts' data
    f"{CORE}.storage.safe_read",  # guarded reads of suites, reports and manifests
    f"{CORE}.storage.output",
    f"{CORE}.storage.formats.safetensors_format",
    f"{CORE}.methods.fisher",  # fisher out
    f"{CORE}.storage.manifest",  # what an output folder holds that we wrote (compare, evaluation, saved charts)
    f"{CORE}.engine.kernels",  # the worker compiles the kernels ahead of the first merge
    f"{CORE}.ecosystem.hub.source",  # the Hub dialog's lookups
    # the compute set-up (docs/compute.md): its own small API, used at start-up before torch is imported
    f"{CORE}.compute",
    f"{CORE}.compute.runtime",
    f"{CORE}.compute.builds",
    f"{CORE}.compute.detect",
    f"{CORE}.compute.install",
    f"{CORE}.compute.summary",
}


def test_faces_and_evaluate_import_the_core_through_its_api():
    modules = all_modules()
    for name, path in modules.items():
        if not (name == "ram_desktop.cli" or name.startswith(("ram_desktop.gui.", "ram_desktop.evaluate"))):
            continue
        found = imports_of(name, path, modules)
        bad = {m for m in found if m.startswith(CORE + ".") and m not in API_EXCEPTIONS}
        assert not bad, f"{name} imports {sorted(bad)}; import from ram_desktop.core (its __init__ lists the API)"


LAZY_MODULES = {"ram_desktop.core": "core/__init__.py", "ram_desktop.evaluate": "evaluate/__init__.py"}
LAZY_MODULES["ram_desktop.workflow"] = "workflow.py"


def _typed_imports(relative: str) -> list[tuple[str, str, str | None, str]]:
    """(name, as-name, module, level dots) of every import under the file's ``if TYPE_CHECKING:`` blocks."""
    found = []
    for node in ast.parse((PACKAGE / relative).read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.ImportFrom):
                    found += [(a.name, a.asname, stmt.module, "." * stmt.level) for a in stmt.names]
    return found


@pytest.mark.parametrize("name", sorted(LAZY_MODULES))
def test_a_lazy_api_is_one_list_the_type_checker_reads_too(name):
    """core, evaluate and workflow name what they load on first use once: the imports their ``TYPE_CHECKING``
    block writes as themselves (``import X as X``). Each such name is in ``__all__``, in ``dir()``, and is the
    object its import names; in a package's ``__init__`` every import there is one (a plain import would be seen
    by the type checker and missing at run time); and a name not listed is an AttributeError."""
    import importlib

    module = importlib.import_module(name)
    typed = _typed_imports(LAZY_MODULES[name])
    exported = {alias: (dots, source) for real, alias, source, dots in typed if alias == real}
    assert exported
    if LAZY_MODULES[name].endswith("__init__.py"):
        assert all(alias == real for real, alias, _, _ in typed), [t for t in typed if t[0] != t[1]]
    assert set(exported) <= set(module.__all__) and set(exported) <= set(dir(module))
    package = name if LAZY_MODULES[name].endswith("__init__.py") else name.rpartition(".")[0]
    for attr, (dots, source) in exported.items():
        defining = importlib.import_module(dots + (source or ""), package)
        assert getattr(module, attr) is getattr(defining, attr), (name, attr)
    with pytest.raises(AttributeError, match="no attribute 'NotAnExport'"):
        module.NotAnExport  # noqa: B018


def test_the_window_stays_in_small_parts():
    """No GUI module over 500 lines and the main window's class under 400 (as ``ruff format`` writes them):
    a panel that outgrows this is split into a widget module of its own."""
    sizes = {str(path): len(path.read_text().splitlines()) for path in (PACKAGE / "gui").rglob("*.py")}
    assert not {name: n for name, n in sizes.items() if n > 500}, sizes
    tree = ast.parse((PACKAGE / "gui" / "main_window.py").read_text())
    (window,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MainWindow"]
    assert window.end_lineno is not None and window.end_lineno - window.lineno + 1 < 400


def test_the_gui_is_in_rooms():
    """gui/ holds the window's frame (application, main window, menus, jobs, worker …) and at most 12 modules
    in all; every area of the window is a room of its own, and the test harnesses live apart."""
    gui = PACKAGE / "gui"
    top = sorted(p.name for p in gui.glob("*.py"))
    assert len(top) <= 12, top
    rooms = {p.name for p in gui.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {"sources", "analysis", "method", "run", "evaluate", "compute", "widgets", "harness"} <= rooms, rooms
    for room in rooms:
        assert (gui / room / "__init__.py").read_text().startswith('"""'), f"room {room} says what it holds"


# ---- the faces' one door (docs/architecture.md, "The faces and the application layer") -----------------------

EVALUATE = "ram_desktop.evaluate"
# The steps below ``workflow``: a face imports none of these modules, and none of the names the core's and
# evaluate's APIs load from them, except the core's result types (classes).
STEP_MODULES = {
    f"{CORE}.pipeline",
    f"{EVALUATE}.runner",
    f"{EVALUATE}.search",
    f"{EVALUATE}.compare",
    f"{EVALUATE}.fisher",
    f"{EVALUATE}.vllm_backend",
}
# What a face may import besides the faces themselves (``cli``, ``compute_cli``, ``gui``): the application
# layer; the core's public API and its documented helper modules (API_EXCEPTIONS); evaluate's public API and
# the modules of its data types (results, the score cache, the scores chart's one description); the package's
# version and the user folders.
FACE_MAY_IMPORT = {
    "ram_desktop",
    "ram_desktop.paths",
    "ram_desktop.workflow",
    CORE,
    *API_EXCEPTIONS,
    EVALUATE,
    f"{EVALUATE}.results",
    f"{EVALUATE}.cache",
    f"{EVALUATE}.chart",
}


def _is_face(name: str) -> bool:
    return name in ("ram_desktop.cli", "ram_desktop.compute_cli") or name.startswith("ram_desktop.gui.")


def imported_names(name: str, path: Path) -> list[tuple[str, str]]:
    """(module, name) for every ``from MODULE import NAME`` of a ``ram_desktop`` module in ``name``'s source
    (relative imports resolved as ``imports_of`` resolves them; function-level and TYPE_CHECKING ones too)."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found += [(target, alias.name) for alias in node.names if target.startswith("ram_desktop")]
    return found


def _step_names() -> dict[str, set[str]]:
    """The names the core's and evaluate's APIs load from a step module, the core's classes (result types)
    left out: what a face must reach through ``workflow``."""
    import importlib

    from ram_desktop import core, evaluate

    steps: dict[str, set[str]] = {}
    for package in (core, evaluate):
        relative = LAZY_MODULES[package.__name__]
        exports = {real: (source or "") for real, alias, source, _ in _typed_imports(relative) if alias == real}
        steps[package.__name__] = {
            name
            for name, module in exports.items()
            if f"{package.__name__}.{module}" in STEP_MODULES
            and not (package is core and isinstance(getattr(importlib.import_module(f"{CORE}.{module}"), name), type))
        }
    return steps


def test_the_faces_reach_every_step_through_workflow():
    """The command line and the window import ``workflow`` (analyse, calibrate, merge, evaluate, compare, search,
    fisher), the core's public API and evaluate's data types, never a step's own module (``core.pipeline``,
    evaluate's ``runner``, ``search``, ``compare``, ``fisher``, ``vllm_backend``) nor a name the APIs load from one."""
    modules = all_modules()
    steps = _step_names()
    assert {"merge", "merge_variants", "probe"} <= steps[CORE] and "MergeResult" not in steps[CORE]
    assert {"evaluate", "model_refs"} <= steps[EVALUATE]
    faces = {name: path for name, path in modules.items() if _is_face(name)}
    assert "ram_desktop.gui.evaluate.search_panel" in faces and "ram_desktop.compute_cli" in faces
    for name, path in faces.items():
        found = imports_of(name, path, modules)
        bad = {m for m in found if not _is_face(m) and m not in FACE_MAY_IMPORT}
        assert not bad, f"{name} imports {sorted(bad)}; call the step through ram_desktop.workflow"
        reached = {f"{module}.{n}" for module, n in imported_names(name, path) if n in steps.get(module, ())}
        assert not reached, f"{name} imports {sorted(reached)}; call the step through ram_desktop.workflow"
    for face in ("ram_desktop.cli", "ram_desktop.gui.evaluate.panel", "ram_desktop.gui.evaluate.search_panel"):
        assert "ram_desktop.workflow" in imports_of(face, modules[face], modules), face


def _gui_room(name: str) -> str | None:
    """The room (``gui/<room>/``) a module of the window lives in; None for the window's frame (``gui/*.py``)."""
    parts = name.split(".")
    return parts[2] if len(parts) >= 4 and parts[:2] == ["ram_desktop", "gui"] else None


def test_no_room_of_the_window_imports_another_rooms_panel():
    """A panel (a module defining a ``...Panel`` class) is imported by its own room and the window's frame
    (``main_window`` lays the panels out), never by another room: what a room needs of another is passed in."""
    modules = all_modules()
    panels = {
        name
        for name, path in modules.items()
        if _gui_room(name) is not None
        and any(isinstance(n, ast.ClassDef) and n.name.endswith("Panel") for n in ast.parse(path.read_text()).body)
    }
    assert {"ram_desktop.gui.sources.panel", "ram_desktop.gui.method.panel"} <= panels, panels
    for name, path in modules.items():
        room = _gui_room(name)
        if room is None:
            continue
        bad = {m for m in imports_of(name, path, modules) if m in panels and _gui_room(m) != room}
        assert not bad, f"{name} (room {room}) imports {sorted(bad)}"


def test_no_panel_imports_another_panel():
    """A panel shares what others need through the window's session model (``gui/session.py``), not through
    another panel's widgets: no module defining a ``...Panel`` class imports another such module, and the
    session model needs no Qt (it is the part a test or a script drives without a window)."""
    modules = all_modules()
    panels = {
        name
        for name, path in modules.items()
        if name.startswith("ram_desktop.gui.")
        and any(isinstance(n, ast.ClassDef) and n.name.endswith("Panel") for n in ast.parse(path.read_text()).body)
    }
    assert {"ram_desktop.gui.evaluate.panel", "ram_desktop.gui.evaluate.compare_panel"} <= panels, panels
    for name in sorted(panels):
        bad = imports_of(name, modules[name], modules) & (panels - {name})
        assert not bad, f"{name} imports the panel module(s) {sorted(bad)}"
    session = modules["ram_desktop.gui.session"]
    assert not any("PySide6" in m for m in _imported_names(session)), "the session model imports Qt"


# what the method form shows: its widgets and the readers of them (``gui/method/``); the rest of the window reads
# and writes the merge being drafted through the session (``session.draft``, docs/gui.md)
METHOD_FORM_WIDGETS = {
    "method",
    "current",
    "fields",
    "params",
    "eps",
    "eps_value",
    "device",
    "out_dtype",
    "vocab",
    "tokenizer",
    "tokenizer_settings",
    "chat_template",
    "shard_size",
    "out_dir",
    "layer_map",
    "slices",
}


def test_only_the_method_room_reads_the_method_forms_widgets():
    """Outside ``gui/method/`` nothing reads or sets the method form's widgets (``<x>.method.<widget>``): a merge,
    a recipe, Compare and Search take the spec made from the session (its sources and its draft), and what
    changes the form from elsewhere (a recipe opened, a search's best trial, the device remembered, a fix offered)
    writes the session's draft, which the form shows."""
    bad = []
    for name, path in all_modules().items():
        if not name.startswith("ram_desktop.gui.") or name.startswith("ram_desktop.gui.method."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in METHOD_FORM_WIDGETS
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "method"
            ):
                bad.append(f"{name}:{node.lineno} .method.{node.attr}")
    assert not bad, bad


def _imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
    return names


# the words of one method family's own bookkeeping (RAM+'s rounding survival of its λ rescale): a method computes
# it behind its observer, so the contracts the passes read never name it
METHOD_BOOKKEEPING = {"survival", "rescale", "rescaled", "lambda", "lambdas"}


def _code_words(tree: ast.AST) -> set[str]:
    """Every word of ``tree``'s code, lower case: identifiers (names, attributes, definitions, arguments, split at
    underscores too) and the words of its strings, docstrings left out (prose may mention anything)."""
    import re

    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    words: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            # the package's own name (the logger's "ram_desktop", RAM_DESKTOP_...) is never split: its "ram" is no method
            words.update(re.findall(r"[\w+-]+", node.value.lower()))
        elif isinstance(node, ast.Name):
            words.add(node.id.lower())
        elif isinstance(node, ast.Attribute):
            words.add(node.attr.lower())
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words.add(node.name.lower())
        elif isinstance(node, ast.arg):
            words.add(node.arg.lower())
    return words | {p for w in words for p in w.replace(PACKAGE.name, "_").split("_")}


def _engine_contracts() -> dict[str, ast.AST]:
    """What the passes read of a method and what its fused kernel hands back: ``core/engine/contracts.py`` and
    ``kernels.KernelResult``."""
    kernels = ast.parse((PACKAGE / "core" / "engine" / "kernels.py").read_text())
    (result,) = [n for n in kernels.body if isinstance(n, ast.ClassDef) and n.name == "KernelResult"]
    return {
        "core/engine/contracts.py": ast.parse((PACKAGE / "core" / "engine" / "contracts.py").read_text()),
        "kernels.KernelResult": result,
    }


def test_the_engines_contracts_name_no_method():
    """The engine's contracts (``core/engine/contracts.py``, what the passes read of a method, and the fused kernels'
    ``KernelResult``) name no method and none of a method's own bookkeeping: no string in their code and no
    identifier is a method's name or a word of ``METHOD_BOOKKEEPING`` (docstrings may mention one in prose)."""
    from ram_desktop.core import METHODS

    names = set(METHODS) | {m.replace("-", "_") for m in METHODS}
    for where, tree in _engine_contracts().items():
        words = _code_words(tree)
        named = sorted(names & words)
        assert not named, f"{where} names the methods {named}"
        kept = sorted(METHOD_BOOKKEEPING & words)
        assert not kept, f"{where} names a method's own bookkeeping: {kept}"


# the engine's probe: the statistics module, the fused kernels that count it and the passes that run it. The probe
# runs with no method chosen; a method's statistic of it (RAM+'s λ* histograms) comes in as a
# ``contracts.ProbeStatistic``, so none of these names one
ENGINE_PROBE = ("probe.py", "kernels.py", "kernel_code.py", "passes.py")


def test_the_engines_probe_and_kernels_name_no_method():
    """``core/engine/probe.py``, ``kernels.py``, ``kernel_code.py`` and ``passes.py`` name no method and none of a
    method's own bookkeeping in their code (identifiers and strings; docstrings may mention one in prose), as the
    contracts above: the probe's statistics of a method, its kernel pieces and its file keys live in the method."""
    from ram_desktop.core import METHODS

    names = set(METHODS) | {m.replace("-", "_") for m in METHODS}
    for file in ENGINE_PROBE:
        words = _code_words(ast.parse((PACKAGE / "core" / "engine" / file).read_text()))
        assert "np" in words  # the walker reads the file's code
        named = sorted(names & words)
        assert not named, f"core/engine/{file} names the methods {named}"
        kept = sorted(METHOD_BOOKKEEPING & words)
        assert not kept, f"core/engine/{file} names a method's own bookkeeping: {kept}"


def test_the_contract_words_check_sees_a_named_method():
    """The check above finds a method's name and a bookkeeping word in code (so its pass means something)."""
    code = ast.parse('def kernel(slices, survival: bool):\n    """RAM+\'s counts."""\n    return {"ram-plus": 1}\n')
    words = _code_words(code)
    assert {"ram-plus", "survival", "kernel"} <= words and "counts" not in words
    # the package's name is not the method "ram"; a word that starts with the method's name is
    package = _code_words(ast.parse('log = getLogger("ram_desktop")\nram_rescale = 1\n'))
    assert "ram_desktop" in package and "rescale" in package and "ram" in package
    assert "ram" not in _code_words(ast.parse('log = getLogger("ram_desktop")\nenviron["RAM_DESKTOP_KERNELS"]\n'))
