"""Host → device transfer for the streaming passes, through torch's device-module API.

``torch.get_device_module(device)`` gives ``torch.cuda`` for a GPU and ``torch.cpu`` for the CPU; both
have ``Stream``, ``Event``, ``stream(...)`` and ``current_stream(...)``, and on the CPU they are no-ops.
So the CPU run in CI walks exactly the orchestration a CUDA run does: the reader thread stages a
chunk, copies it on a copy stream and records an event; the compute thread makes its stream wait for
that event before it touches the tensors. Only pinning host memory (and telling the caching
allocator which stream uses a tensor) is CUDA-specific.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Staged:
    """Tensors on their way to the device: usable on the compute stream after ``Transfer.receive``.

    ``host`` keeps the (pinned) host copies alive until the device copy has been ordered before any
    use, so a staging buffer is never freed or reused while a copy may still read it."""

    tensors: list[torch.Tensor]
    event: Any
    host: list[torch.Tensor] | None


class Transfer:
    """Copies chunk tensors to ``device`` on a side stream (see the module docstring)."""

    def __init__(self, device: torch.device, module: Any = None) -> None:
        self.device = device
        self.module = module if module is not None else torch.get_device_module(device)
        self.cuda = device.type == "cuda"
        self.copy_stream = self.module.Stream(device) if self.cuda else self.module.Stream()

    def send(self, tensors: list[torch.Tensor]) -> Staged:
        """On the reader thread: stage (pin on CUDA) and start the copies; returns at once."""
        host = [t.pin_memory() for t in tensors] if self.cuda else list(tensors)
        with self.module.stream(self.copy_stream):
            moved = [t.to(self.device, non_blocking=self.cuda) for t in host]
            event = self.module.Event()
            event.record(self.copy_stream)
        return Staged(moved, event, host)

    def receive(self, staged: Staged) -> list[torch.Tensor]:
        """On the compute thread: order the copy before every later use of the tensors, then release
        the host staging copies."""
        stream = self.module.current_stream(self.device)
        stream.wait_event(staged.event)
        if self.cuda:
            for t in staged.tensors:
                t.record_stream(stream)  # allocated on the copy stream, used on the compute stream
        staged.host = None
        return staged.tensors
