"""The accelerator orchestration, run on the CPU through the same code a CUDA run takes: a recording
fake of the device module (``torch.get_device_module``) sees every stream, copy and event, and the
test checks the order copy → event → wait → compute → write for every chunk, that no chunk's
tensors change between their read and their use, and that the output equals a plain merge's."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from safetensors import safe_open

from ram_desktop.core import MergeSpec, RunOptions
from ram_desktop.core.engine import passes as passes_module
from ram_desktop.core.engine.chunks import PREFETCH_DEPTH, StoredSlices
from ram_desktop.core.pipeline import merge
from ram_desktop.core.storage import transfer as transfer_module
from ram_desktop.core.storage.output import ShardSet


class Recorder:
    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.threads: list[str] = []
        self.lock = threading.Lock()

    def add(self, *entry) -> None:
        with self.lock:
            self.log.append(entry)
            self.threads.append(threading.current_thread().name)


class FakeDeviceModule:
    """What ``Transfer`` uses of ``torch.cuda`` / ``torch.cpu``, recording each call."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.events = 0
        self.compute = self.Stream("compute")
        self.current: list = [self.compute]

    def Stream(self, name: str = "copy"):
        rec = self.rec

        class FakeStream:
            def __init__(self) -> None:
                self.name = name

            def wait_event(self, event) -> None:
                rec.add("wait", event.id, self.name)

        return FakeStream()

    def Event(self):
        rec = self.rec
        self.events += 1
        number = self.events

        class FakeEvent:
            id = number

            def record(self, stream) -> None:
                rec.add("record", self.id, stream.name)

        return FakeEvent()

    @contextmanager
    def stream(self, stream):
        self.rec.add("enter", stream.name)
        self.current.append(stream)
        try:
            yield
        finally:
            self.current.pop()
            self.rec.add("exit", stream.name)

    def current_stream(self, device=None):
        return self.compute


def test_transfer_orders_copy_event_wait_compute_write(tmp_path, models, monkeypatch):
    base, agents = models
    monkeypatch.setattr(passes_module, "use_kernels", lambda device_type, elements: False)
    reference = merge(
        MergeSpec.build(str(base), list(map(str, agents)), tmp_path / "plain", "ram-plus", out_dtype="float32"),
        options=RunOptions(chunk_elements=300, use_cache=False),
    )

    rec = Recorder()
    fake = FakeDeviceModule(rec)
    monkeypatch.setattr(transfer_module.torch, "get_device_module", lambda device: fake)
    monkeypatch.setenv("RAM_DESKTOP_THREADS", "1")
    sent_not_received = {"now": 0, "most": 0}
    real_send, real_receive = transfer_module.Transfer.send, transfer_module.Transfer.receive

    def send(self, tensors):
        staged = real_send(self, tensors)
        rec.add("send", staged.event.id)
        with rec.lock:
            sent_not_received["now"] += 1
            sent_not_received["most"] = max(sent_not_received["most"], sent_not_received["now"])
        assert staged.host is not None  # host copies stay alive until the consumer has waited
        return staged

    def receive(self, staged):
        event = staged.event.id
        tensors = real_receive(self, staged)
        assert staged.host is None  # released only after the wait
        with rec.lock:
            sent_not_received["now"] -= 1
        rec.add("received", event)
        return tensors

    monkeypatch.setattr(transfer_module.Transfer, "send", send)
    monkeypatch.setattr(transfer_module.Transfer, "receive", receive)

    real_load = StoredSlices.load
    files = {}

    def load(self, workspace=None):
        job, span = self.job, self.span
        path = str(job.base.file)
        handle = files.get(path) or files.setdefault(path, safe_open(path, framework="pt"))
        stored = handle.get_slice(job.base.name)[span.start : span.stop].reshape(-1)
        assert torch.equal(self.base, stored)  # the chunk's tensors still hold what was read for it
        rec.add("compute", self.index, span.offset)
        return real_load(self, workspace)

    monkeypatch.setattr(StoredSlices, "load", load)
    real_write = ShardSet.write

    def write(self, job_index, data):
        rec.add("write", job_index)
        return real_write(self, job_index, data)

    monkeypatch.setattr(ShardSet, "write", write)

    result = merge(
        MergeSpec.build(str(base), list(map(str, agents)), tmp_path / "fake", "ram-plus", out_dtype="float32"),
        options=RunOptions(chunk_elements=300, use_cache=False),
    )

    for name in ("model.safetensors",):
        assert (result.out / name).read_bytes() == (reference.out / name).read_bytes()

    log = rec.log
    # the reader thread copies on the copy stream, inside its context, and records the event there
    reader = [e for e, t in zip(log, rec.threads) if t == "ram-desktop-reader"]
    records = [i for i, e in enumerate(reader) if e[0] == "record"]
    assert records and all(reader[i][2] == "copy" for i in records)
    for i in records:
        assert reader[i - 1] == ("enter", "copy") and reader[i + 1] == ("exit", "copy")
    # per chunk (event id): record < send < wait on the compute stream < received
    position = {}
    for i, entry in enumerate(log):
        if entry[0] in ("record", "send", "wait", "received"):
            position[(entry[0], entry[1])] = i
    events = sorted({e[1] for e in log if e[0] == "record"})
    for ev in events:
        assert position[("record", ev)] < position[("send", ev)] < position[("wait", ev)] < position[("received", ev)]
        assert ("wait", ev, "compute") in log
    # the merge pass (the last reads): chunk k is received, then computed, then written, in order
    writes = [i for i, e in enumerate(log) if e[0] == "write"]
    computes = [i for i, e in enumerate(log) if e[0] == "compute"][-len(writes) :]
    received = [i for i, e in enumerate(log) if e[0] == "received"][-len(writes) :]
    assert len(writes) == len(computes) == len(received) > 1  # every tensor is float here: one write per chunk
    for r, c, w in zip(received, computes, writes):
        assert r < c < w
    assert [log[i][1] for i in computes] == [log[i][1] for i in writes]  # written in the order computed
    # the reader runs ahead, but never more than the prefetch depth (plus the one being handed over)
    assert 1 < sent_not_received["most"] <= PREFETCH_DEPTH + 2


def test_fused_cpu_passes_hand_the_stored_bits_through_untouched(tmp_path, models, monkeypatch):
    """On the fused kernels the reader's slices are numpy views of the stored bits: no stream, copy or event
    (the device module is never asked for), each chunk computed before it is written, in order, and the
    output equal to the torch path's."""
    if not passes_module.kernels.available():
        pytest.skip("numba not installed")
    base, agents = models
    with monkeypatch.context() as torch_path:
        torch_path.setattr(passes_module, "use_kernels", lambda device_type, elements: False)
        reference = merge(
            MergeSpec.build(str(base), list(map(str, agents)), tmp_path / "plain", "ram-plus", out_dtype="float32"),
            options=RunOptions(chunk_elements=300, use_cache=False),
        )

    def no_device_module(device):
        raise AssertionError("a fused CPU pass asked for a device module")

    monkeypatch.setattr(transfer_module.torch, "get_device_module", no_device_module)
    monkeypatch.setenv("RAM_DESKTOP_THREADS", "1")  # one compute thread: the log's order is the compute order
    log: list[tuple] = []
    real_send, real_fused, real_write = transfer_module.Transfer.send, passes_module._fused_merges, ShardSet.write
    files = {}

    def send(self, tensors):
        staged = real_send(self, tensors)
        assert staged.event is None and all(isinstance(t, np.ndarray) for t in staged.tensors)
        return staged

    def fused_merges(slices, variants, accumulator):
        job, span = slices.job, slices.span
        path = str(job.base.file)
        handle = files.get(path) or files.setdefault(path, safe_open(path, framework="pt"))
        stored = handle.get_slice(job.base.name)[span.start : span.stop].reshape(-1)
        assert slices.base.tobytes() == stored.contiguous().view(torch.uint8).numpy().tobytes()  # the stored bits
        log.append(("compute", slices.index, span.offset))
        return real_fused(slices, variants, accumulator)

    def write(self, job_index, data):
        log.append(("write", job_index))
        return real_write(self, job_index, data)

    monkeypatch.setattr(transfer_module.Transfer, "send", send)
    monkeypatch.setattr(passes_module, "_fused_merges", fused_merges)
    monkeypatch.setattr(ShardSet, "write", write)
    result = merge(
        MergeSpec.build(str(base), list(map(str, agents)), tmp_path / "fused", "ram-plus", out_dtype="float32"),
        options=RunOptions(chunk_elements=300, use_cache=False),
    )

    assert (result.out / "model.safetensors").read_bytes() == (reference.out / "model.safetensors").read_bytes()
    computes = [i for i, e in enumerate(log) if e[0] == "compute"]
    writes = [i for i, e in enumerate(log) if e[0] == "write"]
    assert len(computes) == len(writes) > 1  # every tensor is float here: one write per chunk
    assert [log[i][1] for i in computes] == [log[i][1] for i in writes]  # written in the order computed
    assert all(c < w for c, w in zip(computes, writes))  # chunk k is computed before it is written
