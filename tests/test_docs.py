"""The documents the code cites are in the repository, and README's command synopsis matches the parser."""

from __future__ import annotations

import re
from pathlib import Path

from ram_desktop.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
MERGE_ONLY = {
    "--method",
    "--r",
    "--alpha",
    "--scale",
    "--density",
    "--drop",
    "--seed",
    "--ties-scope",
    "--fisher",
    "--fisher-suite",
    "--examples",
    "--out-dtype",
    "--shard-size",
    "--overwrite",
    "--eps",
    "--names",
    "--device",
    "--vocab",
    "--tokenizer-source",
    "--chat-template",
    "--out",
    "--steps",
    "--lr",
    "--weight",
    "--lambda",
    "--t",
    "--normalize",
    "--rescale",
    "--int8-mask",
    "--gamma",
    "--epsilon",
    "--filter-wise",
    "--dtype",
    "--use-base",
    "--nuslerp-flatten",
    "--nuslerp-row-wise",
    "--normalize-weights",
    "--norm-eps",
    "--max-iter",
    "--tol",
    "--select-topk",
}  # what "[merge flags]" stands for in compare's line


def _synopsis() -> dict[str, set[str]]:
    """Each ``ram-merge COMMAND`` of README's command-line block → the flags its lines name."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## The command line", 1)[1].split("```", 2)[1]
    flags: dict[str, set[str]] = {}
    command = None
    for line in block.splitlines():
        line = line.split("#", 1)[0]
        start = re.match(r"ram-merge ([a-z-]+)", line)
        if start:
            command = start.group(1)
        if command:
            flags.setdefault(command, set()).update(re.findall(r"(--[a-z][a-z0-9-]*)", line))
    return flags


def _parser_flags() -> dict[str, set[str]]:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return {
        name: {o for a in p._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
        for name, p in sub.choices.items()
    }


def test_readme_flags_match_the_parser():
    readme, code = _synopsis(), _parser_flags()
    assert set(readme) == set(code), set(readme) ^ set(code)
    for command, flags in readme.items():
        assert flags <= code[command], f"README names {flags - code[command]} for {command}"
        documented = flags | (MERGE_ONLY if command == "compare" else set())
        assert code[command] <= documented, f"README lacks {code[command] - documented} for {command}"


def test_the_package_cites_documents_that_exist():
    cited = set()
    for path in (ROOT / "ram_desktop").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"\bSPEC\b", text.replace('metavar="SPEC"', "")), f"{path} cites SPEC"
        cited.update(re.findall(r"docs/[a-z-]+\.md", text))
    assert cited and all((ROOT / c).is_file() for c in cited), cited


# Where a dotted name in the docs is looked up: written from the package, from a room, or fully qualified.
PREFIXES = (
    "",
    "ram_desktop.",
    "ram_desktop.core.",
    "ram_desktop.core.engine.",
    "ram_desktop.core.methods.",
    "ram_desktop.core.storage.",
    "ram_desktop.core.storage.formats.",
    "ram_desktop.core.ecosystem.",
    "ram_desktop.core.ecosystem.hub.",
    "ram_desktop.core.ecosystem.cards.",
    "ram_desktop.core.compute.",
    "ram_desktop.evaluate.",
    "ram_desktop.gui.",
    "ram_desktop.gui.analysis.",
    "ram_desktop.gui.method.",
    "ram_desktop.gui.evaluate.",
    "ram_desktop.gui.sources.",
    "ram_desktop.gui.run.",
    "ram_desktop.gui.compute.",
    "ram_desktop.gui.widgets.",
    "ram_desktop.gui.harness.",
)
# file names and other dotted words that are not code: a last part that is an extension
EXTENSIONS = {
    "json",
    "yaml",
    "yml",
    "md",
    "py",
    "safetensors",
    "bin",
    "png",
    "csv",
    "txt",
    "db",
    "jsonl",
    "toml",
    "spec",
    "sh",
    "gguf",
    "html",
    "desktop",
    "deb",
    "pt",
    "gz",
    "partial",
    "lock",
    "index",
    "pth",
    "svg",
    "log",
    "ini",
    "cfg",
    "exe",
    "app",
    "dmg",
    "so",
    "whl",
    "zip",
    "jinja",
    "model",
}
# third-party modules a doc may name; resolved by importing them when installed
THIRD_PARTY = {
    "torch",
    "transformers",
    "huggingface_hub",
    "safetensors",
    "numpy",
    "numba",
    "pyqtgraph",
    "PySide6",
    "yaml",
    "optuna",
    "ray",
    "lm_eval",
    "peft",
    "trl",
    "multiprocessing",
    "concurrent",
    "os",
    "sys",
    "subprocess",
    "json",
    "hashlib",
    "signal",
    "importlib",
    "pathlib",
    "tokenizers",
    "datasets",
}


def _symbols() -> dict[str, list[object]]:
    """Every class and function defined in the package, by its own name (docs write `Transfer.send`)."""
    import importlib
    import pkgutil

    import ram_desktop

    index: dict[str, list[object]] = {}
    for info in pkgutil.walk_packages(ram_desktop.__path__, "ram_desktop."):
        if ".resources" in info.name:
            continue
        module = importlib.import_module(info.name)
        for key, value in vars(module).items():
            if getattr(value, "__module__", None) == info.name:
                index.setdefault(key, []).append(value)
    return index


def _walk(obj: object, attrs: list[str]) -> bool:
    import dataclasses
    import typing

    for attr in attrs:
        if isinstance(obj, property) and obj.fget is not None:
            obj = typing.get_type_hints(obj.fget).get("return", object)
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif (
            isinstance(obj, type)
            and dataclasses.is_dataclass(obj)
            and attr in {f.name for f in dataclasses.fields(obj)}
        ):
            hint = typing.get_type_hints(obj).get(attr)
            obj = hint if isinstance(hint, type) else typing.get_args(hint)[0] if typing.get_args(hint) else object
        else:
            return False
    return True


def _resolves(name: str, symbols: dict[str, list[object]]) -> bool:
    import importlib

    parts = name.split(".")
    if parts[-1] in ("weight", "bias") or parts[0] in ("model", "lm_head", "transformer"):
        return True  # a tensor name, not code
    third_party = parts[0] in THIRD_PARTY
    for prefix in ("",) if third_party else PREFIXES:
        full = (prefix + name).split(".")
        for cut in range(len(full), 0, -1):
            module_name = ".".join(full[:cut])
            try:
                module = importlib.import_module(module_name)
            except ImportError as e:
                if third_party and cut == 1:
                    return True  # an optional package that is not installed here: nothing to check against
                missing = getattr(e, "name", None) or ""
                if module_name.startswith("ram_desktop") and not module_name.startswith(missing):
                    raise  # a module of ours that fails to import is a bug, not a doc problem
                continue
            if _walk(module, full[cut:]):
                return True
            break
    if any(_walk(obj, parts[1:]) for obj in symbols.get(parts[0], [])):
        return True
    return any(
        _walk(getattr(importlib.import_module(m), parts[0], None), parts[1:])
        for m in LIBRARY_NAMESPACES
        if hasattr(importlib.import_module(m), parts[0])
    )


def _dotted_names(text: str) -> set[str]:
    names = set()
    for code in re.findall(r"`([^`\n]+)`", text):
        code = code.strip().removesuffix("()")
        if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", code) and code.rsplit(".", 1)[1] not in EXTENSIONS:
            names.add(code)
    return names


LIBRARY_NAMESPACES = ("torch", "huggingface_hub", "PySide6.QtCore", "PySide6.QtWidgets")


def test_dotted_names_in_the_docs_resolve():
    """Every `a.b.c` the docs and README put in code quotes names something that exists (a module, a class, a
    function or a field), so a rename that leaves the docs behind fails here."""
    symbols = _symbols()
    missing = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        bad = sorted(n for n in _dotted_names(path.read_text()) if not _resolves(n, symbols))
        if bad:
            missing[path.name] = bad
    assert not missing, missing
