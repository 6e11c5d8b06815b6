"""Headless merge engine: torch, safetensors and huggingface_hub only — never Qt.

The public API of the core, what the faces (``cli``, ``gui``) and ``evaluate`` import instead of reaching into
its rooms (docs/architecture.md). Every name is loaded on first use (module ``__getattr__``), so importing the
core stays cheap: ``ram-merge --help`` never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

# name → the module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    # a merge end to end, and what the faces fill
    "MergeSpec": "spec",
    "Agent": "spec",
    "RunOptions": "spec",
    "thaw": "frozen",
    "Variant": "variant",
    "variant_specs": "variant",
    "parse_size": "recipe",
    "MergeResult": "pipeline",
    "InMemory": "pipeline",
    "merge": "pipeline",
    "merge_variants": "pipeline",
    "probe": "pipeline",
    "check_eps": "pipeline",
    "list_devices": "devices",
    "resolve_device": "devices",
    "open_checkpoint": "sources",
    "reuse_deltas": "storage.formats.lora",
    # the methods
    "METHODS": "methods",
    "SEARCH_METHODS": "methods",
    "SEARCH_REFERENCES": "methods",
    "MergeMethod": "methods",
    "Param": "methods",
    "Sweep": "methods",
    "get_method": "methods",
    "setting_value": "methods.settings",
    "Advice": "methods.advice",
    "advise": "methods.advice",
    # RAM+'s rounding survival, read off the probe's λ* histograms
    "SURVIVAL_DTYPES": "methods.ram_rescale",
    "survival_histograms": "methods.ram_rescale",
    "survival_share": "methods.ram_rescale",
    # what the probe reports, and the plan's choices
    "ProbeReport": "engine.probe",
    "OUT_DTYPES": "engine.plan",
    "VOCAB_MODES": "engine.plan",
    "check_fits": "engine.plan",
    "DEFAULT_CHUNK_ELEMENTS": "engine.chunks",
    "read_tokenizer_source": "tokenizer",
    "read_chat_template": "tokenizer",
    # errors and events
    "RamError": "errors",
    "InputError": "errors",
    "ParameterError": "errors",
    "Cancelled": "errors",
    "HubError": "errors",
    "ComputeError": "errors",
    "DeviceOutOfMemory": "errors",
    "first_line": "errors",
    "Reporter": "events",
    "ProgressEvent": "events",
    "CancelToken": "events",
    # the built-in demo
    "write_demo": "demo",
    "read_manifest": "demo",
    "ensure_demo": "demo",
    "demo_suites": "demo",
    # folders whose Python code (a suite's python scorer) the user has been told runs
    "new_code_folders": "code_folders",
    "remember_code_folders": "code_folders",
    # the ecosystem: mergekit configs, publishing, the evaluation card
    "to_mergekit": "ecosystem.mergekit",
    "load_mergekit": "ecosystem.mergekit",
    "is_mergekit_file": "ecosystem.mergekit",
    "load_recipe_or_mergekit": "ecosystem.mergekit",
    "publish": "ecosystem.hub.publish",
    "check_repo_id": "ecosystem.hub.publish",
    "has_stored_token": "ecosystem.hub.publish",
    "record_evaluation": "ecosystem.cards.evaluation",
    "MERGE_REPORT": "ecosystem.cards.evaluation",
    # storage the faces show or check
    "Checkpoint": "storage.formats",
    "weights_file_filter": "storage.formats.registry",
    "human_bytes": "events",
}

__all__ = [  # the names of _EXPORTS
    "DEFAULT_CHUNK_ELEMENTS",
    "MERGE_REPORT",
    "METHODS",
    "OUT_DTYPES",
    "SEARCH_METHODS",
    "SEARCH_REFERENCES",
    "SURVIVAL_DTYPES",
    "VOCAB_MODES",
    "Advice",
    "Agent",
    "CancelToken",
    "Cancelled",
    "Checkpoint",
    "ComputeError",
    "DeviceOutOfMemory",
    "HubError",
    "InMemory",
    "InputError",
    "MergeMethod",
    "MergeResult",
    "MergeSpec",
    "Param",
    "ParameterError",
    "ProbeReport",
    "ProgressEvent",
    "RamError",
    "Reporter",
    "RunOptions",
    "Sweep",
    "Variant",
    "advise",
    "check_eps",
    "check_fits",
    "check_repo_id",
    "demo_suites",
    "ensure_demo",
    "first_line",
    "get_method",
    "has_stored_token",
    "human_bytes",
    "is_mergekit_file",
    "list_devices",
    "load_mergekit",
    "load_recipe_or_mergekit",
    "merge",
    "merge_variants",
    "new_code_folders",
    "open_checkpoint",
    "parse_size",
    "probe",
    "publish",
    "read_chat_template",
    "read_manifest",
    "read_tokenizer_source",
    "record_evaluation",
    "remember_code_folders",
    "resolve_device",
    "reuse_deltas",
    "setting_value",
    "survival_histograms",
    "survival_share",
    "thaw",
    "to_mergekit",
    "variant_specs",
    "weights_file_filter",
    "write_demo",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # what the type checker sees; tests/test_architecture.py keeps _EXPORTS and this in step
    from .code_folders import new_code_folders, remember_code_folders
    from .demo import demo_suites, ensure_demo, read_manifest, write_demo
    from .devices import list_devices, resolve_device
    from .ecosystem.cards.evaluation import MERGE_REPORT, record_evaluation
    from .ecosystem.hub.publish import check_repo_id, has_stored_token, publish
    from .ecosystem.mergekit import is_mergekit_file, load_mergekit, load_recipe_or_mergekit, to_mergekit
    from .engine.chunks import DEFAULT_CHUNK_ELEMENTS
    from .engine.plan import OUT_DTYPES, VOCAB_MODES, check_fits
    from .engine.probe import ProbeReport
    from .errors import (
        Cancelled,
        ComputeError,
        DeviceOutOfMemory,
        HubError,
        InputError,
        ParameterError,
        RamError,
        first_line,
    )
    from .events import CancelToken, ProgressEvent, Reporter, human_bytes
    from .frozen import thaw
    from .methods import METHODS, SEARCH_METHODS, SEARCH_REFERENCES, MergeMethod, Param, Sweep, get_method
    from .methods.advice import Advice, advise
    from .methods.ram_rescale import SURVIVAL_DTYPES, survival_histograms, survival_share
    from .methods.settings import setting_value
    from .pipeline import (
        InMemory,
        MergeResult,
        check_eps,
        merge,
        merge_variants,
        probe,
    )
    from .recipe import parse_size
    from .sources import open_checkpoint
    from .spec import Agent, MergeSpec, RunOptions
    from .storage.formats import Checkpoint
    from .storage.formats.lora import reuse_deltas
    from .storage.formats.registry import weights_file_filter
    from .tokenizer import read_chat_template, read_tokenizer_source
    from .variant import Variant, variant_specs
