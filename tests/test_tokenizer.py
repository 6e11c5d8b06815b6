"""The output tokenizer (``tokenizer``, ``chat_template``) without mergekit: what a union vocabulary holds, the
rows a token only one agent has, a recipe's round trip, and the bad inputs refused before anything is written
(tests/test_mergekit_tokenizer.py compares the same settings with mergekit's own output)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

import ram_desktop
from ram_desktop.core import MergeSpec
from tests import reference as ref
from tests.subproc import cli, refused
from tests.tinylm import write_tokens_lm

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A base with ``build_tokenizer``'s 320 tokens; ``tool`` adds two special tokens, ``think`` one plain."""
    root = tmp_path_factory.mktemp("vocab")
    base = write_tokens_lm(root / "base", [], [], TEMPLATE, 0)
    tool = write_tokens_lm(root / "tool", ["<tool_call>", "</tool_call>"], [], TEMPLATE, 1)
    think = write_tokens_lm(root / "think", [], ["<think>"], TEMPLATE, 2)
    return base, tool, think


def _recipe(path: Path, base: Path, agents: dict[str, Path], **extra) -> Path:
    data = {
        "format": "ram-recipe/2",
        "method": "task-arithmetic",
        "parameters": {"scale": 1.0},
        "base": str(base),
        "agents": [{"name": n, "source": str(p)} for n, p in agents.items()],
        "out_dtype": "float32",
        **extra,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_union_holds_every_agents_tokens_with_the_donors_rows(family, tmp_path):
    """A union vocabulary: the base's 320 tokens at their ids, then each agent's added tokens; a token only one
    agent has gets that agent's rows in every model, so its merged row is that agent's row unchanged."""
    base, tool, think = family
    recipe = _recipe(tmp_path / "r.yaml", base, {"tool": tool, "think": think}, tokenizer={"source": "union"})
    done = cli(tmp_path, "run", str(recipe), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(out).get_vocab()
    base_vocab = AutoTokenizer.from_pretrained(base).get_vocab()
    assert all(vocab[t] == i for t, i in base_vocab.items())
    assert {"<tool_call>", "</tool_call>", "<think>"} <= set(vocab) and len(vocab) == 323
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 323
    merged, agents = ref.load_model(out), {"tool": ref.load_model(tool), "think": ref.load_model(think)}
    old = {
        "tool": AutoTokenizer.from_pretrained(tool).get_vocab(),
        "think": AutoTokenizer.from_pretrained(think).get_vocab(),
    }
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert merged[name].shape[0] == 323
        for token, owner in [("<tool_call>", "tool"), ("</tool_call>", "tool"), ("<think>", "think")]:
            assert torch.equal(merged[name][vocab[token]], agents[owner][name][old[owner][token]]), (name, token)
    written = yaml.safe_load((out / "ram-recipe.yaml").read_text())
    assert written["tokenizer"] == {"source": "union"}


def test_recipe_round_trip_and_old_recipes_unchanged(family, tmp_path):
    """The new keys survive save and load; a spec without them writes no new key (old recipes, same bytes)."""
    base, tool, think = family
    settings = {
        "source": "model:think",
        "tokens": {"<tool_call>": {"source": "tool", "force": True}, "<x>": {"source": {"kind": "zero"}}},
        "pad_to_multiple_of": 64,
    }
    spec = MergeSpec.build(base, [tool, think], names=["tool", "think"], tokenizer=settings, chat_template="chatml")
    again = MergeSpec.from_yaml(spec.to_yaml())
    assert again == spec and again.tokenizer == settings and again.chat_template == "chatml"
    plain = MergeSpec.build(base, [tool, think])
    assert "tokenizer" not in plain.to_yaml() and "chat_template" not in plain.to_yaml()
    assert MergeSpec.from_yaml(plain.to_yaml()).tokenizer is None


def test_written_recipe_reproduces_the_merge(family, tmp_path):
    """The ram-recipe.yaml a tokenizer merge writes gives the same tensors and tokenizer files again."""
    base, tool, think = family
    recipe = _recipe(
        tmp_path / "r.yaml",
        base,
        {"tool": tool, "think": think},
        tokenizer={
            "source": "union",
            "pad_to_multiple_of": 16,
            "tokens": {"<|im_end|>": {"source": "tool", "force": True}},
        },
        chat_template="chatml",
    )
    assert cli(tmp_path, "run", str(recipe), "--out", str(tmp_path / "a")).returncode == 0
    done = cli(tmp_path, "run", str(tmp_path / "a" / "ram-recipe.yaml"), "--out", str(tmp_path / "b"))
    assert done.returncode == 0, done.stderr
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert json.loads((tmp_path / "a" / "config.json").read_text())["vocab_size"] == 336


def test_cli_flags(family, tmp_path):
    """``--tokenizer-source model:NAME`` takes that agent's tokenizer; ``--chat-template FILE`` its text."""
    base, tool, think = family
    (tmp_path / "t.jinja").write_text(TEMPLATE + "{# mine #}")
    done = cli(
        tmp_path,
        "merge",
        str(base),
        str(tool),
        str(think),
        "--method",
        "task-arithmetic",
        "--tokenizer-source",
        "model:tool",
        "--chat-template",
        str(tmp_path / "t.jinja"),
        "--out",
        str(tmp_path / "out"),
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "chat_template.jinja").read_text() == TEMPLATE + "{# mine #}"
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() != (base / "tokenizer.json").read_bytes()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == 322


BAD = [
    ("source not in the merge", {"tokenizer": {"source": "model:nobody"}}, ["tokenizer.source", "nobody"]),
    ("token source unknown", {"tokenizer": {"tokens": {"<t>": {"source": "ghost"}}}}, ["tokenizer.tokens.<t>.source"]),
    (
        "model_token of an unknown model",
        {"tokenizer": {"tokens": {"<t>": {"source": {"kind": "model_token", "model": "ghost", "token": "a"}}}}},
        ["tokenizer.tokens.<t>.source.model", "ghost"],
    ),
    ("unknown named template", {"chat_template": "chatmlx"}, ["chat_template", "'chatmlx' is not a named template"]),
    ("Jinja syntax error", {"chat_template": "{% for m in messages %}{{ m['content'] }}"}, ["chat_template", "parse"]),
    ("unknown tokenizer key", {"tokenizer": {"sources": "union"}}, ["tokenizer.sources"]),
    ("bad pad", {"tokenizer": {"pad_to_multiple_of": 0}}, ["tokenizer.pad_to_multiple_of"]),
]


@pytest.mark.parametrize("what,extra,fragments", BAD, ids=[b[0] for b in BAD])
def test_bad_recipe_refused_nothing_written(family, tmp_path, what, extra, fragments):
    base, tool, think = family
    recipe = _recipe(tmp_path / "r.yaml", base, {"tool": tool, "think": think}, **extra)
    refused(cli(tmp_path, "run", str(recipe), "--out", str(tmp_path / "out")), *fragments)
    assert not (tmp_path / "out").exists()


MERGEKIT_BAD = [
    ("tokenizer_source not in the merge", {"tokenizer_source": "/nowhere/model"}, ["tokenizer_source", "/nowhere"]),
    (
        "tokens source not in the merge",
        {"tokenizer": {"source": "union", "tokens": {"<t>": {"source": "/nowhere/model"}}}},
        ["tokenizer.tokens.<t>.source"],
    ),
    ("unknown named template", {"chat_template": "vicuna"}, ["chat_template", "vicuna"]),
    (
        "Jinja syntax error",
        {"chat_template": "{% if add_generation_prompt %}assistant: {% endfi %}"},
        ["chat_template"],
    ),
]


@pytest.mark.parametrize("what,extra,fragments", MERGEKIT_BAD, ids=[b[0] for b in MERGEKIT_BAD])
def test_bad_mergekit_config_refused_nothing_written(family, tmp_path, what, extra, fragments):
    base, tool, think = family
    data = {
        "merge_method": "task_arithmetic",
        "base_model": str(base),
        "models": [{"model": str(a), "parameters": {"weight": 1.0}} for a in (tool, think)],
        **extra,
    }
    (tmp_path / "mk.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    refused(cli(tmp_path, "run", str(tmp_path / "mk.yaml"), "--out", str(tmp_path / "out")), *fragments)
    assert not (tmp_path / "out").exists()


def test_bad_cli_flags_refused(family, tmp_path):
    base, tool, think = family
    common = ["merge", str(base), str(tool), str(think), "--out", str(tmp_path / "out")]
    refused(cli(tmp_path, *common, "--tokenizer-source", "model:ghost"), "tokenizer.source", "ghost")
    refused(cli(tmp_path, *common, "--tokenizer-source", "model:"), "--tokenizer-source")
    refused(cli(tmp_path, *common, "--chat-template", "nonesuch"), "--chat-template", "nonesuch")
    assert not (tmp_path / "out").exists()


def test_export_to_mergekit_and_back(family):
    """``export-mergekit`` writes the tokenizer block with each model's path; reading it back names them again."""
    from ram_desktop.core.ecosystem.mergekit import from_mergekit, to_mergekit

    base, tool, think = family
    settings = {
        "source": "model:think",
        "tokens": {"<tool_call>": {"source": "tool", "force": True}, "<x>": {"source": {"kind": "zero"}}},
        "pad_to_multiple_of": 64,
    }
    spec = MergeSpec.build(
        base, [tool, think], names=["tool", "think"], method="task-arithmetic", tokenizer=settings, chat_template="auto"
    )
    data = yaml.safe_load(to_mergekit(spec))
    assert data["tokenizer"]["source"] == str(think)
    assert data["tokenizer"]["tokens"]["<tool_call>"] == {"source": str(tool), "force": True}
    assert data["chat_template"] == "auto"
    back = from_mergekit(data).spec
    assert back.tokenizer == settings and back.chat_template == "auto"


TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "2+2?"},
]
EXPECTED = {  # each format as mergekit 0.1.5 renders it (a generation prompt at the end; Alpaca puts none before it)
    "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\n"
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\n<|start_header_id|>assistant<|end_header_id|>\n\n"
    "Hello<|eot_id|>\n<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>\n"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral": "<s> [INST] Be brief.\n\nHi [/INST] Hello</s> [INST] 2+2? [/INST]",
    "alpaca": "Be brief.\n\n### Instruction:\nHi\n\n### Response:\nHello\n\n### Instruction:\n2+2?### Response:\n",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_named_templates_render_their_format(name):
    """Rendered as transformers renders chat templates (a sandbox that trims blocks), independently of our code."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    text = (Path(ram_desktop.__file__).parent / "resources" / "chat_templates" / f"{name}.jinja").read_text()
    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(text)
    rendered = template.render(messages=TURNS, add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
    assert rendered == EXPECTED[name]
