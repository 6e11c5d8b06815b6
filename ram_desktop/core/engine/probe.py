"""Pass 1 statistics: masks, overlap counts, ρ, per-layer density, and the methods' statistics of each agent's unique
elements (``contracts.ProbeStatistic``, handed in by the pipeline: the probe runs with no method chosen).

Counts are over the whole model (docs/engine.md, λ from whole-model counts): the accumulator sums per-chunk histograms.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import re
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import paths
from ..errors import InputError
from ..lazy import torch
from ..storage.safe_read import read_json
from .chunks import PATTERN_MAX_AGENTS, Chunk
from .inspection import JOINT_MAX_AGENTS, InspectAccumulator, InspectStats
from .plan import MergePlan

_log = logging.getLogger("ram_desktop")

if TYPE_CHECKING:
    from .contracts import ProbeStatistic
    from .kernels import SliceStatistics

FORMAT = "ram-probe/1"
LAYER = re.compile(r"^(.*?layers\.(\d+))\.(.+?)(?:\.(?:weight|bias))?$")


@dataclass
class AgentStats:
    name: str
    source: str
    updated: int
    unique: int
    shared: int
    overlap: list[int]  # overlap[k]: elements this agent updates that exactly k+1 agents update
    density: float

    @property
    def rho(self) -> float:
        """Overlap-unique ratio ρ = shared / unique (inf when nothing is unique)."""
        return self.shared / self.unique if self.unique else math.inf


@dataclass
class TensorStats:
    name: str
    params: int
    updated: list[int]  # per agent
    unique: list[int]  # per agent


@dataclass
class ProbeReport:
    eps: float
    params: int
    tensors: int
    agents: list[AgentStats]
    tensor_stats: list[TensorStats]
    # each method statistic's value by its name (``ProbeStatistic.finish``; the method reads its own)
    statistics: dict[str, Any]
    fingerprint: str = ""
    warnings: list[str] = field(default_factory=list)
    # False for a probe computed without the methods' statistics (the merge's pass 1 needs only the counts):
    # their values are then empty, and the Analyze step (pipeline.probe) computes a complete probe instead.
    counted: bool = True
    # the inspection views' statistics (docs/engine.md, Inspection statistics); None in a probe computed without them
    # (the merge's pass 1) and in a cached report written before they existed
    inspect: InspectStats | None = None
    # the statistics themselves, in order: how ``to_json`` saves their values
    kinds: tuple[ProbeStatistic, ...] = ()

    @property
    def complete(self) -> bool:
        """Everything the Analyze step shows: the methods' statistics and the inspection statistics."""
        return self.counted and self.inspect is not None

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.agents]

    def layers(self) -> list[dict]:
        """Density per transformer layer (``...layers.N``) and per other top-level tensor."""
        return _grouped(self, lambda name: m.group(1) if (m := LAYER.match(name)) else _strip(name))

    def modules(self) -> list[dict]:
        """Density per module kind across layers (``self_attn.q_proj``, ``mlp.down_proj`` ...)."""
        return _grouped(self, lambda name: m.group(3) if (m := LAYER.match(name)) else _strip(name))

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "eps": self.eps,
            "params": self.params,
            "tensors": self.tensors,
            "agents": [
                {
                    "name": a.name,
                    "source": a.source,
                    "updated": a.updated,
                    "density": a.density,
                    "unique": a.unique,
                    "shared": a.shared,
                    "rho": None if math.isinf(a.rho) else a.rho,
                    "overlap": a.overlap,
                }
                for a in self.agents
            ],
            "fingerprint": self.fingerprint,
            "warnings": self.warnings,
            "layers": self.layers(),
            "modules": self.modules(),
            # by hand: dataclasses.asdict's generic deep copy cost ~0.1 s per report at 300M (a compare writes one
            # per variant)
            "tensor_stats": [
                {"name": t.name, "params": t.params, "updated": list(t.updated), "unique": list(t.unique)}
                for t in self.tensor_stats
            ],
            **{
                key: value
                for kind in self.kinds
                for key, value in kind.save(self.statistics[kind.name], self.counted).items()
            },
            **(self.inspect.to_json(self.names) if self.inspect is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict, kinds: Sequence[ProbeStatistic] = ()) -> ProbeReport:
        """A report from its JSON (``to_json``), with the values of the statistics ``kinds`` it holds (a JSON
        without one of them raises KeyError or ValueError; any other statistic it holds is left out)."""
        if data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} report")
        agents = [
            AgentStats(a["name"], a["source"], a["updated"], a["unique"], a["shared"], a["overlap"], a["density"])
            for a in data["agents"]
        ]
        statistics, counted = {}, True
        for kind in kinds:
            statistics[kind.name], kind_counted = kind.load(data)
            counted = counted and kind_counted
        return cls(
            data["eps"],
            data["params"],
            data["tensors"],
            agents,
            [TensorStats(**t) for t in data["tensor_stats"]],
            statistics,
            data.get("fingerprint", ""),
            data.get("warnings", []),
            counted,
            InspectStats.from_json(data, [a.name for a in agents], [a.updated for a in agents]),
            tuple(kinds),
        )

    def renamed(self, names: list[str], sources: list[str]) -> ProbeReport:
        """The same statistics under other agent names (a cached probe reused with new names)."""
        agents = [
            AgentStats(n, s, a.updated, a.unique, a.shared, a.overlap, a.density)
            for a, n, s in zip(self.agents, names, sources)
        ]
        return ProbeReport(
            self.eps,
            self.params,
            self.tensors,
            agents,
            self.tensor_stats,
            self.statistics,
            self.fingerprint,
            self.warnings,
            self.counted,
            self.inspect,
            self.kinds,
        )


def _strip(name: str) -> str:
    return re.sub(r"\.(weight|bias)$", "", name)


def _grouped(report: ProbeReport, key) -> list[dict]:
    groups: dict[str, dict] = {}
    n = len(report.agents)
    for t in report.tensor_stats:
        g = groups.setdefault(key(t.name), {"params": 0, "updated": [0] * n, "unique": [0] * n})
        g["params"] += t.params
        for i in range(n):
            g["updated"][i] += t.updated[i]
            g["unique"][i] += t.unique[i]
    return [
        {
            "name": name,
            "params": g["params"],
            "updated": g["updated"],
            "unique": g["unique"],
            "density": [u / g["params"] if g["params"] else 0.0 for u in g["updated"]],
        }
        for name, g in groups.items()
    ]


class ProbeAccumulator:
    """Sums per-chunk statistics into a ``ProbeReport``; counts do not depend on chunk boundaries.

    ``statistics``: the methods' statistics of unique elements the report holds (``contracts.ProbeStatistic``;
    the pipeline hands in every registered method's). ``complete``: the Analyze step's probe, which counts them
    and the inspection statistics; otherwise (the merge's pass 1, which needs only the counts) they are not
    counted and the report holds their empty values."""

    def __init__(
        self, plan: MergePlan, eps: float, statistics: Sequence[ProbeStatistic] = (), complete: bool = True
    ) -> None:
        self.plan = plan
        self.eps = eps
        self.n = plan.n_agents
        self.complete = complete
        self.statistics = tuple(statistics)
        self._overlap: dict[int, np.ndarray] = {}  # job -> [N, N+1] int64 (column 0 unused)
        # each statistic's counts summed over the chunks, [N, *shape] int64 (counted in the complete probe only)
        self._counts = [torch.zeros(self.n, *s.shape, dtype=torch.int64) for s in self.statistics] if complete else []
        self._nonfinite: set[tuple[int, int]] = set()
        self._lock = threading.Lock()  # add() may run in several compute threads
        # the inspection views' statistics come with the complete (Analyze) probe only
        self.inspect = (
            InspectAccumulator(
                self.n, [j.base.dtype for j in plan.jobs], [math.prod(j.shape[1:]) if j.shape else 1 for j in plan.jobs]
            )
            if complete
            else None
        )

    def add(self, chunk: Chunk) -> None:
        n = self.n
        if n > PATTERN_MAX_AGENTS:
            self._add_keys(chunk)
            return
        # One bincount of the update pattern p_i = Σ_t m_t,i·2^t gives every count at once:
        # agent t's overlap[k] sums the patterns that contain t and have k+1 bits set.
        pattern = chunk.pattern
        if self.inspect is not None:  # the same histogram, counted together with the signs
            hist = self.inspect.pattern_histogram(chunk)
        else:
            hist = torch.bincount(pattern, minlength=1 << n).cpu()
        self.add_pattern_counts(chunk.job_index, hist)
        if self._counts and int(hist[one_agent_patterns(n)].sum()) > 0:
            # Every agent's unique elements at once: one nonzero, then gathers of x, the one active τ
            # and its agent, handed to each statistic.
            base = chunk.base
            (agent_of,) = _pattern_luts(n, str(pattern.device))
            owner = torch.index_select(
                agent_of, 0, pattern, out=chunk.scratch("owner", tuple(pattern.shape), torch.int32)
            )
            idx = flatnonzero(owner >= 0)
            agent = owner.index_select(0, idx).long()
            x = base.index_select(0, idx)
            tau = chunk.taus.reshape(-1).index_select(0, agent * base.numel() + idx)
            for k, statistic in enumerate(self.statistics):
                self._add_counts(k, statistic.count(x, tau, agent, n))

    @property
    def fused_statistic(self) -> ProbeStatistic | None:
        """The one statistic ``kernels.analyze`` counts with the rest (None: none to count)."""
        return self.statistics[0] if self.statistics else None

    @property
    def fusable(self) -> bool:
        """Whether the complete probe's chunks can be counted by ``kernels.analyze`` (``add_analysis``): at most one
        statistic, which has a numba piece."""
        return (
            self.complete
            and self.inspect is not None
            and self.n <= JOINT_MAX_AGENTS
            and len(self.statistics) <= 1
            and all(s.fused is not None for s in self.statistics)
        )

    def add_analysis(self, job_index: int, analysis: SliceStatistics) -> None:
        """Add one chunk counted by ``kernels.analyze``: the same counts ``add`` gets from a chunk."""
        n = self.n
        joint = torch.from_numpy(analysis.joint)
        self.add_pattern_counts(job_index, joint.view(1 << n, 1 << n).sum(0))
        assert self.inspect is not None  # fusable: the complete probe
        self.inspect.add_counted(joint, torch.from_numpy(analysis.ulps))
        if analysis.counts is not None:
            self._add_counts(0, torch.from_numpy(analysis.counts))

    def add_pattern_counts(self, job_index: int, hist: torch.Tensor | np.ndarray) -> None:
        """Add one chunk's counts from its update-pattern histogram (2^N bins; also what the fused
        kernels return): agent t's overlap[k] sums the patterns that contain t and have k+1 bits set."""
        n = self.n
        hist = _int64(hist)
        table = hist @ _pattern_table(n) if hist.size else np.zeros(n * (n + 1), np.int64)
        self._add_overlap(job_index, table.reshape(n, n + 1))

    def _add_overlap(self, job_index: int, table: np.ndarray) -> None:
        with self._lock:
            if job_index in self._overlap:
                self._overlap[job_index] += table
            else:
                self._overlap[job_index] = table

    def _add_counts(self, k: int, counts: torch.Tensor) -> None:
        """Add one chunk's counts of statistic k (counted in the complete probe only)."""
        with self._lock:
            self._counts[k] += counts

    def _add_keys(self, chunk: Chunk) -> None:
        """Many agents: per-agent keys t·(N+1) + c_i instead of a 2^N pattern table."""
        n = self.n
        masks, counts = chunk.masks, chunk.counts
        keys = masks * counts + torch.arange(n, device=counts.device, dtype=torch.int32)[:, None] * (n + 1)
        hist = torch.bincount(keys.reshape(-1), minlength=n * (n + 1)).reshape(n, n + 1)
        self._add_overlap(chunk.job_index, _int64(hist))
        if self.inspect is not None:
            self.inspect.add(chunk)
        if self._counts:
            unique = counts == 1
            for t in range(n):
                sel = masks[t] & unique
                if not bool(sel.any()):
                    continue
                x, tau = chunk.base[sel], chunk.taus[t][sel]
                for k, statistic in enumerate(self.statistics):
                    self._add_counts(k, statistic.count(x, tau, t, n))

    def report(self) -> ProbeReport:
        n, plan = self.n, self.plan
        overlap_total = np.zeros((n, n + 1), np.int64)
        tensor_stats = []
        for index, job in enumerate(plan.jobs):
            if not job.mergeable:
                continue
            h = self._overlap.get(index, np.zeros((n, n + 1), np.int64))
            overlap_total += h
            tensor_stats.append(TensorStats(job.name, job.numel, h[:, 1:].sum(1).tolist(), h[:, 1].tolist()))
        params = plan.params
        agents = []
        for t in range(n):
            ov = overlap_total[t, 1:].tolist()
            updated = sum(ov)
            agents.append(
                AgentStats(
                    plan.names[t],
                    plan.agents[t].display,
                    updated,
                    ov[0],
                    updated - ov[0],
                    ov,
                    updated / params if params else 0.0,
                )
            )
        warnings = list(plan.warnings)
        for a in agents:
            if a.updated == 0:
                warnings.append(f"agent {a.name!r} is identical to the base (no element differs by more than ε)")
        statistics = {
            s.name: s.finish(self._counts[k] if self.complete else None) for k, s in enumerate(self.statistics)
        }
        inspect = self.inspect.finish([a.updated for a in agents]) if self.inspect is not None else None
        return ProbeReport(
            self.eps,
            params,
            len(tensor_stats),
            agents,
            tensor_stats,
            statistics,
            plan.fingerprint(),
            warnings,
            self.complete,
            inspect,
            self.statistics,
        )


def _int64(counts: torch.Tensor | np.ndarray) -> np.ndarray:
    """Counts (a tensor on any device, or numpy) as a host int64 array."""
    if isinstance(counts, np.ndarray):
        return counts.astype(np.int64, copy=False)
    return counts.cpu().numpy().astype(np.int64, copy=False)


@functools.cache
def _pattern_table(n: int) -> np.ndarray:
    """[2^n, n·(n+1)] 0/1 matrix: pattern p contributes to (agent t, popcount(p)) for every bit t of p."""
    table = np.zeros((1 << n, n * (n + 1)), np.int64)
    for p in range(1, 1 << n):
        c = p.bit_count()
        for t in range(n):
            if p >> t & 1:
                table[p, t * (n + 1) + c] = 1
    return table


def flatnonzero(mask: torch.Tensor) -> torch.Tensor:
    """Indices of the true elements; numpy's scan is several times faster than torch's on CPU."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    return torch.nonzero(mask).squeeze(1)


@functools.cache
def one_agent_patterns(n: int) -> torch.Tensor:
    """The update patterns 2^t of the elements only agent t updates."""
    return torch.tensor([1 << t for t in range(n)], dtype=torch.int64)


@functools.cache
def _pattern_luts(n: int, device: str) -> tuple[torch.Tensor]:
    """agent_of[p] = t for the one-agent pattern 2^t, −1 for every other pattern."""
    agent_of = torch.full((1 << n,), -1, dtype=torch.int32)
    for t in range(n):
        agent_of[1 << t] = t
    return (agent_of.to(device),)


def cache_dir() -> Path:
    """Where probe reports are cached (``paths.cache_dir("probe")``)."""
    return paths.cache_dir("probe")


CACHE_FORMAT = "ram-probe-cache/1"


def _checksum(report: dict) -> str:
    """SHA-256 of a report's canonical JSON (keys sorted, no spaces): what a cache file vouches for."""
    return hashlib.sha256(json.dumps(report, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def load_cached(fingerprint: str, eps: float, kinds: Sequence[ProbeStatistic] = ()) -> ProbeReport | None:
    """A probe of the same inputs and ε saved earlier, with the values of the statistics ``kinds``, or None. A cache file is used only when it is a regular
    file holding ``{"format": "ram-probe-cache/1", "fingerprint", "eps", "sha256", "report"}`` whose
    fingerprint and ε are the ones asked for and whose checksum matches the report; anything else (not a
    regular file, unreadable, invalid JSON, an earlier format, altered numbers) is a cache miss, logged in one
    line: the probe is computed again, so a cache can never change a result."""
    path = cache_dir() / f"{fingerprint}-{eps!r}.json"
    if not os.path.lexists(path):
        return None
    why = "not a probe cache file"
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise InputError(f"{path}: not a regular file")
        data = read_json(path)
        if isinstance(data, dict) and data.get("format") == CACHE_FORMAT and isinstance(data.get("report"), dict):
            if data.get("fingerprint") != fingerprint or data.get("eps") != eps:
                why = "it describes other inputs or another ε"
            elif data.get("sha256") != _checksum(data["report"]):
                why = "its checksum does not match its content"
            else:
                report = ProbeReport.from_json(data["report"], kinds)
                if report.fingerprint == fingerprint and report.eps == eps:
                    return report
                why = "it describes other inputs or another ε"
    except (InputError, OSError) as e:
        why = str(e)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        why = f"not a probe report ({e})"
    _log.warning("ignoring the cached probe %s (%s); computing it again", path, why)
    return None


def save_cached(report: ProbeReport) -> None:
    """Cache a probe, with its inputs' fingerprint, ε and the checksum of its content; one without the methods'
    statistics never replaces one with them."""
    path = cache_dir() / f"{report.fingerprint}-{report.eps!r}.json"
    if not report.counted:
        existing = load_cached(report.fingerprint, report.eps, report.kinds)
        if existing is not None and existing.counted:
            return
    content = report.to_json()
    sealed = {
        "format": CACHE_FORMAT,
        "fingerprint": report.fingerprint,
        "eps": report.eps,
        "sha256": _checksum(content),
        "report": content,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(sealed))
        tmp.replace(path)
    except OSError:
        pass  # the cache is an optimisation; a read-only home must not fail a merge
