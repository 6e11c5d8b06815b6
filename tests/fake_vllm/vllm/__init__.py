"""A stand-in for vLLM's offline API, for the boundary test in tests/test_vllm_backend.py only.

It has what ``ram_desktop.evaluate.vllm_backend`` uses of vLLM 0.33 (``LLM(model=..., tokenizer=..., dtype=...,
seed=..., trust_remote_code=...)``, ``SamplingParams(...)``, ``LLM.generate(prompts, params, use_tqdm=...)``
returning one output per prompt with ``.outputs[0].token_ids`` and ``.text``) and generates greedily with
transformers on the CPU, one prompt at a time, recomputing the whole sequence at every step (no batching, no
padding, no cache: nothing shared with the runner's own generation). Every construction and call is appended to
the JSON-lines file ``FAKE_VLLM_LOG`` names, so that the test sees what crossed the boundary.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

__version__ = "0.33.0+fake"


def _log(record: dict) -> None:
    path = os.environ.get("FAKE_VLLM_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


class SamplingParams:
    def __init__(self, **given) -> None:
        known = {
            "n": 1,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "max_tokens": 16,
            "stop_token_ids": None,
            "skip_special_tokens": True,
        }
        unknown = set(given) - set(known)
        if unknown:
            raise TypeError(f"SamplingParams got unexpected keyword(s) {sorted(unknown)}")
        self.__dict__.update({**known, **given})


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int] = field(default_factory=list)


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]


class LLM:
    def __init__(self, model: str, tokenizer: str | None = None, dtype: str = "auto", seed: int = 0, **more) -> None:
        _log({"call": "LLM", "model": model, "tokenizer": tokenizer, "dtype": dtype, "seed": seed, **more})
        # float32 on the CPU stands in for vLLM's bfloat16 on the GPU (the test compares with the CPU's transformers)
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer or model)

    def generate(self, prompts: list[dict], sampling_params: SamplingParams, use_tqdm: bool = True) -> list:
        p = sampling_params
        _log({"call": "generate", "prompts": len(prompts), **{k: v for k, v in vars(p).items()}})
        if p.temperature != 0.0 or p.n != 1:
            raise ValueError("the fake vLLM only decodes greedily")
        results = []
        for prompt in prompts:
            ids = list(prompt["prompt_token_ids"])
            new: list[int] = []
            with torch.inference_mode():
                while len(new) < p.max_tokens:
                    logits = self.model(torch.tensor([ids + new])).logits[0, -1]
                    token = int(torch.argmax(logits))
                    new.append(token)
                    if token in (p.stop_token_ids or []):
                        break
            text = self.tokenizer.decode(new, skip_special_tokens=p.skip_special_tokens)
            results.append(RequestOutput(ids, [CompletionOutput(0, text, new)]))
        return results
