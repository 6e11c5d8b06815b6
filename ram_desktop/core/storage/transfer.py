"""Host → device transfer for the streaming passes, through torch's device-module API.

``torch.get_device_module(device)`` gives ``torch.cuda`` for a GPU and ``torch.cpu`` for the CPU; both
have ``Stream``, ``Event``, ``stream(...)`` and ``current_stream(...)``, and on the CPU they are no-ops.
So the CPU run in CI walks exactly the orchestration a CUDA run does: the reader thread stages a
chunk, copies it on a copy stream and records an event; the compute thread makes its stream wait for
that event before it touches the tensors. Only pinning host memory (and telling the caching
allocator which stream uses a tensor) is CUDA-specific.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..lazy import torch


@dataclass
class Staged:
    """Tensors on their way to the device: usable on the compute stream after ``Transfer.receive``.

    ``host`` keeps the (pinned) host copies alive until the device copy has been ordered before any
    use, so a staging buffer is never freed or reused while a copy may still read it."""

    tensors: list[torch.Tensor | np.ndarray]
    event: Any
    host: list[torch.Tensor] | None


class Transfer:
    """Copies chunk tensors to ``device`` on a side stream (see the module docstring).

    ``device`` is a torch device or its name ("cpu", "cuda:0"). On the CPU, slices that include numpy arrays
    (the stored bits the fused kernels read in place, ``chunks.SliceReader``) pass through untouched, so a
    CPU pass on the fused kernels never imports torch (``lazy``)."""

    def __init__(self, device: torch.device | str, module: Any = None) -> None:
        self.spec = str(device)
        self.device_type = self.spec.split(":")[0]
        self.cuda = self.device_type == "cuda"
        self._module = module

    @functools.cached_property
    def device(self) -> torch.device:
        return torch.device(self.spec)

    @functools.cached_property
    def module(self) -> Any:
        return self._module if self._module is not None else torch.get_device_module(self.device)

    @functools.cached_property
    def copy_stream(self) -> Any:
        return self.module.Stream(self.device) if self.cuda else self.module.Stream()

    def send(self, tensors: Sequence[torch.Tensor | np.ndarray]) -> Staged:
        """On the reader thread: stage (pin on CUDA) and start the copies; returns at once."""
        if not self.cuda and any(isinstance(t, np.ndarray) for t in tensors):
            return Staged(list(tensors), None, None)
        if self.device_type not in ("cpu", "cuda"):  # no copy streams (MPS): copied in order, synchronously
            return Staged([t.to(self.device) for t in tensors if not isinstance(t, np.ndarray)], None, None)
        staged = [t for t in tensors if not isinstance(t, np.ndarray)]
        assert len(staged) == len(tensors), "numpy bit slices are read for a CPU pass only (SliceReader bits)"
        host = [t.pin_memory() for t in staged] if self.cuda else staged
        with self.module.stream(self.copy_stream):
            moved: list[torch.Tensor | np.ndarray] = [t.to(self.device, non_blocking=self.cuda) for t in host]
            event = self.module.Event()
            event.record(self.copy_stream)
        return Staged(moved, event, host)

    def receive(self, staged: Staged) -> list[torch.Tensor | np.ndarray]:
        """On the compute thread: order the copy before every later use of the tensors, then release
        the host staging copies."""
        if staged.event is None:
            return staged.tensors
        stream = self.module.current_stream(self.device)
        stream.wait_event(staged.event)
        if self.cuda:
            for t in staged.tensors:
                assert not isinstance(t, np.ndarray), "send() passes numpy slices through on the CPU only"
                t.record_stream(stream)  # allocated on the copy stream, used on the compute stream
        staged.host = None
        return staged.tensors
