"""The batched Fisher estimate (per-example gradients of a right-padded batch with ``torch.func``) equals the
one-example-per-pass estimate on a tiny Llama written by transformers, with prompts of different lengths in
one batch; where the batched pass raises, the estimate goes on one example at a time and still equals it.

Tolerance: float32, ``rtol=1e-5`` with ``atol`` 1e-5 of the tensor's largest value. Both estimates sum the
same squared gradients of the same completions; they differ only in float rounding: the vmapped forward and
backward run their matmuls and attention on other shapes (the padded length, a batch dimension), and the
squares are summed over the batch before they are added to the accumulator rather than one at a time.
Measured: up to 1e-6 of a tensor's largest value on this Llama, up to 4e-6 on the Qwen2 of
test_fisher_estimate (against 1e-7 between two one-by-one computations); anything of the padding leaking
into a real position, or a padded position counted, changes F by far more (checked by counting the padded
positions: the test then fails)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from ram_desktop.evaluate import fisher as fisher_module

from .tinylm import build_tokenizer

# prompts of clearly different token lengths, so a batch pads all but the longest
PROMPTS = [
    "Hi",
    "What is 2 + 3? The answer is",
    "def add(a, b): return a + b",
    "Say hello",
    "tool call: search(query='weather in Paris') then remember the number 42 and repeat it",
]
MAX_NEW = 5


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A random-weight LlamaForCausalLM (tied embeddings) and a small BPE tokenizer, saved by transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("llama") / "agent"
    tok = build_tokenizer()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    torch.manual_seed(5)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        initializer_range=0.3,
        eos_token_id=tok.token_to_id("<|im_end|>"),
        bos_token_id=None,
        pad_token_id=tok.token_to_id("<|endoftext|>"),
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def write_suite(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": "x"}) + "\n" for p in PROMPTS))
    (folder / "suite.yaml").write_text(f"name: calib\nmax_new_tokens: {MAX_NEW}\nchat_template: false\n")
    return folder


def assert_same_fisher(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == torch.float32
        atol = 1e-5 * float(value.abs().max())
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=atol, msg=name)


def test_batched_fisher_equals_one_example_per_pass(tmp_path, llama):
    suite = write_suite(tmp_path / "suite")
    one = fisher_module.estimate_fisher(llama, suite, device="cpu", batch=1)
    assert one.info["batch"] == 1
    lengths = {len(p) for p in PROMPTS}
    assert len(lengths) == len(PROMPTS)  # prompts of different lengths: a batch pads all but its longest
    for batch in (2, len(PROMPTS)):  # a last, smaller batch; everything in one padded batch
        batched = fisher_module.estimate_fisher(llama, suite, device="cpu", batch=batch)
        assert batched.info["batch"] == batch  # batched all the way: no fallback
        assert batched.info["completion_tokens"] == one.info["completion_tokens"] > 0
        assert_same_fisher(batched.tensors, one.tensors)
    assert sum(float(v.sum()) for v in one.tensors.values()) > 0


def test_where_the_batched_pass_raises_the_estimate_goes_on_one_by_one(tmp_path, llama, monkeypatch, caplog):
    suite = write_suite(tmp_path / "suite")
    one = fisher_module.estimate_fisher(llama, suite, device="cpu", batch=1)

    def cannot_vmap(self, examples, device):
        raise RuntimeError("vmap: It looks like you're attempting to use a Tensor in some data-dependent control flow")

    monkeypatch.setattr(fisher_module._Squares, "_batched", cannot_vmap)
    with caplog.at_level(logging.INFO, logger="ram_desktop"):
        fallen = fisher_module.estimate_fisher(llama, suite, device="cpu", batch=4)
    assert fallen.info["batch"] == 1
    assert any("one example at a time" in r.getMessage() for r in caplog.records)
    assert_same_fisher(fallen.tensors, one.tensors)


def test_the_batch_fits_the_gradient_budget_and_the_memory(monkeypatch):
    """135M float32 parameters (1.08 GB counted per example): 3 within 4 GiB, whatever the memory beyond it;
    fewer where a quarter of the memory available holds fewer; a small model 16."""
    from ram_desktop.evaluate import search

    cpu = torch.device("cpu")
    cases = (
        (20 * 10**9, 135_000_000, 3),
        (10**15, 135_000_000, 3),
        (None, 135_000_000, 3),
        (6 * 10**9, 135_000_000, 1),
    )
    for available, parameters, batch in (*cases, (2 * 10**9, 10**6, 16), (10**9, 135_000_000, 1)):
        monkeypatch.setattr(search, "available_memory", lambda available=available: available)
        assert fisher_module.batch_size(parameters, cpu) == batch, (available, parameters)
