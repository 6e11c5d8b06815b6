"""A simulated accelerator on the CPU, to catch a tensor made on the CPU and mixed into a device computation on a
machine without a GPU.

A tensor "on the device" is an ``OnDevice`` CPU tensor whose ``.device`` reads ``meta`` (so code that asks a
tensor for its device and makes new tensors there, or moves results to the host with ``.cpu()``, walks the same
branches a CUDA run walks). Inside ``simulated_device()``:

- a factory given ``device=meta`` (``torch.tensor``, ``empty``, ``zeros``, ``arange``, ...) and ``.to(meta)`` make
  ``OnDevice`` tensors; ``.cpu()`` / ``.to("cpu")`` give plain host tensors again;
- an operation that mixes an ``OnDevice`` tensor with a plain tensor of one or more dimensions raises
  torch's own CUDA error text ("Expected all tensors to be on the same device"), as CUDA does (a host 0-d
  tensor, a "CPU scalar", may join a device computation, as on CUDA); copies between the two, and host
  index tensors, are allowed, as on CUDA;
- ``.numpy()`` of an ``OnDevice`` tensor raises, as a CUDA tensor's does.

``SimulatedTransfer`` replaces ``storage.transfer.Transfer`` in the pipeline: chunks arrive as ``OnDevice``
tensors and the passes take the torch path (the fused numba kernels run for device type ``cpu`` only), one
compute thread, as on a GPU. ``meta`` is only a name here: no tensor is ever made on torch's meta device.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

SIM = torch.device("meta")
HOST = torch.device("cpu")
MIX_ERROR = "Expected all tensors to be on the same device, but found at least two devices, meta and cpu!"

# operations torch allows between a device tensor and a host tensor of any size (copies; host indices)
_MIX_ALLOWED = {"copy_", "__getitem__", "__setitem__", "index_select", "to", "cpu", "__get__", "__set__"}


class DeviceMix(RuntimeError):
    """A host tensor of one or more dimensions met a device tensor in one operation."""


def _is_sim(device: Any) -> bool:
    return device is not None and torch.device(device).type == "meta"


def _as_device(value: Any) -> Any:
    return value.as_subclass(OnDevice) if isinstance(value, torch.Tensor) and not isinstance(value, OnDevice) else value


def _as_host(value: Any) -> Any:
    return value.as_subclass(torch.Tensor) if isinstance(value, OnDevice) else value


def _to_target(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The device a ``Tensor.to`` call names, or None."""
    if "device" in kwargs:
        return kwargs["device"]
    for value in args[1:]:
        if isinstance(value, (str, torch.device)):
            return value
        if isinstance(value, torch.Tensor):
            return value.device
    return None


class OnDevice(torch.Tensor):
    """A CPU tensor standing for one on the simulated accelerator (module docstring)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == torch.Tensor.device.__get__:
            return SIM
        name = getattr(func, "__name__", "")
        if name == "numpy":
            raise TypeError(
                "can't convert meta device type tensor to numpy. Use Tensor.cpu() to copy the tensor first."
            )
        to_host = name == "cpu" or (
            name == "to" and _to_target(args, kwargs) is not None and not _is_sim(_to_target(args, kwargs))
        )
        if name == "to" and _is_sim(_to_target(args, kwargs)):
            args = (args[0], *[HOST if _is_sim(a) else a for a in args[1:]])
            kwargs = {k: (HOST if k == "device" else v) for k, v in kwargs.items()}
        if name not in _MIX_ALLOWED:
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            if any(isinstance(t, OnDevice) for t in tensors) and any(
                not isinstance(t, OnDevice) and t.dim() > 0 for t in tensors
            ):
                shapes = ", ".join(
                    f"{'device' if isinstance(t, OnDevice) else 'host'} {tuple(t.shape)}" for t in tensors
                )
                raise DeviceMix(f"{name} ({shapes}) in {threading.current_thread().name}: {MIX_ERROR}")
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)  # the tensors themselves: a setter (``.grad =``) must reach them
        if to_host:  # a copy on the host, as from a GPU (torch gives the tensor itself for a CPU one)
            return out.as_subclass(torch.Tensor).clone() if out is args[0] else tree_map(_as_host, out)
        if name in ("item", "tolist", "__len__", "__bool__", "__float__", "__int__", "__index__"):
            return out
        if name.endswith("_") and not name.startswith("__") and isinstance(out, torch.Tensor):
            return args[0]  # in place: the tensor itself, still on the device
        return tree_map(_as_device, out)


class _Factories(TorchFunctionMode):
    """Makes ``device=meta`` factories and ``.to(meta)`` of host tensors give ``OnDevice`` tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if _is_sim(kwargs.get("device")):
            return _as_device(func(*args, **{**kwargs, "device": HOST}))
        if name == "to" and args and not isinstance(args[0], OnDevice) and _is_sim(_to_target(args, kwargs)):
            rest = [HOST if _is_sim(a) else a for a in args[1:]]
            return _as_device(func(args[0], *rest, **{k: (HOST if k == "device" else v) for k, v in kwargs.items()}))
        return func(*args, **kwargs)


_active = threading.local()


@contextlib.contextmanager
def simulated_device() -> Iterator[None]:
    """Factories and moves to ``meta`` make ``OnDevice`` tensors in this thread (``SimulatedTransfer`` enters it
    in the threads it serves, so the reader and compute threads see it too)."""
    with _Factories():
        yield


class SimulatedTransfer:
    """``storage.transfer.Transfer`` for the simulated accelerator: tensors sent arrive as ``OnDevice``."""

    def __init__(self, device: Any = None, module: Any = None) -> None:
        self.spec = "meta"
        self.device_type = "meta"
        self.cuda = False
        self.device = SIM

    def send(self, tensors: Sequence[torch.Tensor | np.ndarray]) -> list[torch.Tensor]:
        assert not any(isinstance(t, np.ndarray) for t in tensors), "numpy bits are read for a CPU pass only"
        return [_as_device(t.clone()) for t in tensors]

    def receive(self, staged: list[torch.Tensor]) -> list[torch.Tensor]:
        return staged
