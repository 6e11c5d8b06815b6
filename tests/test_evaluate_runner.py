"""``ram-merge eval`` on tiny transformers models built here: scores equal a plain per-example greedy
generation scored in the test, chat template on and off, cancel, one model in memory at a time, and
every bad model, suite and scorer refused with exit 2 and nothing written."""

from __future__ import annotations

import functools
import json
import shutil
import weakref
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from ram_desktop.cli import main
from ram_desktop.core.errors import Cancelled, InputError
from ram_desktop.core.events import Reporter
from ram_desktop.evaluate import evaluate, load_suite, model_refs, runner

from .hubcache import populate, sha_of
from .tinylm import build_tokenizer, write_tiny_lm

PROMPTS = [
    "What is 2 + 3?",
    "Say hello to the world",
    "Remember the number 42 and repeat it. Now what was it?",
    "x",
    "def add(a, b):",
    "tool call: search(query='weather')",
    "Question: how many legs does a cat have?",
]
SYSTEM = "You are terse."


@pytest.fixture(scope="module")
def lms(tmp_path_factory) -> tuple[Path, Path]:
    """(a tiny Qwen2 with a chat template, another without one)."""
    root = tmp_path_factory.mktemp("lms")
    return write_tiny_lm(root / "chat", chat_template=True, seed=0), write_tiny_lm(
        root / "plain", chat_template=False, seed=1
    )


@functools.cache
def _tokenizer(qwen2_pipeline: bool = True):
    return build_tokenizer(qwen2_pipeline=qwen2_pipeline)


@functools.cache
def _model(folder: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def reference(folder: Path, text: str, max_new_tokens: int, qwen2_pipeline: bool = True) -> tuple[str, bool]:
    """Greedy decoding written out: one example, no padding, no KV cache, the argmax of the last
    position's logits at each step, tokenized with the tokenizer object built in tinylm (not the
    saved one). Returns the completion and whether it stopped at the end-of-sequence token."""
    tok = _tokenizer(qwen2_pipeline)
    eos = tok.token_to_id("<|im_end|>")
    ids, new = tok.encode(text).ids, []
    model = _model(folder)
    for _ in range(max_new_tokens):
        with torch.no_grad():
            token = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
        if token == eos:
            return tok.decode(new, skip_special_tokens=True), True
        new.append(token)
    return tok.decode(new, skip_special_tokens=True), False


def chat_text(prompt: str, system: str | None = None) -> str:
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return head + f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def write_suite(folder: Path, rows: list[dict], yaml_text: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "suite.yaml").write_text(yaml_text)
    return folder


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_saved_tokenizer_encodes_like_the_built_one(lms):
    """transformers 5 loads a tokenizer in a qwen2 folder as Qwen2Tokenizer, which rebuilds its own
    pipeline; the tiny tokenizer must come back encoding and decoding exactly as built."""
    built = _tokenizer()
    for folder in lms:
        loaded = transformers.AutoTokenizer.from_pretrained(folder)
        assert loaded.get_vocab() == built.get_vocab()
        for text in [
            *PROMPTS,
            "The answer is 5.",
            "12345 abc",
            "a   b\n\n c\r\n",
            "é ü 中 🙂",
            "  lead",
            chat_text("hi there", SYSTEM),
            "it's 3.14!",
        ]:
            ids = built.encode(text).ids
            assert loaded(text)["input_ids"] == ids, text
            assert loaded.decode(ids) == built.decode(ids, skip_special_tokens=False)
    assert transformers.AutoTokenizer.from_pretrained(lms[0]).chat_template
    assert not transformers.AutoTokenizer.from_pretrained(lms[1]).chat_template


def test_eval_scores_equal_plain_greedy_generation(lms, tmp_path, capsys):
    chat, _ = lms
    refs = [reference(chat, p, 10) for p in PROMPTS]
    assert any(stopped for _, stopped in refs) and not all(stopped for _, stopped in refs)
    texts = [t for t, _ in refs]
    (tmp_path / "lengths").mkdir()
    (tmp_path / "lengths" / "len_reward.py").write_text(
        "def reward(prompts, completions, id, **columns):\n"
        "    return [len(c) * 1000 + i for c, i in zip(completions, id)]\n"
    )
    lengths = write_suite(
        tmp_path / "lengths",
        [{"prompt": p, "id": i} for i, p in enumerate(PROMPTS)],
        "scorer: python:len_reward.py:reward\nmax_new_tokens: 10\nchat_template: false\n",
    )
    answers = [t if i % 2 == 0 else "no" for i, t in enumerate(texts)]
    exact = write_suite(
        tmp_path / "exact",
        [{"prompt": p, "answer": a} for p, a in zip(PROMPTS, answers)],
        "name: exact-half\nmax_new_tokens: 10\nchat_template: false\n",
    )
    out = tmp_path / "eval.json"
    code, stdout, err = run_cli(
        capsys,
        "eval",
        str(chat),
        "--suite",
        str(lengths),
        str(exact),
        "--json",
        str(out),
        "--batch-size",
        "3",
        "--device",
        "cpu",
    )
    assert code == 0, err
    expected_lengths = sum(len(t) * 1000 + i for i, t in enumerate(texts)) / len(texts)
    expected_exact = sum(t.strip() == a.strip() for t, a in zip(texts, answers)) / len(texts)
    assert 0 < expected_exact < 1
    data = json.loads(out.read_text())
    assert data["scores"] == [[expected_lengths, expected_exact]]
    assert data["format"] == "ram-eval/2" and data["device"] == "cpu"
    assert data["models"] == [{"name": "chat", "source": str(chat.resolve())}]
    # the floors: the python scorer gives the empty answer i (no answer column: the only candidate); exact
    # gives the most frequent answer ("no", 3 of 7) a reward wherever it is the answer
    assert data["suites"] == [
        {
            "name": "lengths",
            "source": str(lengths.resolve()),
            "examples": 7,
            "scorer": "python:len_reward.py:reward",
            "floor": {"answer": "", "score": 3.0},
        },
        {
            "name": "exact-half",
            "source": str(exact.resolve()),
            "examples": 7,
            "scorer": "exact",
            "floor": {"answer": "no", "score": 3 / 7},
        },
    ]
    assert set(data) == {
        "format",
        "models",
        "suites",
        "scores",
        "seconds",
        "device",
        "versions",
        "per_example",
        "intervals",
        "differences",
        "at_floor",
    }
    assert data["per_example"] == [
        [
            [len(t) * 1000 + i for i, t in enumerate(texts)],
            [float(t.strip() == a.strip()) for t, a in zip(texts, answers)],
        ]
    ]
    assert data["seconds"] > 0 and data["versions"]["transformers"] == transformers.__version__
    assert "chat" in stdout and "lengths (7)" in stdout and "exact-half (7)" in stdout
    assert f"{expected_exact:.3f}" in stdout

    # the same through the API, with --limit: the completions themselves match, in suite order
    result = evaluate(model_refs([chat]), [load_suite(exact)], batch_size=4, limit=5)
    assert result.completions == [[texts[:5]]]
    assert result.scores == [[sum(t.strip() == a.strip() for t, a in zip(texts[:5], answers[:5])) / 5]]
    assert result.suites[0].examples == 5


def test_chat_template_on_and_off(lms, tmp_path):
    chat, plain = lms
    rows = [{"prompt": p, "answer": "-"} for p in PROMPTS[:4]]
    suites = {
        mode: load_suite(
            write_suite(
                tmp_path / mode, rows, f"name: {mode}\nchat_template: {mode}\nmax_new_tokens: 6\nsystem: {SYSTEM}\n"
            )
        )
        for mode in ("true", "false", "auto")
    }
    result = evaluate(model_refs([chat]), [suites["true"], suites["false"], suites["auto"]], batch_size=3)
    on = [reference(chat, chat_text(p, SYSTEM), 6)[0] for p in PROMPTS[:4]]
    off = [reference(chat, f"{SYSTEM}\n\n{p}", 6)[0] for p in PROMPTS[:4]]
    assert on != off
    assert result.completions == [[on, off, on]]  # auto uses the template the tokenizer has

    no_system = load_suite(write_suite(tmp_path / "nosys", rows, "chat_template: true\nmax_new_tokens: 6\n"))
    result = evaluate(model_refs([chat]), [no_system], batch_size=4)
    assert result.completions == [[[reference(chat, chat_text(p), 6)[0] for p in PROMPTS[:4]]]]

    result = evaluate(model_refs([plain]), [suites["auto"]], batch_size=2)  # no template: raw prompt
    assert result.completions == [[[reference(plain, f"{SYSTEM}\n\n{p}", 6)[0] for p in PROMPTS[:4]]]]


def test_tokenizer_json_as_written_when_transformers_substitutes_one(tmp_path, caplog):
    """A qwen2 folder whose tokenizer_config.json declares the generic class but whose tokenizer.json is
    not Qwen2's: transformers 5 would load Qwen2Tokenizer (different ids for " 42"); the runner uses the
    file as written and says so."""
    folder = write_tiny_lm(tmp_path / "gpt2-style", chat_template=False, seed=2, qwen2_pipeline=False)
    built = _tokenizer(False)
    assert (
        transformers.AutoTokenizer.from_pretrained(folder)("the number 42")["input_ids"]
        != built.encode("the number 42").ids
    )  # the substitution this guards against
    prompts = ["Remember the number 42", "What is 2 + 3? The answer is", "the number 42 and 42"]
    suite = load_suite(
        write_suite(tmp_path / "s", [{"prompt": p, "answer": "x"} for p in prompts], "max_new_tokens: 6\n")
    )
    with caplog.at_level("WARNING", logger="ram_desktop"):
        result = evaluate(model_refs([folder]), [suite], batch_size=2)
    assert result.completions == [[[reference(folder, p, 6, qwen2_pipeline=False)[0] for p in prompts]]]
    assert "using tokenizer.json as written" in caplog.text and "gpt2-style" in caplog.text


def test_chat_template_true_without_one_is_refused(lms, tmp_path, capsys):
    _, plain = lms
    suite = write_suite(tmp_path / "s", [{"prompt": "hi", "answer": "x"}], "name: needs-chat\nchat_template: true\n")
    out = tmp_path / "e.json"
    code, _, err = run_cli(capsys, "eval", str(plain), "--suite", str(suite), "--json", str(out))
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert "'needs-chat'" in err and "plain" in err and "chat template" in err
    assert not out.exists()


def test_cancel_stops_within_one_batch(lms, tmp_path, monkeypatch):
    """A cancel that arrives while a batch generates lets that batch finish and starts no other."""
    chat, _ = lms
    suite = load_suite(
        write_suite(tmp_path / "s", [{"prompt": p, "answer": "x"} for p in PROMPTS], "max_new_tokens: 4\n")
    )
    reporter = Reporter()
    calls = []
    original = transformers.GenerationMixin.generate

    def generate(self, *args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        reporter.cancel.cancel()  # the user clicks Cancel while this batch runs
        return original(self, *args, **kwargs)

    monkeypatch.setattr(transformers.GenerationMixin, "generate", generate)
    with pytest.raises(Cancelled):
        evaluate(model_refs([chat, chat]), [suite], batch_size=2, reporter=reporter)
    assert calls == [2]


def test_ctrl_c_exits_130_and_writes_nothing(lms, tmp_path, monkeypatch, capsys):
    chat, _ = lms
    suite = write_suite(tmp_path / "s", [{"prompt": p, "answer": "x"} for p in PROMPTS], "max_new_tokens: 4\n")
    original = transformers.GenerationMixin.generate
    calls = []

    def generate(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(transformers.GenerationMixin, "generate", generate)
    out = tmp_path / "e.json"
    code, _, err = run_cli(capsys, "eval", str(chat), "--suite", str(suite), "--json", str(out), "--batch-size", "2")
    assert code == 130 and "cancelled" in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_one_model_in_memory_at_a_time(lms, tmp_path, monkeypatch):
    chat, plain = lms
    suite = load_suite(write_suite(tmp_path / "s", [{"prompt": "hi", "answer": "x"}], "max_new_tokens: 2\n"))
    loaded: list[weakref.ref] = []
    alive_at_load: list[int] = []
    original = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def from_pretrained(cls, *args, **kwargs):
        alive_at_load.append(sum(ref() is not None for ref in loaded))
        result = original(cls, *args, **kwargs)
        loaded.append(weakref.ref(result[0] if isinstance(result, tuple) else result))
        return result

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(from_pretrained))
    result = evaluate(model_refs([chat, plain, chat]), [suite])
    assert [m.name for m in result.models] == ["chat", "plain", "chat-2"]
    assert alive_at_load == [0, 0, 0]
    assert all(ref() is None for ref in loaded)


def test_hub_model_from_the_cache(lms, tmp_path, monkeypatch):
    chat, _ = lms
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    sha = sha_of("tiny-chat")
    populate(cache, "org/tiny-chat", chat, sha)
    suite = load_suite(
        write_suite(tmp_path / "s", [{"prompt": p, "answer": "x"} for p in PROMPTS[:3]], "max_new_tokens: 5\n")
    )
    result = evaluate(model_refs(["org/tiny-chat"]), [suite], batch_size=2)
    local = evaluate(model_refs([chat]), [suite], batch_size=2)
    assert result.models[0].name == "tiny-chat" and result.models[0].source == f"org/tiny-chat@{sha}"
    assert result.completions == local.completions


# ---- bad input: exit 2, one error line naming the file and line, the function or the model; nothing written


def assert_refused(capsys, tmp_path, argv: list[str], *fragments: str) -> str:
    out = tmp_path / "refused.json"
    before = sorted(p.name for p in tmp_path.iterdir())
    code, stdout, err = run_cli(capsys, "eval", *argv, "--json", str(out))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == before and stdout == ""
    return lines[0]


def test_bad_suites_through_the_cli(lms, tmp_path, capsys):
    chat, _ = lms
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "c", answer: "d"}\n')
    assert_refused(capsys, tmp_path, [str(chat), "--suite", str(bad)], f"{bad.resolve()}, line 2", "not valid JSON")
    bad.write_text('{"prompt": "a", "answer": "b"}\n\n{"question": "c"}\n')
    assert_refused(capsys, tmp_path, [str(chat), "--suite", str(bad)], f"{bad.resolve()}, line 3", 'no "prompt"')
    bad.write_text("\n")
    assert_refused(capsys, tmp_path, [str(chat), "--suite", str(bad)], str(bad.resolve()), "no examples")
    assert_refused(capsys, tmp_path, [str(chat), "--suite", str(tmp_path / "missing.jsonl")], "missing.jsonl")
    folder = write_suite(tmp_path / "yaml", [{"prompt": "a", "answer": "b"}], "max_new_tokens: -3\n")
    assert_refused(capsys, tmp_path, [str(chat), "--suite", str(folder)], "suite.yaml, line 1", "max_new_tokens")
    folder = write_suite(tmp_path / "noanswer", [{"prompt": "a", "answer": "b"}, {"prompt": "c"}], "scorer: contains\n")
    assert_refused(capsys, tmp_path, [str(chat), "--suite", str(folder)], "data.jsonl, line 2", 'no "answer"')


@pytest.mark.parametrize(
    "body, fragment",
    [
        ("    raise ValueError('no solution column')\n", "raised ValueError: no solution column"),
        ("    return [1.0] * (len(completions) + 1)\n", "returned 4 scores for 3 completions"),
        ("    return ['good'] * len(completions)\n", "returned 'good' as the score of example 1"),
    ],
)
def test_bad_scorer_through_the_cli(lms, tmp_path, capsys, body, fragment):
    """A scorer that fails mid-run is bad input (exit 2, one error line naming suite, function and examples),
    and --json keeps what was finished: here nothing was scored, so the score is null and the failure recorded."""
    chat, _ = lms
    folder = write_suite(
        tmp_path / "suite",
        [{"prompt": p} for p in PROMPTS[:3]],
        "name: rewarded\nscorer: python:reward.py:my_reward\nmax_new_tokens: 2\n",
    )
    (folder / "reward.py").write_text("def my_reward(prompts, completions, **kw):\n" + body)
    out = tmp_path / "partial.json"
    code, stdout, err = run_cli(capsys, "eval", str(chat), "--suite", str(folder), "--json", str(out))
    lines = [line for line in err.splitlines() if not line.startswith("note: ")]  # the first-run note on the folder
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for part in ("suite 'rewarded'", "function my_reward in", "reward.py", fragment, f"finished scores are in {out}"):
        assert part in lines[0], (part, lines[0])
    data = json.loads(out.read_text())
    assert data["scores"] == [[None]] and data["failures"][0]["suite"] == "rewarded"
    assert "failed" in stdout


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_json(file: Path, **changes) -> None:
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps(data))


def test_bad_models_through_the_cli(lms, tmp_path, capsys):
    chat, _ = lms
    suite = write_suite(tmp_path / "suite", [{"prompt": "hi", "answer": "x"}], "max_new_tokens: 2\n")
    models = tmp_path / "models"
    models.mkdir()

    def refused(model: Path | str, *fragments: str) -> str:
        return assert_refused(capsys, tmp_path, [str(model), "--suite", str(suite)], *fragments)

    refused(models / "nowhere", "nowhere", "no such file or folder")

    empty = models / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((chat / "config.json").read_text())
    refused(empty, "empty")

    no_config = _copy(chat, models / "no-config")
    (no_config / "config.json").unlink()
    refused(no_config, "no-config", "no config.json")

    remote = _copy(chat, models / "remote")
    _edit_json(
        remote / "config.json",
        model_type="my_secret_arch",
        auto_map={"AutoModelForCausalLM": "modeling_secret.SecretForCausalLM"},
    )
    refused(remote, "model remote", "its own repository", "trust_remote_code")

    unknown = _copy(chat, models / "unknown")
    _edit_json(unknown / "config.json", model_type="my_secret_arch")
    refused(unknown, "model unknown", "does not know the model type 'my_secret_arch'")

    remote_tok = _copy(chat, models / "remote-tok")
    _edit_json(
        remote_tok / "tokenizer_config.json",
        tokenizer_class="SecretTokenizer",
        auto_map={"AutoTokenizer": ["tokenization_secret.SecretTokenizer", None]},
    )
    refused(remote_tok, "model remote-tok", "tokenizer needs the code in its own repository", "trust_remote_code")

    no_tok = _copy(chat, models / "no-tok")
    for f in no_tok.glob("tokenizer*"):
        f.unlink()
    refused(no_tok, "model no-tok", "no tokenizer")

    shapes = _copy(chat, models / "shapes")
    _edit_json(shapes / "config.json", intermediate_size=96)
    refused(
        shapes,
        "model shapes",
        "tensor model.layers.0.mlp.down_proj.weight has shape [64, 128] in the "
        "checkpoint but config.json implies [64, 96] (6 tensor(s) differ)",
    )

    missing = _copy(chat, models / "missing")
    tensors = load_file(missing / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, missing / "model.safetensors", metadata={"format": "pt"})
    refused(missing, "model missing", "lacks model.norm.weight")

    broken = _copy(chat, models / "broken")
    (broken / "config.json").write_text("{not json")
    refused(broken, "broken/config.json", "not valid JSON")

    odd = _copy(chat, models / "odd")
    _edit_json(odd / "config.json", model_type="t5", architectures=["T5ForConditionalGeneration"])
    refused(odd, "model odd", "transformers cannot load it as a causal language model")

    refused(chat / "model.safetensors", "not a single weights file")


def test_bad_usage_through_the_cli(lms, tmp_path, capsys):
    chat, _ = lms
    suite = write_suite(tmp_path / "suite", [{"prompt": "hi", "answer": "x"}])
    assert_refused(capsys, tmp_path, [str(chat), "--suite", str(suite), "--batch-size", "0"], "batch size")
    assert_refused(capsys, tmp_path, [str(chat), "--suite", str(suite), "--limit", "0"], "limit")
    assert_refused(
        capsys, tmp_path, [str(chat), str(chat), "--suite", str(suite), "--names", "a"], "1 names for 2 models"
    )
    assert_refused(
        capsys, tmp_path, [str(chat), str(chat), "--suite", str(suite), "--names", "a,a"], "'a' is given twice"
    )
    assert_refused(capsys, tmp_path, [str(chat), "--suite", str(suite), "--device", "tpu"], "device")
    code, _, err = run_cli(capsys, "eval", str(chat), "--suite", str(suite), "--json", str(tmp_path / "no" / "e.json"))
    assert code == 2 and "does not exist" in err and not (tmp_path / "no").exists()
    code, _, err = run_cli(capsys, "eval", str(chat))
    assert code == 2 and err.startswith("error: ") and "--suite" in err


def test_evaluate_api_checks(lms, tmp_path):
    chat, _ = lms
    suite = load_suite(write_suite(tmp_path / "suite", [{"prompt": "hi", "answer": "x"}]))
    with pytest.raises(InputError, match="no suites"):
        evaluate(model_refs([chat]), [])
    with pytest.raises(InputError, match="no models"):
        evaluate([], [suite])
    with pytest.raises(InputError, match="no models"):
        model_refs([])


def test_thread_setting_gives_the_same_completions_and_is_restored(lms, tmp_path, monkeypatch):
    chat, _ = lms
    suite = load_suite(
        write_suite(tmp_path / "s", [{"prompt": p, "answer": "x"} for p in PROMPTS[:3]], "max_new_tokens: 5\n")
    )
    before = torch.get_num_threads()
    seen = []
    original = transformers.GenerationMixin.generate

    def generate(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(transformers.GenerationMixin, "generate", generate)
    monkeypatch.setenv("RAM_DESKTOP_THREADS", "1")
    single = evaluate(model_refs([chat]), [suite], batch_size=2)
    monkeypatch.delenv("RAM_DESKTOP_THREADS")
    tiny = evaluate(model_refs([chat]), [suite], batch_size=2, threads=None)  # a tiny model: one thread
    monkeypatch.setattr(runner, "TINY_MODEL", 0)  # as if the model were large: torch's own setting
    default = evaluate(model_refs([chat]), [suite], batch_size=2, threads=None)
    assert seen == [1, 1, 1, 1, before, before] and torch.get_num_threads() == before
    expected = [[[reference(chat, chat_text(p), 5)[0] for p in PROMPTS[:3]]]]
    assert single.completions == tiny.completions == default.completions == expected
    with pytest.raises(InputError, match="threads"):
        evaluate(model_refs([chat]), [suite], threads=0)


@pytest.mark.parametrize(
    "error, fragment",
    [
        (torch.OutOfMemoryError("CUDA out of memory"), "out of memory generating a batch of 2 prompts"),
        (RuntimeError("index out of range in self"), "generation failed (RuntimeError: index out of range in self)"),
    ],
)
def test_generation_failure_names_model_and_suite(lms, tmp_path, monkeypatch, capsys, error, fragment):
    chat, _ = lms
    suite = write_suite(tmp_path / "s", [{"prompt": p, "answer": "x"} for p in PROMPTS[:3]], "name: gen\n")

    def generate(self, *args, **kwargs):
        raise error

    monkeypatch.setattr(transformers.GenerationMixin, "generate", generate)
    assert_refused(
        capsys, tmp_path, [str(chat), "--suite", str(suite), "--batch-size", "2"], "model chat, suite 'gen'", fragment
    )


def test_pooled_suites_share_one_pass_and_score_as_plain_greedy(lms, tmp_path, monkeypatch):
    """Suites that generate alike share one generation pass when pooled (issue 46, item 3): fuller batches,
    and every example's completion is still plain greedy decoding of its own prompt, so the scores are those of
    suite-by-suite evaluation. A suite with its own max_new_tokens keeps its own pass; a scorer that fails
    stops its suite only, not the other suite of its pass."""
    chat, _ = lms
    texts10 = [reference(chat, p, 10)[0] for p in PROMPTS]
    texts4 = [reference(chat, p, 4)[0] for p in PROMPTS[:3]]
    first = write_suite(
        tmp_path / "first",
        [{"prompt": p, "answer": t} for p, t in zip(PROMPTS[:4], texts10)],
        "max_new_tokens: 10\nchat_template: false\n",
    )
    second = write_suite(
        tmp_path / "second",
        [{"prompt": p, "answer": "no"} for p in PROMPTS[4:]],
        "max_new_tokens: 10\nchat_template: false\n",
    )
    short = write_suite(
        tmp_path / "short",
        [{"prompt": p, "answer": t} for p, t in zip(PROMPTS[:3], texts4)],
        "max_new_tokens: 4\nchat_template: false\n",
    )
    suites = [load_suite(first), load_suite(short), load_suite(second)]
    assert runner.suite_passes(suites, pooled=True) == [[0, 2], [1]]
    assert runner.suite_passes(suites, pooled=False) == [[0], [1], [2]]

    passes: list[tuple[int, int]] = []  # (prompts, max_new_tokens) of each generation pass
    original = runner._generate

    def counted(model, tokenizer, prompts, max_new_tokens, *args):
        passes.append((len(prompts), max_new_tokens))
        return original(model, tokenizer, prompts, max_new_tokens, *args)

    monkeypatch.setattr(runner, "_generate", counted)
    pooled = evaluate(model_refs([chat]), suites, device="cpu", batch_size=4, pool_suites=True)
    assert passes == [(7, 10), (3, 4)]
    passes.clear()
    alone = evaluate(model_refs([chat]), suites, device="cpu", batch_size=4, pool_suites=False)
    assert passes == [(4, 10), (3, 4), (3, 10)]
    assert pooled.completions == alone.completions == [[texts10[:4], texts4, texts10[4:]]]
    assert pooled.scores == alone.scores
    assert pooled.scores[0][:2] == [1.0, 1.0]

    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "bad.py").write_text(
        "def reward(prompts, completions, **columns):\n    raise ValueError('no')\n"
    )
    broken = write_suite(
        tmp_path / "broken",
        [{"prompt": p} for p in PROMPTS[4:]],
        "scorer: python:bad.py:reward\nmax_new_tokens: 10\nchat_template: false\n",
    )
    with pytest.raises(InputError) as raised:
        evaluate(
            model_refs([chat]), [load_suite(first), load_suite(broken)], device="cpu", batch_size=4, pool_suites=True
        )
    result = raised.value.result
    assert result.scores[0][0] == 1.0 and result.completions[0][0] == texts10[:4]
    assert [f.suite for f in result.failures] == ["broken"]
