"""``--backend vllm``: greedy generation through vLLM's offline engine (``vllm.LLM(...).generate``) on a CUDA GPU.

The evaluation stays the runner's (docs/evaluate.md): the same prompt token ids (the model's own tokenizer,
through transformers), the same stop tokens, the same scorers. Only the generation moves to vLLM, as plain
greedy decoding equivalent to the transformers backend's: ``SamplingParams(temperature=0, max_tokens=the
suite's max_new_tokens, stop_token_ids=every end-of-sequence id the runner knows)``, no penalties, one
completion per prompt, the model's own sampling settings ignored (explicit sampling parameters are used as
given). The completion text is decoded by the runner's tokenizer from vLLM's generated token ids, cut at the
first stop token, exactly as the transformers backend decodes its own: what can differ is only the tokens,
where vLLM's kernels (bfloat16, other reduction orders) flip a near-tie (tests/test_vllm_gpu.py states the
tolerance). vLLM is an optional extra (``[vllm]``, vLLM 0.33, CUDA only); without it or without a CUDA GPU
``--backend vllm`` is refused before any work. vLLM is imported here only, and only when asked for.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core import InputError, Reporter, first_line

log = logging.getLogger("ram_desktop")

TRANSFORMERS = "transformers"
VLLM = "vllm"
BACKENDS = (TRANSFORMERS, VLLM)
INSTALL = "pip install 'ram-desktop[vllm]' (vLLM 0.33, on a machine with a CUDA GPU)"


def check_backend(backend: str, device: str = "auto") -> None:
    """Refuse, before any work, a backend this machine cannot run: an unknown name, vLLM not installed, no CUDA
    GPU, or a ``--device`` vLLM does not take (it runs on the first GPU it sees: CUDA_VISIBLE_DEVICES picks)."""
    if backend not in BACKENDS:
        raise InputError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend != VLLM:
        return
    if importlib.util.find_spec("vllm") is None:
        raise InputError(f"--backend vllm needs vLLM, which is not installed: {INSTALL}")
    import torch

    if not torch.cuda.is_available():
        raise InputError(
            f"--backend vllm needs a CUDA GPU and torch {torch.__version__} sees none; use --backend transformers"
        )
    text = str(device).strip().lower()
    if text not in ("auto", "cuda", "cuda:0"):
        raise InputError(
            f"--backend vllm runs on the first CUDA GPU it sees, not --device {device}; use --device auto or cuda "
            "(set CUDA_VISIBLE_DEVICES to choose the GPU)"
        )


def version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


@contextlib.contextmanager
def engine(folder: Path, name: str) -> Iterator[Any]:
    """vLLM's offline engine on the model folder (bfloat16, as the transformers backend on CUDA; never the
    repository's own code); shut down and freed on exit. Whatever vLLM raises while loading names the model."""
    from vllm import LLM

    try:
        llm = LLM(model=str(folder), tokenizer=str(folder), dtype="bfloat16", seed=0, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001  whatever vLLM raises, the model is named (docs/evaluate.md)
        raise InputError(
            f"model {name} ({folder}): vLLM cannot load it ({type(e).__name__}: {first_line(e)})"
        ) from None
    try:
        yield llm
    finally:
        _shut_down(llm)
        del llm
        gc.collect()
        import torch

        torch.cuda.empty_cache()


def _shut_down(llm: Any) -> None:
    """Stop the engine's own processes so that the next model finds the GPU memory free (vLLM frees it only then)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    shutdown = getattr(core, "shutdown", None)
    if callable(shutdown):
        with contextlib.suppress(Exception):  # already stopped, or a vLLM without it
            shutdown()


def sampling_params(max_new_tokens: int, stops: list[int]) -> Any:
    """Plain greedy decoding, as the transformers backend's ``GenerationConfig(do_sample=False, num_beams=1)``."""
    from vllm import SamplingParams

    return SamplingParams(
        n=1,
        temperature=0.0,
        top_p=1.0,
        top_k=-1,
        min_p=0.0,
        repetition_penalty=1.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        max_tokens=max_new_tokens,
        stop_token_ids=list(stops),
        skip_special_tokens=True,
    )


def generate(
    llm: Any,
    stops: list[int],
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int,
    reporter: Reporter,
    where: str,
) -> Iterator[tuple[list[int], list[list[int]]]]:
    """Greedy completions, ``batch_size`` prompts handed to vLLM at a time (it schedules them itself): yields
    (example indices, generated token ids) per batch; the runner decodes them as it decodes its own
    (``runner.completions``), so that progress, cancelling and scoring while the next batch generates work alike."""
    params = sampling_params(max_new_tokens, stops)
    for first in range(0, len(prompts), batch_size):
        reporter.check()
        indices = list(range(first, min(first + batch_size, len(prompts))))
        try:
            outputs = llm.generate([{"prompt_token_ids": prompts[i]} for i in indices], params, use_tqdm=False)
        except Exception as e:  # noqa: BLE001  whatever vLLM raises mid-run, the model and suite are named
            raise InputError(f"{where}: vLLM generation failed ({type(e).__name__}: {first_line(e)})") from None
        yield indices, [list(output.outputs[0].token_ids) for output in outputs]
