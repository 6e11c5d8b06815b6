"""PEFT LoRA adapters as agents.

A folder with ``adapter_config.json`` and ``adapter_model.safetensors`` is an agent whose task vector is
τ = scale · B·A for every adapted weight (scale = lora_alpha / r, or lora_alpha / √r with
``use_rslora``; ``rank_pattern`` / ``alpha_pattern`` override r and alpha per module) and 0 for every
other tensor. τ is never formed whole: the engine reads row slices, and a slice of rows
``start:stop`` of τ is scale · (B[start:stop] · A) (for ``fan_in_fan_out`` layers and embeddings,
whose weight is the transpose, scale · (B · A[:, start:stop])ᵀ), summed over the rank in a fixed order
in float64 and rounded once to float32 (``fixed_order_product``: the same bytes on any CPU and for any
chunk size), so memory stays bounded by the chunk (plus the small factor A or B).

``bind(adapter, base)`` turns an opened adapter into an agent aligned with the base: adapted tensors
read from a virtual weights file ``<adapter>/adapter_model.lora-delta`` (``open_delta``) whose slices
are already task vectors (the chunk builder copies them instead of subtracting the base), the others
read the base's own values (τ = 0 exactly). The adapter's base must be the plan's base: the shapes
must match, and ``base_model_name_or_path`` must name it (same path, Hub id, or folder name).
An adapter named ``MODEL+ADAPTER`` (``Checkpoint.applied_to``) is bound only when MODEL is the base.

Inside ``reuse_deltas`` (a merge, a compare, a search) the rows computed once are kept in a temporary file
per adapted weight and read back by later passes, variants and trials (``DeltaStore``).

Refused, naming the key: DoRA (``lora_magnitude_vector``), ``modules_to_save`` copies, trained biases,
and any tensor that is not a LoRA factor.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from safetensors import safe_open

from ...errors import InputError
from ...lazy import torch
from ..safe_read import check_regular, read_json
from .base import Checkpoint, TensorInfo
from .safetensors_format import read_header

if TYPE_CHECKING:
    from typing_extensions import Self

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
DELTA_FILE = "adapter_model.lora-delta"
PREFIX = "base_model.model."
FACTOR = re.compile(
    r"^(?P<module>.+)\.(?P<kind>lora_A|lora_B)\.weight$|"
    r"^(?P<emodule>.+)\.(?P<ekind>lora_embedding_A|lora_embedding_B)$"
)


def is_adapter_folder(path: Path) -> bool:
    path = Path(path)
    # exists, not is_file: a FIFO or folder of either name makes the folder an adapter whose reader refuses it
    return path.is_dir() and (path / ADAPTER_CONFIG).exists() and (path / ADAPTER_WEIGHTS).exists()


def is_delta_file(file: Path) -> bool:
    return Path(file).name == DELTA_FILE


def is_lora(ckpt: Checkpoint) -> bool:
    """An opened adapter (not yet bound to a base)."""
    return is_adapter_folder(ckpt.path) and all(t.file.name == ADAPTER_WEIGHTS for t in ckpt.tensors.values())


@dataclass(frozen=True)
class LoraFactors:
    """The factors of one adapted weight ``target`` (a base tensor name)."""

    target: str
    a_name: str
    b_name: str
    rank: int
    scale: float
    transposed: bool  # weight = (B·A)ᵀ: fan_in_fan_out layers and embeddings
    shape: tuple[int, ...]  # the weight's shape


def read_config(folder: Path) -> dict:
    config = read_json(Path(folder) / ADAPTER_CONFIG)
    if not isinstance(config, dict):
        raise InputError(f"{folder / ADAPTER_CONFIG}: not a PEFT adapter config")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise InputError(
            f"{folder / ADAPTER_CONFIG}: peft_type {peft_type} is not LoRA; only LoRA adapters can be merged as agents"
        )
    _check_fields(folder / ADAPTER_CONFIG, config)
    if config.get("use_dora"):
        raise InputError(
            f"{folder / ADAPTER_CONFIG}: use_dora: DoRA adapters rescale the weight's norm and have no "
            "task vector B·A; merge the adapter into its base first (peft merge_and_unload)"
        )
    return config


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_rank(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_fields(where: Path, config: dict) -> None:
    """The fields the merge reads, one by one, so that a bad value is one line naming the key (never a
    ZeroDivisionError or a traceback later): ``r`` a whole number ≥ 1, ``lora_alpha`` a finite number, the
    flags true or false, ``rank_pattern`` / ``alpha_pattern`` objects whose keys compile as regular
    expressions and whose values are ranks / numbers."""
    if not isinstance(config.get("peft_type", "LORA"), str):
        raise InputError(f'{where}: peft_type must be a text such as "LORA", got {config["peft_type"]!r}')
    if "r" in config and not _is_rank(config["r"]):
        raise InputError(f"{where}: r must be a whole number ≥ 1 (the LoRA rank), got {config['r']!r}")
    if "lora_alpha" in config and not _is_number(config["lora_alpha"]):
        raise InputError(f"{where}: lora_alpha must be a finite number, got {config['lora_alpha']!r}")
    for flag in ("use_rslora", "use_dora", "fan_in_fan_out"):
        if config.get(flag) is not None and not isinstance(config[flag], bool):
            raise InputError(f"{where}: {flag} must be true or false, got {config[flag]!r}")
    for key, valid, what in (
        ("rank_pattern", _is_rank, "a whole number ≥ 1"),
        ("alpha_pattern", _is_number, "a finite number"),
    ):
        patterns = config.get(key)
        if patterns is None:
            continue
        if not isinstance(patterns, dict):
            raise InputError(f"{where}: {key} must be an object of module pattern → value, got {patterns!r}")
        for pattern, value in patterns.items():
            try:
                re.compile(rf"(.*\.)?{pattern}$")
            except (re.error, RecursionError, OverflowError) as e:
                raise InputError(f"{where}: {key}: {pattern!r} is not a valid regular expression ({e})") from None
            if not valid(value):
                raise InputError(f"{where}: {key}[{pattern!r}] must be {what}, got {value!r}")


def _pattern_value(patterns: dict | None, module: str, default: float) -> float:
    """PEFT's ``rank_pattern`` / ``alpha_pattern``: the first key that matches the end of the module name."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?{key}$", module):
            return value
    return default


def factors(folder: Path, tensors: dict[str, TensorInfo], config: dict) -> dict[str, LoraFactors]:
    """Group the adapter's tensors into (A, B) pairs per adapted weight, with their scale."""
    where = Path(folder) / ADAPTER_WEIGHTS
    pairs: dict[str, dict[str, str]] = {}
    embedding: set[str] = set()
    for name in tensors:
        m = FACTOR.match(name)
        if m is None:
            if "lora_magnitude_vector" in name:
                raise InputError(
                    f"{where}: {name!r} is a DoRA magnitude; DoRA adapters cannot be merged as task "
                    "vectors — merge the adapter into its base first"
                )
            if ".base_layer." in name:
                raise InputError(
                    f"{where}: tensor {name!r} is a full copy of a base layer (peft's "
                    "save_embedding_layers); if the vocabulary was not resized, save the adapter again "
                    "with save_embedding_layers=False, else merge it into its base and use the full model"
                )
            what = (
                "a modules_to_save copy"
                if "modules_to_save" in name or not name.startswith(PREFIX)
                else "a trained bias or other full tensor"
                if name.endswith(".bias")
                else "not a LoRA factor"
            )
            raise InputError(
                f"{where}: tensor {name!r} is {what}; only lora_A / lora_B factors can be merged as an "
                "agent (merge the adapter into its base and use the full model instead)"
            )
        module = m.group("module") or m.group("emodule")
        kind = (m.group("kind") or m.group("ekind")).replace("lora_embedding_", "lora_")
        if m.group("emodule"):
            embedding.add(module)
        pairs.setdefault(module, {})[kind] = name
    out: dict[str, LoraFactors] = {}
    for module, pair in pairs.items():
        if set(pair) != {"lora_A", "lora_B"}:
            missing = ({"lora_A", "lora_B"} - set(pair)).pop()
            raise InputError(f"{where}: module {module!r} has no {missing} factor")
        a, b = tensors[pair["lora_A"]], tensors[pair["lora_B"]]
        if len(a.shape) != 2 or len(b.shape) != 2:
            raise InputError(
                f"{where}: module {module!r}: only linear and embedding LoRA factors (2-D) are supported, "
                f"got {list(a.shape)} and {list(b.shape)}"
            )
        transposed = module in embedding or bool(config.get("fan_in_fan_out"))
        if module in embedding:  # A [r, num_embeddings], B [dim, r]: weight [num_embeddings, dim]
            rank, shape = a.shape[0], (a.shape[1], b.shape[0])
        else:  # A [r, in], B [out, r]: weight [out, in] (or [in, out] with fan_in_fan_out)
            rank = a.shape[0]
            shape = (a.shape[1], b.shape[0]) if transposed else (b.shape[0], a.shape[1])
        if rank < 1:
            raise InputError(f"{where}: module {module!r}: lora_A has no rows (rank 0); a LoRA factor has rank ≥ 1")
        if b.shape[1] != rank:
            raise InputError(f"{where}: module {module!r}: lora_B has {b.shape[1]} columns but lora_A has {rank} rows")
        bare = module.removeprefix(PREFIX)
        alpha = float(_pattern_value(config.get("alpha_pattern"), bare, config.get("lora_alpha", rank)))
        r = int(_pattern_value(config.get("rank_pattern"), bare, config.get("r", rank)))
        if r != rank:
            raise InputError(f"{where}: module {module!r} has rank {rank} but the config says r = {r}")
        scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        target = bare + ".weight"
        out[target] = LoraFactors(target, pair["lora_A"], pair["lora_B"], rank, scale, transposed, shape)
    return out


def open_adapter(folder: Path, spec: str) -> Checkpoint:
    """An adapter folder as a checkpoint of its own factors (the sources panel shows those); ``bind`` it."""
    folder = Path(folder).resolve()
    config = read_config(folder)
    tensors, metadata = read_header(folder / ADAPTER_WEIGHTS)
    factors(folder, tensors, config)  # every tensor is a LoRA factor
    return Checkpoint(spec, folder, [folder / ADAPTER_WEIGHTS], tensors, config=None, metadata=metadata)


def _names_base(recorded: str, base: Checkpoint) -> bool:
    """Whether ``base_model_name_or_path`` names the plan's base: same path, same Hub id, or same last name."""
    recorded = recorded.strip().rstrip("/")
    if not recorded:
        return True
    candidates = {str(base.path).rstrip("/"), base.spec.strip().rstrip("/"), base.path.name}
    if base.repo_id:
        candidates |= {base.repo_id, base.repo_id.split("/")[-1]}
    try:
        if Path(recorded).expanduser().exists() and Path(recorded).expanduser().resolve() == base.path.resolve():
            return True
    except OSError:
        pass
    recorded_id = recorded.split("@")[0]
    return recorded_id in candidates or recorded_id.split("/")[-1] in {c.split("/")[-1] for c in candidates}


def _same_model(model: Checkpoint, base: Checkpoint) -> bool:
    """Whether two opened checkpoints are the same model: the same folder or file (a Hub snapshot included)."""
    try:
        return model.path.resolve() == base.path.resolve()
    except OSError:
        return False


def bind(adapter: Checkpoint, base: Checkpoint) -> Checkpoint:
    """The adapter as an agent of ``base``: adapted tensors from the virtual delta file, the rest the base's."""
    folder = adapter.path
    if is_lora(base):
        raise InputError(f"{base.display}: a LoRA adapter cannot be the base; the base must be a full model")
    where = adapter.spec if adapter.applied_to is not None else str(folder)  # MODEL+ADAPTER: named as written
    if adapter.applied_to is not None and not _same_model(adapter.applied_to, base):
        raise InputError(
            f"{where}: applies the adapter to {adapter.applied_to.display}, but the merge's base is "
            f"{base.display}; an adapter is applied to the base only (write BASE+ADAPTER, or name the adapter "
            "as an agent)"
        )
    config = read_config(folder)
    recorded = str(config.get("base_model_name_or_path") or "")
    if not _names_base(recorded, base):
        raise InputError(
            f"{where}: the adapter was trained on {recorded!r} (adapter_config.json "
            f"base_model_name_or_path) but the base is {base.display}; use that base, or fix the config "
            "if it is the same model under another name"
        )
    pairs = factors(folder, adapter.tensors, config)
    tensors = dict(base.tensors)
    delta = folder / DELTA_FILE
    for target, f in pairs.items():
        info = base.tensors.get(target)
        if info is None:
            raise InputError(
                f"{where}: the adapter changes {target!r}, which the base {base.display} does not have; "
                "it was trained on another architecture"
            )
        if tuple(info.shape) != f.shape:
            raise InputError(
                f"{where}: the adapter's {target!r} is {list(f.shape)} but the base {base.display} has "
                f"{list(info.shape)}; it was trained on another base"
            )
        tensors[target] = TensorInfo(target, info.dtype, info.shape, delta)
    # the config is listed too: its scale changes τ, so an edit must invalidate a cached probe
    files = [folder / ADAPTER_WEIGHTS, folder / ADAPTER_CONFIG, *base.files]
    return Checkpoint(
        adapter.spec,
        folder,
        files,
        tensors,
        config=base.config,
        revision=adapter.revision,
        repo_id=adapter.repo_id,
        metadata=dict(adapter.metadata),
        applied_to=adapter.applied_to,
    )


def bind_all(base: Checkpoint, agents: list[Checkpoint]) -> list[Checkpoint]:
    """Every adapter among ``agents`` bound to ``base`` (others unchanged); an adapter as base is an error."""
    if is_lora(base):
        raise InputError(f"{base.display}: a LoRA adapter cannot be the base; the base must be a full model")
    return [bind(a, base) if is_lora(a) else a for a in agents]


class _DeltaSlice:
    def __init__(self, handle: DeltaHandle, target: str) -> None:
        self.handle, self.target = handle, target

    def __getitem__(self, rows: slice) -> torch.Tensor:
        return self.handle.rows(self.target, rows.start or 0, rows.stop)


class DeltaHandle:
    """Slices of τ = scale·B·A for the adapter's weights (``SliceReader`` reads it like a weights file)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.config = read_config(self.folder)
        tensors, _ = read_header(self.folder / ADAPTER_WEIGHTS)
        self.pairs = factors(self.folder, tensors, self.config)
        check_regular(self.folder / ADAPTER_WEIGHTS)  # safe_open opens it itself: a FIFO would block it
        self._file = safe_open(str(self.folder / ADAPTER_WEIGHTS), framework="pt")
        self._whole: dict[str, torch.Tensor] = {}  # the small factor of each weight (A, or B when transposed)
        self.largest = 0  # elements of the largest slice computed (tests: bounded by the chunk)
        # what the rows depend on: a store keeps them only while the adapter's files are unchanged
        self._identity = (
            str(self.folder.resolve()),
            *(_file_identity(self.folder / name) for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)),
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._whole.clear()
        close = getattr(self._file, "__exit__", None)
        if close is not None:
            close(None, None, None)

    def get_slice(self, target: str) -> _DeltaSlice:
        return _DeltaSlice(self, target)

    def get_tensor(self, target: str) -> torch.Tensor:
        return self.rows(target, 0, self.pairs[target].shape[0])

    def rows(self, target: str, start: int, stop: int | None) -> torch.Tensor:
        """Rows ``start:stop`` of the weight's task vector, float32, the same bytes on any CPU and for any
        slicing (see ``fixed_order_product``); inside ``reuse_deltas``, rows computed earlier in the scope are
        read back instead of computed again."""
        f = self.pairs[target]
        stop = f.shape[0] if stop is None else min(stop, f.shape[0])
        store = _active_store()
        if store is None:
            return self._compute(f, start, stop)
        key = (self._identity, target)
        kept = store.get(key, start, stop)
        if kept is not None:
            return kept
        out = self._compute(f, start, stop)
        store.put(key, f.shape, start, stop, out)
        return out

    def _compute(self, f: LoraFactors, start: int, stop: int) -> torch.Tensor:
        global computed_elements
        if not f.transposed:  # τ[start:stop] = scale · (B[start:stop] · A)
            left = self._file.get_slice(f.b_name)[start:stop]
            right = self._factor(f.a_name)
        else:  # τ = (B·A)ᵀ: τ[start:stop] = scale · A[:, start:stop]ᵀ · Bᵀ
            left = self._file.get_slice(f.a_name)[:, start:stop].t()
            right = self._factor(f.b_name).t()
        out = fixed_order_product(left, right, f.scale)
        self.largest = max(self.largest, out.numel())
        with _STORE_LOCK:
            computed_elements += out.numel()
        return out

    def _factor(self, name: str) -> torch.Tensor:
        if name not in self._whole:
            self._whole[name] = self._file.get_tensor(name).to(torch.float64)
        return self._whole[name]


def fixed_order_product(left: torch.Tensor, right: torch.Tensor, scale: float) -> torch.Tensor:
    """scale · left·right as float32, summed over the rank in increasing order in float64 and rounded once.

    A BLAS matmul picks its summation order by CPU and by matrix shape, so its float32 bits would depend on
    the machine and on the chunk size. Here every element is Σ_k left[i,k]·right[k,j] taken k = 0, 1, …
    with elementwise float64 operations, then multiplied by ``scale`` and rounded to float32: the same bits
    everywhere. Each product of two float32 (or bfloat16) factors is exact in float64, so a fused
    multiply-add and a separate multiply and add give the same sum.
    """
    left = left.to(torch.float64)
    right = right.to(torch.float64)
    acc = torch.zeros((left.shape[0], right.shape[1]), dtype=torch.float64)
    for k in range(left.shape[1]):
        acc.addcmul_(left[:, k : k + 1], right[k : k + 1, :])
    return acc.mul_(scale).to(torch.float32)


def open_delta(file: Path) -> DeltaHandle:
    return DeltaHandle(Path(file).parent)


# ---- one computation of an adapter's τ per run ----------------------------------------------------------------

computed_elements = 0  # τ elements computed from the factors in this process (tests count the applications)
_STORE_LOCK = threading.Lock()
_STORE: list[DeltaStore] = []  # the active scope (reentrant: nested scopes share the outermost store)


def _file_identity(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _active_store() -> DeltaStore | None:
    with _STORE_LOCK:
        return _STORE[0] if _STORE else None


class DeltaStore:
    """Task-vector rows of LoRA adapters computed in one run, kept in a temporary file per adapted weight (a
    float32 array of the weight's shape, filled as rows are computed; on disk and in the page cache, not in
    the process's own memory; up to ``BUDGET`` bytes in all), so that the probe pass, the merge pass, every compare variant and every search
    trial read τ = scale·B·A back instead of computing it again: the same bytes, computed once."""

    BUDGET = 4 * 2**30  # bytes of temporary files at most: the weights beyond it are computed again when re-read

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="ram-lora-delta-"))
        self._arrays: dict[tuple, tuple[np.memmap, list[tuple[int, int]]]] = {}
        self._lock = threading.Lock()
        self._reserved = 0

    def get(self, key: tuple, start: int, stop: int) -> torch.Tensor | None:
        with self._lock:
            held = self._arrays.get(key)
            if held is None or not any(a <= start and stop <= b for a, b in held[1]):
                return None
            return torch.from_numpy(np.array(held[0][start:stop]))

    def put(self, key: tuple, shape: tuple[int, ...], start: int, stop: int, rows: torch.Tensor) -> None:
        try:
            with self._lock:
                held = self._arrays.get(key)
                if held is None:
                    size = 4 * math.prod(shape)
                    if self._reserved + size > self.BUDGET:
                        return
                    path = self.folder / f"{len(self._arrays)}.f32"
                    held = self._arrays[key] = (np.memmap(path, np.float32, "w+", shape=shape), [])
                    self._reserved += size
                held[0][start:stop] = rows.numpy()
                held[1].append((start, stop))
        except OSError:  # no room for the copy: the rows are computed again when asked for again
            pass

    def close(self) -> None:
        with self._lock:
            self._arrays.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def reuse_deltas() -> Iterator[None]:
    """Within this scope every adapter's τ rows are computed once and read back after (``DeltaStore``); a
    nested scope shares the outer one. The temporary files are removed when the outermost scope ends."""
    with _STORE_LOCK:
        outer = bool(_STORE)
    if outer:
        yield
        return
    try:
        store = DeltaStore()
    except OSError:  # no temporary folder: compute as before
        yield
        return
    with _STORE_LOCK:
        _STORE.append(store)
    try:
        yield
    finally:
        with _STORE_LOCK:
            _STORE.remove(store)
        store.close()
