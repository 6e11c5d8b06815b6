"""mergekit's tokenizer handling (``tokenizer_source``, the ``tokenizer`` block, ``chat_template``) through
``ram-merge run``: the written tokenizer files and every tensor bit for bit equal to mergekit 0.1.5's output
(those tests skip without mergekit, see benchmarks/setup_mergekit.sh), and the bad inputs refused.

The fixtures are tiny Qwen2 models whose agents added tokens of their own (some special, some shared between
agents at different ids), each vocabulary sized to its tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from jinja2 import TemplateError
from transformers import AutoTokenizer

from ram_desktop.cli import main
from tests import reference as ref
from tests.tinylm import write_tokens_lm

MERGEKIT = os.environ.get("RAM_MERGEKIT") or "/work/mergekit-venv/bin/mergekit-yaml"
needs_mergekit = pytest.mark.skipif(
    not (Path(MERGEKIT).is_file() and os.access(MERGEKIT, os.X_OK)),
    reason="mergekit not installed (set RAM_MERGEKIT=/path/to/mergekit-yaml)",
)
BATCH = Path(__file__).resolve().parent / "mergekit_batch.py"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
TEMPLATE_A = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
TEMPLATE_B = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
# agent -> (added special tokens, added plain tokens, chat template, seed)
AGENTS = {
    "coder": (["<tool_call>", "</tool_call>"], [], TEMPLATE_A, 1),
    "thinker": (["<think>"], ["<tool_call>", "reasoning"], TEMPLATE_B, 2),
    "plain": ([], [], TEMPLATE_B, 3),
}


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("family")
    base = write_tokens_lm(root / "base", [], [], TEMPLATE_A, 0)
    return base, [write_tokens_lm(root / name, *spec) for name, spec in AGENTS.items()]


def _config(base: Path, agents: list[Path], **top) -> dict:
    data = {
        "merge_method": "task_arithmetic",
        "base_model": str(base),
        "models": [{"model": str(a), "parameters": {"weight": 0.5 + 0.1 * i}} for i, a in enumerate(agents)],
        "dtype": "float32",
        "out_dtype": "float32",
    }
    data.update(top)
    return data


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run_mergekit(jobs: list[tuple[Path, Path]], tmp_path: Path) -> None:
    """mergekit's run of each configuration, in one process, its models in the file's order."""
    listing = tmp_path / "jobs.json"
    listing.write_text(json.dumps([[str(c), str(o)] for c, o in jobs]))
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAM_MERGEKIT_YAML_ORDER="1")
    python = Path(MERGEKIT).parent / "python"
    proc = subprocess.run(
        [str(python), str(BATCH), str(listing)], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


CONVERSATIONS = (
    [{"role": "user", "content": "Hi  "}],
    [
        {"role": "system", "content": " Be brief. "},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Yes"},
    ],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c\nd"}],
    [
        {"role": "user", "content": "q"},
        {"role": "user_context", "content": " ctx "},
        {"role": "assistant", "content": "r"},
    ],
)


def _rendered(folder: Path) -> list[str]:
    """Each conversation as the folder's chat template renders it (or the error it raises: Mistral's refuses
    roles other than user and assistant)."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    out = []
    for conversation in CONVERSATIONS:
        for prompt in (False, True):
            try:
                out.append(
                    tokenizer.apply_chat_template(
                        conversation, tokenize=False, add_generation_prompt=prompt, bos_token="<s>", eos_token="</s>"
                    )
                )
            except TemplateError as e:
                out.append(f"error: {e}")
    return out


def _assert_same(ours: Path, theirs: Path, named_template: bool = False) -> None:
    """Tokenizer files, chat template, vocabulary size and every tensor, bit for bit. A named template is RAM
    Desktop's own text for the format (mergekit's are not copied): it renders every conversation as mergekit's."""
    for name in [*TOKENIZER_FILES, "chat_template.jinja"]:
        assert (ours / name).exists() == (theirs / name).exists(), name
        if (theirs / name).exists() and not (named_template and name == "chat_template.jinja"):
            assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    if named_template:
        assert _rendered(ours) == _rendered(theirs)
    assert (
        json.loads((ours / "config.json").read_text())["vocab_size"]
        == json.loads((theirs / "config.json").read_text())["vocab_size"]
    )
    a, b = ref.load_model(ours), ref.load_model(theirs)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name


CASES = {
    "union": {"tokenizer_source": "union"},
    "model": {"tokenizer_source": "AGENT1"},
    "base-tokens": {
        "tokenizer": {
            "source": "base",
            "tokens": {
                "<|im_end|>": {"source": "AGENT0", "force": True},
                "<|im_start|>": {"source": {"kind": "zero"}, "force": True},
                "<|endoftext|>": {
                    "source": {"kind": "model_token", "model": "AGENT1", "token": "reasoning"},
                    "force": True,
                },
            },
        }
    },
    "union-tokens-pad": {
        "tokenizer": {
            "source": "union",
            "tokens": {"<tool_call>": {"source": "AGENT1", "force": True}, "<extra>": {"source": {"kind": "zero"}}},
            "pad_to_multiple_of": 64,
        }
    },
    "pad-base": {"tokenizer": {"source": "base", "pad_to_multiple_of": 48}},
    "template-named": {"tokenizer_source": "union", "chat_template": "chatml"},
    **{
        f"template-{name}": {"tokenizer_source": "base", "chat_template": name}
        for name in ("llama3", "mistral", "alpaca", "exaone")
    },
    "template-jinja": {
        "only": [2],
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
    },
    "template-auto": {"tokenizer_source": "base", "chat_template": "auto"},
}


def _filled(value, base: Path, agents: list[Path]):
    names = {"BASE": str(base), **{f"AGENT{i}": str(a) for i, a in enumerate(agents)}}
    if isinstance(value, dict):
        return {k: _filled(v, base, agents) for k, v in value.items()}
    return names.get(value, value) if isinstance(value, str) else value


@pytest.fixture(scope="module")
def bf16_family(tmp_path_factory) -> tuple[Path, list[Path]]:
    """bfloat16 models where a token two agents added (at different ids) is averaged for the others."""
    root = tmp_path_factory.mktemp("bf16")
    base = write_tokens_lm(root / "base", [], [], TEMPLATE_A, 0, "bfloat16")
    agents = {"a": (["<x>", "<y>"], []), "b": (["<y>"], ["<z>", "<x>"]), "c": ([], ["<z>"])}
    return base, [
        write_tokens_lm(root / n, sp, pl, TEMPLATE_B, i + 1, "bfloat16")
        for i, (n, (sp, pl)) in enumerate(agents.items())
    ]


@needs_mergekit
def test_bfloat16_union_averages_in_mergekits_dtype(bf16_family, tmp_path):
    """The rows of a token some models lack are averaged in mergekit's compute dtype (dtype: float32 casts
    first); linear also takes the base as an input (the averaging order: the models, then the base)."""
    base, agents = bf16_family
    cases = {
        "linear32": {
            "merge_method": "linear",
            "dtype": "float32",
            "out_dtype": "bfloat16",
            "parameters": {"weight": 0.25},
        },
        "ta": {"merge_method": "task_arithmetic", "dtype": "float32", "out_dtype": "bfloat16"},
        "ties16": {"merge_method": "ties", "parameters": {"density": 0.5}},
    }
    configs = {}
    for name, top in cases.items():
        data = _config(base, agents, tokenizer_source="union")
        for model in data["models"]:
            model["parameters"] = {"weight": 0.1}
        del data["dtype"], data["out_dtype"]
        data.update(top)
        configs[name] = _write(tmp_path / f"{name}.yaml", data)
    _run_mergekit([(c, tmp_path / f"mk-{name}") for name, c in configs.items()], tmp_path)
    for name, config in configs.items():
        assert main(["-q", "run", str(config), "--out", str(tmp_path / f"ours-{name}")]) == 0, name
        _assert_same(tmp_path / f"ours-{name}", tmp_path / f"mk-{name}")


@needs_mergekit
def test_tokenizer_settings_give_mergekit_files_and_tensors(family, tmp_path):
    """Every case through mergekit (one process) and through ``ram-merge run``: the same bytes."""
    base, agents = family
    configs = {}
    for name, top in CASES.items():
        top = dict(top)
        chosen = [agents[i] for i in top.pop("only", range(len(agents)))]  # a case whose models share a vocabulary
        configs[name] = _write(tmp_path / f"{name}.yaml", _config(base, chosen, **_filled(top, base, agents)))
    _run_mergekit([(c, tmp_path / f"mk-{name}") for name, c in configs.items()], tmp_path)
    for name, config in configs.items():
        assert main(["-q", "run", str(config), "--out", str(tmp_path / f"ours-{name}")]) == 0, name
        named = CASES[name].get("chat_template") not in (None, "auto") and "{" not in CASES[name]["chat_template"]
        _assert_same(tmp_path / f"ours-{name}", tmp_path / f"mk-{name}", named_template=named)
