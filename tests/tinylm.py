"""A tiny causal language model with a real tokenizer, written by transformers into an HF folder.

The tokenizer is a small byte-level BPE trained with the ``tokenizers`` library on a toy corpus, with
Qwen2's own normalizer and pre-tokenizer: transformers 5 loads any tokenizer in a folder whose config
says ``qwen2`` as ``Qwen2Tokenizer``, which rebuilds that pipeline, so a tokenizer built any other
way would encode differently once saved (``test_evaluate_runner`` checks it encodes identically).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

# Qwen2's pre-tokenizer pattern: contractions, letters, single digits, punctuation runs, newlines, spaces.
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "What is 2 + 3? The answer is 5.",
    "Say hello to the world, then stop.",
    "def add(a, b): return a + b",
    "tool call: search(query='weather in Paris')",
    "Remember the number 42 and repeat it.",
    "Question: how many legs does a cat have? Answer: 4",
]


def build_tokenizer(vocab_size: int = 320, qwen2_pipeline: bool = True) -> Tokenizer:
    """A byte-level BPE trained on ``CORPUS``, with Qwen2's normalizer and pre-tokenizer (or, with
    ``qwen2_pipeline=False``, GPT-2's byte-level pre-tokenizer, which keeps digits with a leading space)."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    if qwen2_pipeline:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 5, trainer)
    return tok


def write_tiny_lm(
    folder: Path,
    chat_template: bool = True,
    seed: int = 0,
    layers: int = 2,
    hidden: int = 64,
    init_std: float = 0.5,
    eos_scale: float = 2.0,
    qwen2_pipeline: bool = True,
) -> Path:
    """A random-weight Qwen2 model + the tokenizer above (optionally with a chat template), saved with
    ``save_pretrained``. ``init_std`` above transformers' 0.02 spreads the logits so greedy choices are
    far from ties; ``eos_scale`` enlarges the end-of-sequence row of the output layer so that some
    completions stop early and others run to the token limit. ``qwen2_pipeline=False`` gives a
    tokenizer that transformers' Qwen2Tokenizer would encode differently."""
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer(qwen2_pipeline=qwen2_pipeline)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    eos = tok.token_to_id("<|im_end|>")
    config = Qwen2Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=init_std,
        eos_token_id=eos,
        pad_token_id=tok.token_to_id("<|endoftext|>"),
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[eos] *= eos_scale
    model.generation_config.eos_token_id = eos
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def write_tokens_lm(
    folder: Path, special: list[str], plain: list[str], template: str, seed: int, dtype: str = "float32"
) -> Path:
    """A tiny random Qwen2 model (one layer, hidden 16) whose tokenizer is ``build_tokenizer``'s with these added
    special and plain tokens and chat template, its vocabulary sized to the tokenizer: an agent fine-tuned
    with tokens of its own."""
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    fast = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    if special:
        fast.add_special_tokens({"additional_special_tokens": special})
    if plain:
        fast.add_tokens(plain)
    fast.chat_template = template
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        initializer_range=0.5,
    )
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).to(getattr(torch, dtype)).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder
