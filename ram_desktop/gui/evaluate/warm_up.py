"""Warming up an evaluation's imports in its worker, with the collector paused (the window stays responsive)."""

from __future__ import annotations

import gc
from pathlib import Path


def import_transformers(sources: list[str]) -> None:
    """Import what an evaluation of ``sources`` will use (in the worker, before it starts) with the cyclic
    garbage collector paused. ``transformers``, the models' modules and what generation pulls in (torch's
    dynamo and distributed packages, sympy) make some 350 000 objects, and every full collection that
    triggers scans the whole process while holding the GIL: 0.2-0.6 s in which the window cannot draw.
    Frozen afterwards, these objects stay out of every later collection (the evaluation freezes in the
    same way what exists before its first model, so its own collections stay small). Only a warm-up: a folder transformers cannot read is reported by the evaluation itself."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return  # the evaluation says how to install it
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        import transformers.generation.utils  # noqa: F401
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        for source in sources:
            if (Path(source) / "config.json").is_file():
                try:
                    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(source))]
                except (OSError, ValueError, KeyError):  # the evaluation refuses it with a message naming the folder
                    pass
    finally:
        gc.freeze()  # long-lived: kept out of every later collection (enabling would start a full one now)
        if was_enabled:
            gc.enable()
