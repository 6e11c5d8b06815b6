"""Exceptions the faces turn into messages (CLI exit 2, GUI dialog) instead of tracebacks."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


class RamError(Exception):
    """Base class for every error the user can act on."""


class InputError(RamError):
    """Bad input: a missing path, corrupt file, mismatched tensors, unusable output folder...

    The message names the file, tensor or repository and says what to do.
    """


class ParameterError(InputError):
    """A method parameter's value refused while the method validates it (``Param.validate``, ``resolve``, the
    per-tensor values a merge reads). The message is the command line's, naming the flag; the fields let each
    face word it its own way: ``parameter`` (the ``Param``'s name), ``agent`` (the value's position in agent
    order when it is one agent's, else None), ``value`` (the value refused, as read) and ``reason`` (what is
    wrong, without the parameter: "must be a number", "must be at least 0.0"; for a setting's shape, where in
    it first: "[0].filter: expected text, found 5")."""

    def __init__(
        self, message: str, parameter: str = "", value: Any = None, reason: str = "", agent: int | None = None
    ) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value
        self.reason = reason
        self.agent = agent

    def at(self, parameter: str, agent: int | None = None) -> ParameterError:
        """The same refusal (same message) with the parameter and the agent it belongs to filled in."""
        return type(self)(str(self), parameter, self.value, self.reason, self.agent if agent is None else agent)


class NoBase(InputError):
    """A merge, compare or search asked for with no base model chosen: one message for every face and step
    (``MergeSpec.check_base`` raises it)."""

    MESSAGE = "no base model chosen; name the base the agents were fine-tuned from"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE)


class NoAgents(InputError):
    """A merge, compare or search asked for with no agent: one message for every face and step (``MergeSpec.
    check_agents`` and the engine's plan raise it)."""

    MESSAGE = "no agents chosen; name at least one agent fine-tuned from the base"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE)


class NoOutput(InputError):
    """A merge asked for with no output folder: one message for the merge, each compared variant and the window
    (``MergeSpec.check_output`` raises it)."""

    MESSAGE = "no output folder chosen; pass --out DIR (or choose one in the window)"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE)


class Cancelled(RamError):
    """The user cancelled the operation; partial output has been removed."""


def first_line(error: BaseException) -> str:
    """The first line of an error's text, for a one-line message that quotes a foreign error."""
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


class HubError(InputError):
    """A Hugging Face Hub failure for one repository; callers tell the kinds apart by class, never by text.

    ``repo_id`` and ``revision`` (as asked for; None for the default branch) travel with the error, as in
    huggingface_hub's own errors, so a face can name them or offer a fix without parsing the message.
    """

    def __init__(self, message: str, repo_id: str, revision: str | None = None) -> None:
        super().__init__(message)
        self.repo_id = repo_id
        self.revision = revision

    def with_message(self, message: str) -> HubError:
        """The same kind of error for the same repository, with a longer message (e.g. a hint appended)."""
        return type(self)(message, self.repo_id, self.revision)


class HubUnreachable(HubError):
    """The Hub could not be reached (network, proxy, timeout) and no usable cached copy was found."""


class HubOffline(HubError):
    """Offline mode (``HF_HUB_OFFLINE``) is on and what was asked for is not in the local cache."""


class RepoNotFound(HubError):
    """No such repository on the Hub, or it is private and the token (if any) has no access."""


class GatedRepo(HubError):
    """The repository is gated and the account behind the token has not been granted access."""


class RevisionNotFound(HubError):
    """The repository exists but the branch, tag or commit does not."""


class RepoDisabled(HubError):
    """The repository has been disabled by its owner."""


class HubFileMissing(HubError):
    """A file the Hub listed (or an index named) is not there to download."""


class HubAuthError(HubError):
    """The Hub refused the token (401) or it lacks permission (403)."""


class HubHTTPError(HubError):
    """Any other HTTP error answer of the Hub."""


class DeviceOutOfMemory(RamError):
    """An accelerator ran out of memory mid-run; the run stopped and wrote nothing (its staging folder is gone).

    ``device`` ("cuda:0") and ``doing`` ("merging", "probing") travel with it, so each face words its advice:
    the CLI names ``--device cpu``, the window its Device setting."""

    def __init__(self, device: str, doing: str) -> None:
        super().__init__(
            f"the GPU {device} ran out of memory while {doing}; nothing was written. Close other programs that use "
            "it, or run on the CPU (--device cpu)"
        )
        self.device = device
        self.doing = doing


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is torch's out-of-memory error of an accelerator (CUDA, ROCm, MPS), without importing
    torch where nothing has (then no such error can have been raised)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(error, getattr(torch, "OutOfMemoryError", ())):
        return True
    return isinstance(error, RuntimeError) and "MPS backend out of memory" in str(error)


@contextlib.contextmanager
def device_memory(device: str, doing: str) -> Iterator[None]:
    """Turns an accelerator's out-of-memory error raised inside into ``DeviceOutOfMemory`` (once the code inside
    has cleaned up after it: staging folders are removed as the error passes through them)."""
    try:
        yield
    except Exception as e:
        if device != "cpu" and is_out_of_memory(e):
            raise DeviceOutOfMemory(device, doing) from e
        raise


class ComputeError(RamError):
    """The compute set-up could not detect, fetch, verify or remove a torch build (docs/compute.md); the
    bundled torch stays in use."""
