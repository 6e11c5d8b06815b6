"""A character-level tokenizer built with the ``tokenizers`` library and saved for ``AutoTokenizer``."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIAL = ["<pad>", "<s>", "</s>"]
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789=+-*;:?>()_.,") + ["\u0120"]  # \u0120 "Ġ": a space, byte-level


def build_tokenizer() -> Tokenizer:
    """One token per character: a byte-level BPE with no merges, special tokens first.

    Byte-level (a space is the symbol "Ġ") because transformers 5 loads any tokenizer in a Qwen2
    folder as ``Qwen2Tokenizer``, which rebuilds a byte-level BPE from the vocabulary; a plain
    character vocabulary would lose its spaces there. ``tests`` check both encode alike.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    return tok


def save_tokenizer(folder: Path) -> None:
    """Write tokenizer.json and a config that makes ``AutoTokenizer`` load it unchanged."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "Qwen2Tokenizer",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "model_max_length": 256,
                "padding_side": "left",
                "add_bos_token": False,
                "add_eos_token": False,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
    )
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})
    )
