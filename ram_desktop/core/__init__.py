"""Headless merge engine: torch, safetensors and huggingface_hub only — never Qt.

The public API of the core, what the faces (``cli``, ``gui``) and ``evaluate`` import instead of reaching into
its rooms (docs/architecture.md). Every name is loaded on first use (module ``__getattr__``), so importing the
core stays cheap: ``ram-merge --help`` never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__)

# The API: every name imported here as itself is loaded on first use (``lazy_exports``); the type checker reads
# the same imports.
if TYPE_CHECKING:
    from .code_folders import new_code_folders as new_code_folders, remember_code_folders as remember_code_folders
    from .demo import (
        demo_suites as demo_suites,
        ensure_demo as ensure_demo,
        read_manifest as read_manifest,
        write_demo as write_demo,
    )
    from .devices import list_devices as list_devices, resolve_device as resolve_device
    from .ecosystem.cards.evaluation import MERGE_REPORT as MERGE_REPORT, record_evaluation as record_evaluation
    from .ecosystem.hub.publish import (
        check_repo_id as check_repo_id,
        has_stored_token as has_stored_token,
        publish as publish,
    )
    from .ecosystem.mergekit import (
        is_mergekit_file as is_mergekit_file,
        load_mergekit as load_mergekit,
        load_recipe_or_mergekit as load_recipe_or_mergekit,
        to_mergekit as to_mergekit,
    )
    from .engine.chunks import DEFAULT_CHUNK_ELEMENTS as DEFAULT_CHUNK_ELEMENTS
    from .engine.plan import OUT_DTYPES as OUT_DTYPES, VOCAB_MODES as VOCAB_MODES, check_fits as check_fits
    from .engine.probe import ProbeReport as ProbeReport
    from .errors import (
        Cancelled as Cancelled,
        ComputeError as ComputeError,
        DeviceOutOfMemory as DeviceOutOfMemory,
        HubError as HubError,
        InputError as InputError,
        ParameterError as ParameterError,
        RamError as RamError,
        first_line as first_line,
    )
    from .events import (
        CancelToken as CancelToken,
        ProgressEvent as ProgressEvent,
        Reporter as Reporter,
        human_bytes as human_bytes,
    )
    from .frozen import thaw as thaw
    from .methods import (
        METHODS as METHODS,
        SEARCH_METHODS as SEARCH_METHODS,
        SEARCH_REFERENCES as SEARCH_REFERENCES,
        MergeMethod as MergeMethod,
        Param as Param,
        Sweep as Sweep,
        get_method as get_method,
    )
    from .methods.advice import Advice as Advice, advise as advise
    from .methods.ram_rescale import (
        SURVIVAL_DTYPES as SURVIVAL_DTYPES,
        survival_histograms as survival_histograms,
        survival_share as survival_share,
    )
    from .methods.settings import setting_value as setting_value
    from .pipeline import (
        InMemory as InMemory,
        MergeResult as MergeResult,
        check_eps as check_eps,
        merge as merge,
        merge_variants as merge_variants,
        probe as probe,
    )
    from .recipe import parse_size as parse_size
    from .sources import open_checkpoint as open_checkpoint
    from .spec import Agent as Agent, MergeSpec as MergeSpec, RunOptions as RunOptions
    from .storage.formats import Checkpoint as Checkpoint
    from .storage.formats.lora import reuse_deltas as reuse_deltas
    from .storage.formats.registry import weights_file_filter as weights_file_filter
    from .tokenizer import read_chat_template as read_chat_template, read_tokenizer_source as read_tokenizer_source
    from .variant import Variant as Variant, variant_specs as variant_specs
