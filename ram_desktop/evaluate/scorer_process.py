"""Python scorers run in a child process, with a time limit on every call (docs/evaluate.md, Scorers).

A ``python:FILE.py:FUNCTION`` scorer is the user's own code: it may loop forever, call ``os._exit``,
crash the interpreter (a segfault, ``SIGKILL``) or raise. It runs in one child process, started with
``spawn`` (never ``fork``: the evaluation's process holds torch's threads, and the window Qt's) and
reused for every batch of every suite, so a batch costs one round trip of its texts and floats. The child
imports this module, the standard library and what the scorer file imports; nothing of torch or Qt.

A call is sent (``send_call``) and its answer collected later (``receive``), so that the evaluation
generates the next batch while the child scores this one. Each load and call waits at most its time
limit, counted from when it was sent; a child that does not answer in time is killed, one
that dies is noticed, and either way the call raises ``ScorerError`` and the next call starts a fresh
child. The parent keeps the (file, function) pairs it loaded and loads them again in a new child.

Messages to the child: ``("load", file, function)`` and ``("call", file, function, prompts,
completions, columns)``. Answers: ``("ok", None)``, ``("values", [float | str])`` (a ``str`` is the
``repr`` of an item that is not a real number), ``("returned", type name)`` for a result that is not a
sequence, or ``("failed", text)`` for an exception (the text says which).
"""

from __future__ import annotations

import collections
import importlib.util
import itertools
import multiprocessing
import numbers
import re
import signal
import sys
import time
import types
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..core import first_line

DEFAULT_TIMEOUT = 60.0  # seconds for one batch (and for loading a scorer file)
POLL_SECONDS = 0.05  # how often a waiting parent checks for cancellation
_module_counter = itertools.count()


class ScorerError(Exception):
    """The scorer's code failed in its child process: ``str(error)`` says how (raised, did not return in
    time, ended or crashed the process); the caller names the suite and the examples."""


class ScorerProcess:
    """The child process python scorers run in; started at the first load and again after a failure.

    ``check`` (called while waiting, every ``POLL_SECONDS``) may raise to stop waiting, e.g. the
    reporter's cancellation: the child is killed and the exception propagates."""

    def __init__(self, check: Callable[[], None] | None = None) -> None:
        self.check = check or (lambda: None)
        self._process: Any = None  # multiprocessing's SpawnProcess
        self._conn: Connection | None = None
        self._loaded: set[tuple[str, str]] = set()  # loaded in this parent's view, reloaded in a fresh child
        self._in_child: set[tuple[str, str]] = set()
        self._sent: collections.deque[tuple[float, float]] = collections.deque()  # (deadline, limit) per call out
        self.starts = 0

    def load(self, file: Path, function: str, timeout: float) -> None:
        """Execute ``file`` in the child and find ``function`` there; ``ScorerError`` when it cannot."""
        key = (str(file), function)
        self._loaded.add(key)
        self._ensure_loaded(key, timeout)

    def send_call(
        self,
        file: Path,
        function: str,
        prompts: list[str],
        completions: list[str],
        columns: dict[str, list[Any]],
        timeout: float,
    ) -> None:
        """Start a call of the loaded ``function`` of ``file`` (``receive`` collects its answer); one at a time."""
        key = (str(file), function)
        if key not in self._loaded:
            raise ValueError(f"{function} of {file} was not loaded")
        if self._sent:  # an answer nobody collected (its caller stopped early): start clean
            self._stop()
        self._ensure_loaded(key, timeout)
        self._send(("call", *key, prompts, completions, columns), timeout)

    def receive(self) -> tuple[str, Any]:
        """The answer of the call sent last (see the module docstring), or ``ScorerError``."""
        return self._receive()

    def close(self) -> None:
        """End the child (it also ends by itself when this process goes away: its pipe closes)."""
        conn, process = self._conn, self._process
        self._conn, self._process, self._in_child = None, None, set()
        self._sent.clear()
        if conn is not None:
            conn.close()  # the child reads the end of its pipe and returns
        if process is not None:
            process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join()

    def _ensure_loaded(self, key: tuple[str, str], timeout: float) -> None:
        if key in self._in_child and self._process is not None:
            return
        try:
            self._send(("load", *key), timeout)
            kind, value = self._receive()
        except ScorerError as e:
            raise ScorerError(f"{key[0]}: loading the scorer module {e}") from None
        if kind != "ok":
            raise ScorerError(value)
        self._in_child.add(key)

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        process = context.Process(target=serve, args=(child_end,), name="ram-desktop scorer", daemon=True)
        # spawn runs the parent's main script again in the child (as __mp_main__) so that what it defines can
        # be unpickled there; for the console scripts that is the whole CLI (ram-merge) or the window
        # (ram-desktop). The child needs none of it: started with a bare __main__, it imports only this module.
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            process.start()
        finally:
            sys.modules["__main__"] = main
        child_end.close()  # the parent keeps one end: the pipe reads as closed when the child dies
        self._process, self._conn, self._in_child = process, parent_end, set()
        self.starts += 1

    def _send(self, message: tuple[Any, ...], timeout: float) -> None:
        if self._process is None:
            self._start()
        assert self._conn is not None
        try:
            self._conn.send(message)
        except OSError:  # the child is gone
            raise ScorerError(f"{self._ended()}; a scorer must return, not end its process") from None
        self._sent.append((time.monotonic() + timeout, timeout))

    def _receive(self) -> tuple[str, Any]:
        conn = self._conn
        assert conn is not None and self._sent
        deadline, timeout = self._sent.popleft()
        try:
            while not conn.poll(min(POLL_SECONDS, max(deadline - time.monotonic(), 0.0))):
                self.check()
                if time.monotonic() >= deadline:
                    self._stop()
                    raise ScorerError(f"did not return within {timeout:g} s and was stopped")
            answer: tuple[str, Any] = conn.recv()
            return answer
        except (EOFError, OSError):  # the child is gone: its end of the pipe closed (or broke mid-message)
            raise ScorerError(f"{self._ended()}; a scorer must return, not end its process") from None
        except BaseException:  # cancelled (the check raised) or interrupted: the child may be mid-call
            self._stop()
            raise

    def _ended(self) -> str:
        """How the child ended, in words (it is reaped first)."""
        process = self._process
        self._conn, self._process, self._in_child = None, None, set()
        self._sent.clear()
        if process is None:
            return "ended its process"
        process.join(5.0)
        code = process.exitcode
        if code is None:
            process.kill()
            process.join()
            return "closed its connection"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"crashed its process ({name})"
        return f"ended its process (exit code {code})"

    def _stop(self) -> None:
        process, conn = self._process, self._conn
        self._process, self._conn, self._in_child = None, None, set()
        self._sent.clear()
        if process is not None:
            process.kill()
            process.join()
        if conn is not None:
            conn.close()


# --- the child ------------------------------------------------------------------------------------


def serve(conn: Connection) -> None:
    """The child's loop: answer ``load`` and ``call`` messages until the parent closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    functions: dict[tuple[str, str], Callable[..., Any]] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        kind, file, name = message[0], message[1], message[2]
        if kind == "load":
            try:
                functions[(file, name)] = load_function(Path(file), name)
                answer: tuple[str, Any] = ("ok", None)
            except LoadError as e:
                answer = ("failed", str(e))
        else:
            answer = call(functions[(file, name)], *message[3:])
        conn.send(answer)


class LoadError(Exception):
    """A scorer file that cannot be loaded, or lacks its function; the text names the file."""


def load_function(file: Path, name: str) -> Callable[..., Any]:
    """Execute ``file`` as a fresh module and return its function ``name`` (the file's folder is on
    ``sys.path`` while it loads, so it can import its neighbours)."""
    if not file.is_file():
        raise LoadError(f"no such file {file}")
    module_name = f"_ram_eval_scorer_{next(_module_counter)}_{re.sub(r'[^0-9A-Za-z_]', '_', file.stem)}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise LoadError(f"{file} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, str(file.parent))
    try:
        spec.loader.exec_module(module)
    except SystemExit as e:
        sys.modules.pop(module_name, None)
        raise LoadError(
            f"{file}: loading the scorer module called sys.exit({e.code!r}); a scorer file must only define its function"
        ) from None
    except BaseException as e:  # noqa: BLE001  the user's module: whatever loading it raises is named
        sys.modules.pop(module_name, None)
        raise LoadError(f"{file}: loading the scorer module raised {type(e).__name__}: {first_line(e)}") from None
    finally:
        try:
            sys.path.remove(str(file.parent))
        except ValueError:
            pass
    function = getattr(module, name, None)
    if function is None:
        raise LoadError(f"{file}: has no function {name!r}")
    if not callable(function):
        raise LoadError(f"{file}: {name!r} is not a function")
    return function


def call(function: Callable[..., Any], prompts: list[str], completions: list[str], columns: dict[str, Any]) -> tuple:
    """Call a reward function; its result as plain floats (or the ``repr`` of what is not a number)."""
    try:
        rewards = function(prompts, completions, **columns)
        if hasattr(rewards, "tolist") and not isinstance(rewards, (list, tuple)):
            rewards = rewards.tolist()  # a numpy array or torch tensor
        if not isinstance(rewards, (list, tuple)):
            return ("returned", type(rewards).__name__)
        return ("values", [plain(r) for r in rewards])
    except SystemExit as e:
        return ("failed", f"called sys.exit({e.code!r}); a reward function must return its scores")
    except BaseException as e:  # noqa: BLE001  the user's reward function: whatever it raises is named
        return ("failed", f"raised {type(e).__name__}: {first_line(e)}")


def plain(value: Any) -> float | str:
    """A reward as a float (NaN and infinities stay, for the parent to refuse), else its ``repr``."""
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a numpy scalar or 0-d tensor
        item = value.item()
        if isinstance(item, numbers.Real):
            return float(item)
    return repr(value)
