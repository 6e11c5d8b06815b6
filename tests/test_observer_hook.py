"""A method's observer meets the fused CPU kernels through the engine's generic hook (``contracts.SliceObserver``):
a method whose fused kernel counts something for its observer gets it through ``observe_slices`` on the kernel
path; an observer without that hook sends the variant down the torch path to ``observe``. The engine knows
nothing of what is counted: here a throwaway method counts the elements it merged, per tensor."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from pathlib import Path

import pytest
from safetensors import safe_open

from ram_desktop.core import pipeline
from ram_desktop.core.methods import METHODS

NAME = "counted-sum"


class ChunkCounter:
    """An ``Observer`` only: the elements of every merged chunk it watched, per tensor."""

    def __init__(self) -> None:
        self.watched: Counter[str] = Counter()
        self.from_kernel: Counter[str] = Counter()
        self._lock = threading.Lock()

    def observe(self, chunk, context, merged) -> None:
        with self._lock:
            self.watched[chunk.name] += merged.numel()

    def finish(self) -> dict:
        return {}


class KernelCounter(ChunkCounter):
    """Also a ``SliceObserver``: takes the count the method's fused kernel made of a chunk."""

    def observe_slices(self, slices, observed) -> None:
        with self._lock:
            self.from_kernel[slices.job.name] += observed


def _counting_kernel(kernel):
    """The method's fused kernel, which also counts the chunk's elements when asked to ``observe``."""

    def fused(slices, context, counts: bool, observe: bool):
        result = kernel(slices, context, counts, observe)
        if result is not None and observe:
            result = dataclasses.replace(result, observed=slices.span.numel)
        return result

    return fused


def _merge(monkeypatch, models, out: Path, observer_type: type) -> ChunkCounter:
    """Merge with task arithmetic (scale 0.5) under the name ``NAME``, its fused kernel counting for an observer
    of ``observer_type``; that observer after the merge."""
    made: list[ChunkCounter] = []

    def observer(params: dict, plan) -> ChunkCounter:
        made.append(observer_type())
        return made[-1]

    plain = METHODS["task-arithmetic"]
    assert plain.streaming.fused is not None and plain.analysis.observer is None
    counted = dataclasses.replace(
        plain,
        name=NAME,
        streaming=dataclasses.replace(plain.streaming, fused=_counting_kernel(plain.streaming.fused)),
        analysis=dataclasses.replace(plain.analysis, observer=observer),
    )
    monkeypatch.setitem(METHODS, NAME, counted)
    base, agents = models
    pipeline.merge(
        pipeline.MergeSpec.build(str(base), [str(a) for a in agents], out, NAME, {"scale": 0.5}, device="cpu"),
        options=pipeline.RunOptions(use_cache=False, chunk_elements=1000),
    )
    (only,) = made
    return only


def _sizes(folder: Path) -> Counter[str]:
    """Each float tensor's element count, read from the safetensors files."""
    sizes: Counter[str] = Counter()
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 — safe_open is not iterable
                sizes[name] = f.get_tensor(name).numel()
    return sizes


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.safetensors"))}


def test_a_slice_observer_takes_the_fused_kernels_counts(monkeypatch, models, tmp_path):
    """Every merged element is counted once, by the kernel, and handed to ``observe_slices``; the torch path's
    ``observe`` never runs. An observer without ``observe_slices`` sees the same elements through ``observe``
    (the torch path), and the output is the same bytes."""
    pytest.importorskip("numba")
    fused = _merge(monkeypatch, models, tmp_path / "fused", KernelCounter)
    sizes = _sizes(models[0])
    assert fused.from_kernel == sizes and not fused.watched
    plain = _merge(monkeypatch, models, tmp_path / "torch", ChunkCounter)
    assert plain.watched == sizes and not plain.from_kernel
    assert _bytes(tmp_path / "fused") == _bytes(tmp_path / "torch")
