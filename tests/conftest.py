"""Shared fixtures: small generated checkpoints in the Hugging Face layout, written to tmp_path."""

from __future__ import annotations

import gc
import logging
import os
import signal
from pathlib import Path

import pytest
import torch

from .synthetic import demo_shapes, generate_tensors, write_model

# Qt without a display wherever a test makes widgets (pytest-qt's qapp starts before a test body could set it),
# so every module passes alone, outside `make test` too
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

SMALL_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "vocab_size": 64,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


def _ignore(signum: int, frame: object) -> None:
    """Stands in for SIG_IGN in the test process (see ``pytest_configure``)."""


def pytest_configure(config: pytest.Config) -> None:
    """Children the tests start get SIGINT, SIGTERM and SIGHUP at their defaults, however this process was
    started. A shell starts a background job (``make test &``, a CI runner) with SIGINT ignored, exec keeps
    an ignored signal ignored, and the faces rightly leave an inherited SIG_IGN alone (nohup): the signal
    tests would then test nohup. A handler that does nothing keeps this process as deaf as before, and exec
    resets a handled signal to its default."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) is signal.SIG_IGN:
            signal.signal(number, _ignore)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A test that uses Qt runs with the cyclic garbage collector off, as in the app
    (``gui/application.collect_garbage_on_gui_thread``): in a worker thread a collection would destroy Qt
    objects left in reference cycles (a window, its widgets), which Qt allows only in the GUI thread. Once
    pytest has dropped the test's fixtures, what it left is collected here, on the GUI thread, and Python
    collects by itself again. What survives is frozen (modules, session fixtures: long-lived), so that each
    later collection scans only what is new."""
    if not {"qtbot", "qapp"} & set(getattr(item, "fixturenames", ())):
        return (yield)
    gc.disable()  # from the first fixture on: a window starts jobs as it opens
    try:
        return (yield)
    finally:
        from PySide6.QtCore import QEvent
        from PySide6.QtWidgets import QApplication

        from ram_desktop.gui.application import collect_garbage_automatically

        QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # the widgets pytest-qt closed
        collect_garbage_automatically()
        gc.freeze()


@pytest.fixture(autouse=True)
def _own_log_handlers():
    """Handlers a test adds to the ``ram_desktop`` logger (``cli.main`` run in-process adds one bound to the
    test's captured stderr) leave with it: a later test's log line must not go to a closed stream."""
    logger = logging.getLogger("ram_desktop")
    before, level = list(logger.handlers), logger.level
    yield
    for handler in [h for h in logger.handlers if h not in before]:
        logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each test gets its own probe cache and Qt settings, never the user's."""
    root = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("RAM_DESKTOP_CACHE", str(root / "ram"))
    monkeypatch.setenv("RAM_DESKTOP_OUTPUTS", str(root / "outputs"))  # the demo's merges, never in the home folder
    monkeypatch.setenv("XDG_CONFIG_HOME", str(root / "config"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def make_models(
    folder: Path,
    dtype: torch.dtype = torch.bfloat16,
    shards: int = 1,
    seed: int = 7,
    agents: dict[str, float] | None = None,
    config: dict = SMALL_CONFIG,
) -> tuple[Path, list[Path]]:
    """A base and RL-like agents (bf16 ulp updates, sparse + dense) as HF folders, in ``dtype``."""
    agents = agents or {"alpha": 0.5, "beta": 0.55, "gamma": 0.04}
    base, agent_tensors = generate_tensors(demo_shapes(config), seed, agents)
    cfg = dict(config, torch_dtype=str(dtype).removeprefix("torch."))
    base_dir = write_model(folder / "base", {k: v.to(dtype) for k, v in base.items()}, cfg, shards)
    dirs = [
        write_model(folder / name, {k: v.to(dtype) for k, v in t.items()}, cfg, shards)
        for name, t in agent_tensors.items()
    ]
    return base_dir, dirs


@pytest.fixture
def models(tmp_path) -> tuple[Path, list[Path]]:
    return make_models(tmp_path / "in")


@pytest.fixture
def sharded_models(tmp_path) -> tuple[Path, list[Path]]:
    return make_models(tmp_path / "in", shards=3)


def tree_snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``roots`` with size and mtime: compared before/after to prove nothing was touched."""
    snap = {}
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for f in files:
                st = os.stat(os.path.join(dirpath, f))
                snap[os.path.join(dirpath, f)] = (st.st_size, st.st_mtime_ns)
    return snap


@pytest.fixture
def torch_threads():
    """torch's intra-op thread count this process runs with. Tests never change it in the process (it is
    process-wide state every later test would inherit); other thread counts are checked in a fresh process
    (``run_with_torch_threads``)."""
    return torch.get_num_threads()


def run_with_torch_threads(threads: int, code: str) -> None:
    """Run ``code`` in a fresh Python whose torch has ``threads`` intra-op threads from the start; it must exit 0."""
    import subprocess
    import sys

    script = f"import torch\ntorch.set_num_threads({threads})\n{code}"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
