"""Statistics for visual inspection (docs/engine.md, Inspection statistics), gathered in the Analyze probe pass.

Per chunk, from the masks m_t = [|τ_t| > ε] the probe already has:

* **intersections**: the update-pattern histogram (pattern p = Σ_t m_t·2^t) summed over the model;
  every non-empty pattern with a non-zero count is one set of agents and how many elements exactly
  that set updates.
* **pairs**: for agents a, b, ``both`` = Σ_i m_a·m_b and ``same_sign`` = how many of those have
  τ_a and τ_b of the same sign. With s_t = sign(τ_t)·m_t ∈ {−1, 0, 1}, m·mᵀ gives ``both`` and
  s·sᵀ gives same − opposite, so same = (both + s·sᵀ) / 2: two small matrix products per chunk,
  exact (0/±1 products summed in float32 stay integers below 2^24 for chunks under 2^24 elements).
* **ulp histogram**: on every ULP_STRIDE-th row of each tensor (row index ≡ 0 mod 8 along dim 0; every
  8th element of a 1-D tensor), so the sample does not depend on chunking and costs 1/8 of counting
  every element: each updated element's |τ| in ulps of the base value in the stored dtype,
  binned by powers of two: bin b ≥ 1 holds 2^(b−1) ≤ |τ| / ulp(θ_pre) < 2^b (bin 1 is one ulp,
  bin 2 two or three ...). From the float exponents: b = E(|τ|) − E(θ_pre) + p, with E the biased
  exponent of the compute dtype and p the stored significand bits (8 bf16, 11 f16, 24 f32, 53 f64).
  For a change within one binade this is the bit length of |bits(agent) − bits(base)|; a step down
  across a power of two (half an ulp of the base) counts as one ulp, as its bit distance is 1.
  Bases below the smallest normal of the stored dtype use that dtype's subnormal spacing; bases
  below 2^(p−127) (bf16: ~1.5e−36, mostly exact zeros) use 2^(p−127)'s ulp, which moves only
  updates smaller than 2^−64 out of the top bin. Computed as r = |τ|·2^k (k per element, an exact
  power-of-two scale), bin = the float exponent of r; an update with r below the smallest normal
  float (possible only when an agent is stored finer than its base) is counted in bin 0.
"""

from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass

from ..lazy import torch
from .chunks import Chunk
from .kernels import UlpSample

ULP_STRIDE = 8  # the ulp histogram counts every 8th row of each tensor (every 8th element of a 1-D one)
ULP_BINS = 65  # bin 0: under 2^−126 ulps (exotic); bins 1..63: powers of two; bin 64: ≥ 2^63 ulps
STORED_SIGNIFICAND = {"BF16": 8, "F16": 11, "F32": 24, "F64": 53}
STORED_MIN_EXPONENT = {"F16": 113}  # f16's smallest normal is 2^−14 = float32 biased exponent 113
EXACT_FLOAT32_SUM = 1 << 24
JOINT_MAX_AGENTS = 8  # up to this many agents, signs and patterns share one 4^N-bin histogram


@dataclass
class InspectStats:
    """Whole-model statistics for the inspection views; agent indices refer to the report's agents."""

    patterns: list[int] | None  # count per update pattern 0 .. 2^N − 1 (None above 16 agents)
    both: list[list[int]]  # [a][b]: elements both update (diagonal: updated)
    same_sign: list[list[int]]  # [a][b]: of those, how many with τ of the same sign
    ulps: list[list[int]]  # [t][b]: sampled updated elements per ulp bin (see the module docstring)

    def intersections(self, names: list[str]) -> list[dict] | None:
        """Every non-empty set of agents with a non-zero count of elements that exactly it updates."""
        if self.patterns is None:
            return None
        out = []
        for p, count in enumerate(self.patterns):
            if p and count:
                out.append({"agents": [names[t] for t in range(len(names)) if p >> t & 1], "count": int(count)})
        return out

    def pairs(self, names: list[str]) -> list[dict]:
        n = len(names)
        return [{"agents": [names[a], names[b]], "both": self.both[a][b], "same_sign": self.same_sign[a][b]}
                for a in range(n) for b in range(a + 1, n)]

    def to_json(self, names: list[str]) -> dict:
        return {
            "intersections": self.intersections(names),
            "pairs": self.pairs(names),
            "ulp_histogram": {"stride": ULP_STRIDE, "bins": ulp_bin_labels(), "counts": self.ulps},
        }

    @classmethod
    def from_json(cls, data: dict, names: list[str], updated_counts: list[int]) -> InspectStats | None:
        """The statistics back from a report; None when the report predates them."""
        if "pairs" not in data or "ulp_histogram" not in data:
            return None
        n = len(names)
        index = {name: t for t, name in enumerate(names)}
        patterns = None
        if data.get("intersections") is not None:
            patterns = [0] * (1 << n)
            for entry in data["intersections"]:
                patterns[sum(1 << index[a] for a in entry["agents"])] = int(entry["count"])
        both = [[0] * n for _ in range(n)]
        same = [[0] * n for _ in range(n)]
        for entry in data["pairs"]:
            a, b = (index[x] for x in entry["agents"])
            both[a][b] = both[b][a] = int(entry["both"])
            same[a][b] = same[b][a] = int(entry["same_sign"])
        ulps = [list(map(int, row)) for row in data["ulp_histogram"]["counts"]]
        for t, updated in enumerate(updated_counts):  # the diagonal: every updated element, same sign as itself
            both[t][t] = same[t][t] = updated
        return cls(patterns, both, same, ulps)


def ulp_bin_labels() -> list[str]:
    labels = ["<1"]
    for b in range(1, ULP_BINS - 1):
        lo, hi = 1 << (b - 1), (1 << b) - 1
        labels.append(str(lo) if lo == hi else f"{lo}-{hi}")
    labels.append(f">={1 << (ULP_BINS - 2)}")
    return labels


class InspectAccumulator:
    """Sums the per-chunk inspection statistics (thread-safe: chunks may arrive from several threads)."""

    def __init__(self, n_agents: int, stored_dtypes: list[str], row_sizes: list[int]) -> None:
        self.n = n_agents
        self.stored = stored_dtypes  # per job: the base tensor's safetensors dtype code
        self.row_sizes = row_sizes  # per job: elements per row along dim 0 (1 for 1-D tensors)
        self._patterns = torch.zeros(1 << n_agents, dtype=torch.int64) if n_agents <= 16 else None
        self._joint = torch.zeros(1 << (2 * n_agents), dtype=torch.int64) if n_agents <= JOINT_MAX_AGENTS else None
        self._both = torch.zeros(n_agents, n_agents, dtype=torch.int64)
        self._signed = torch.zeros(n_agents, n_agents, dtype=torch.int64)
        self._ulps = torch.zeros(n_agents, ULP_BINS, dtype=torch.int64)
        self._lock = threading.Lock()

    def pattern_histogram(self, chunk: Chunk) -> torch.Tensor:
        """The probe's per-chunk update-pattern histogram (2^N bins, CPU), counted together with the
        signs: one bincount of key = p + 2^N·q, with q = Σ_t [τ_t > ε]·2^t the agents whose update is
        positive (up to ``JOINT_MAX_AGENTS``; above, the pattern alone and the signs by products)."""
        n = self.n
        pattern = chunk.pattern
        if n > JOINT_MAX_AGENTS:
            hist = torch.bincount(pattern, minlength=1 << n).cpu()
            self.add(chunk, hist)
            return hist
        taus = chunk.taus
        size = taus.shape[1]
        positive = torch.gt(taus, chunk.eps, out=chunk.scratch("inspect_positive", tuple(taus.shape), taus.dtype))
        # key = p + Σ_t [τ_t > ε]·2^(N+t): the sign part as one matrix-vector product (exact small integers)
        _, high = _key_weights(n, str(taus.device), taus.dtype)
        acc = torch.mv(positive.t(), high, out=chunk.scratch("inspect_acc", (size,), taus.dtype))
        keys = chunk.scratch("inspect_keys", (size,), torch.int32)
        keys.copy_(acc)
        keys.add_(pattern)
        joint = torch.bincount(keys, minlength=1 << (2 * n)).cpu()
        self.add(chunk, joint)
        return joint.view(1 << n, 1 << n).sum(0)

    def add(self, chunk: Chunk, hist: torch.Tensor | None = None) -> None:
        """Add a chunk: ``hist`` is its joint (sign, pattern) histogram (N ≤ ``JOINT_MAX_AGENTS``), its
        pattern histogram (N ≤ 16), or None (more agents)."""
        n, size = self.n, chunk.taus.shape[1]
        if size == 0:
            return
        signed = both = None
        if n > JOINT_MAX_AGENTS:
            taus, m = chunk.taus, chunk.mask_values
            sign = torch.mul(taus, m, out=chunk.scratch("inspect_sign", tuple(taus.shape), taus.dtype)).sign_()
            exact = size < EXACT_FLOAT32_SUM or taus.dtype == torch.float64
            s_ = sign if exact else sign.to(torch.float64)
            signed = torch.mm(s_, s_.t()).round().to(torch.int64).cpu()
            if hist is None:
                m_ = m if exact else m.to(torch.float64)
                both = torch.mm(m_, m_.t()).round().to(torch.int64).cpu()
        ulps = self._ulp_histogram(chunk)
        with self._lock:
            if hist is not None:
                if n <= JOINT_MAX_AGENTS:
                    assert self._joint is not None  # kept up to JOINT_MAX_AGENTS agents
                    self._joint += hist
                else:
                    assert self._patterns is not None  # a pattern histogram comes with at most 16 agents
                    self._patterns += hist
            if both is not None:
                self._both += both
            if signed is not None:
                self._signed += signed
            if ulps is not None:
                self._ulps += ulps

    def ulp_sample(self, job_index: int, offset: int, size: int, compute_dtype: torch.dtype) -> UlpSample | None:
        """The rows of a chunk (flat elements ``offset`` .. ``offset + size``) the ulp histogram samples (the
        tensor's rows whose index is a multiple of ULP_STRIDE; every 8th element of a 1-D tensor) and the
        stored dtype's ulp parameters; None when the chunk has no sampled row."""
        row = self.row_sizes[job_index]
        if row == 0 or size % row:
            return None
        first = -(offset // row) % ULP_STRIDE
        if first >= size // row:
            return None
        stored = self.stored[job_index]
        bits = STORED_SIGNIFICAND.get(stored, 53 if compute_dtype == torch.float64 else 24)
        return UlpSample(row, first, ULP_STRIDE, bits, STORED_MIN_EXPONENT.get(stored, 1))

    @staticmethod
    def _inverse_ulp(base: torch.Tensor, sample: UlpSample) -> torch.Tensor:
        """1 / ulp(θ_pre) in the stored dtype, per element, as a power of two in the compute dtype:
        ulp = 2^(E − bias − p + 1) with E = max(E(θ_pre), smallest normal, p)."""
        if base.dtype == torch.float64:
            int_dtype, shift, mask, bias = torch.int64, 52, 0x7FF, 1023
        else:
            int_dtype, shift, mask, bias = torch.int32, 23, 0xFF, 127
        bits = sample.significand
        e = torch.bitwise_right_shift(base.contiguous().view(int_dtype), shift)
        e.bitwise_and_(mask).clamp_(min=max(sample.min_exponent, bits))
        # biased exponent of 2^−(E − bias − p + 1) is 2·bias − 1 + p − E, always inside the normal range
        torch.sub(2 * bias - 1 + bits, e, out=e).bitwise_left_shift_(shift)
        return e.view(base.dtype)

    def _ulp_histogram(self, chunk: Chunk) -> torch.Tensor | None:
        """Per agent: counts per ulp bin of the sampled elements (``ulp_sample``): |τ·m| scaled by
        1/ulp(θ_pre), binned by its float exponent E: bin = clamp(E − bias + 1, 1, ULP_BINS − 1) for E > 0;
        bin 0 is what is left of the sampled updated elements (E = 0: r below the smallest normal float;
        the elements not updated land there too and are not counted)."""
        size = chunk.taus.shape[1]
        sample = self.ulp_sample(chunk.job_index, chunk.offset, size, chunk.taus.dtype)
        if sample is None:
            return None
        row, first, rows = sample.row, sample.first, size // sample.row
        # whole rows: each sampled row is contiguous, so the operations stay vectorised
        taus = chunk.taus.view(self.n, rows, row)[:, first::ULP_STRIDE]
        m = chunk.mask_values.view(self.n, rows, row)[:, first::ULP_STRIDE]
        base = chunk.base.view(rows, row)[first::ULP_STRIDE]
        inv_ulp = self._inverse_ulp(base, sample)
        ratio = torch.mul(taus, m).abs_().mul_(inv_ulp).reshape(self.n, -1)
        if ratio.dtype == torch.float64:
            int_dtype, shift, bias, levels = torch.int64, 52, 1023, 2048
        else:
            int_dtype, shift, bias, levels = torch.int32, 23, 127, 256
        keys = ratio.view(int_dtype).bitwise_right_shift_(shift)  # ratio ≥ 0: the biased exponent
        out = torch.zeros(self.n, ULP_BINS, dtype=torch.int64)
        lut = _exponent_bins(levels, bias)
        updated = m.reshape(self.n, -1).sum(1).round().to(torch.int64).cpu()
        for t in range(self.n):
            out[t].index_add_(0, lut, torch.bincount(keys[t], minlength=levels).cpu())
            out[t, 0] = updated[t] - out[t, 1:].sum()  # bin 0 received the elements not updated as well
        return out

    def add_counted(self, joint: torch.Tensor, ulps: torch.Tensor) -> None:
        """Add a chunk counted elsewhere (the fused kernel): its joint (sign, pattern) histogram and its
        ulp-sample counts."""
        assert self._joint is not None  # the fused kernel counts up to ANALYZE_MAX_AGENTS ≤ JOINT_MAX_AGENTS agents
        with self._lock:
            self._joint += joint
            self._ulps += ulps

    def finish(self, updated: list[int]) -> InspectStats:
        """``updated``: each agent's updated count (the diagonal of ``both`` without a pattern histogram)."""
        if self._joint is not None:  # key = p + 2^N·q: pattern p, positive agents q ⊆ p
            n = self.n
            joint = self._joint.view(1 << n, 1 << n)  # [q, p]
            self._patterns = joint.sum(0)
            p = torch.arange(1 << n)
            q = p[:, None]
            for a in range(n):
                for b in range(a, n):
                    member = ((p >> a) & (p >> b) & 1).bool()[None, :].expand(1 << n, -1)
                    agree = (((q >> a) ^ (q >> b)) & 1) == 0
                    self._both[a, b] = self._both[b, a] = int(joint[member].sum())
                    agreeing = int(joint[member & agree].sum())
                    self._signed[a, b] = self._signed[b, a] = 2 * agreeing - int(self._both[a, b])
        elif self._patterns is not None:
            p = torch.arange(1 << self.n)
            for a in range(self.n):
                for b in range(a, self.n):
                    member = ((p >> a) & (p >> b) & 1).bool()
                    self._both[a, b] = self._both[b, a] = int(self._patterns[member].sum())
        both = self._both.tolist()
        signed = self._signed.tolist()
        same = [[(both[a][b] + signed[a][b]) // 2 for b in range(self.n)] for a in range(self.n)]
        ulps = self._ulps.tolist()
        patterns = self._patterns.tolist() if self._patterns is not None else None
        return InspectStats(patterns, both, same, ulps)


@functools.cache
def _key_weights(n: int, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    low = torch.tensor([float(1 << t) for t in range(n)], dtype=dtype, device=device)
    return low, low * float(1 << n)


@functools.cache
def _exponent_bins(levels: int, bias: int) -> torch.Tensor:
    """Biased exponent of |τ|/ulp -> ulp bin: 0 for 0 (not updated), else clamp(E − bias + 1, 1, ULP_BINS − 1)."""
    e = torch.arange(levels, dtype=torch.int64)
    return torch.where(e == 0, 0, (e - bias + 1).clamp(1, ULP_BINS - 1))


# --- layer × module grid ---------------------------------------------------------------------------

LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)\.")
MODULE_KINDS = [  # (column, pattern on the tensor name), first match wins
    ("embeddings", re.compile(r"embed|wte|wpe|word_embeddings|tok_embeddings")),
    ("q", re.compile(r"(^|\.)(q_proj|query|q|wq)(\.|$)")),
    ("k", re.compile(r"(^|\.)(k_proj|key|k|wk)(\.|$)")),
    ("v", re.compile(r"(^|\.)(v_proj|value|v|wv)(\.|$)")),
    ("qkv", re.compile(r"(^|\.)(qkv_proj|query_key_value|c_attn|Wqkv|W_pack)(\.|$)")),
    ("o", re.compile(r"(^|\.)(o_proj|out_proj|dense|c_proj|wo)(\.|$)(?!.*mlp)")),
    ("gate", re.compile(r"(^|\.)(gate_proj|w1|gate_up_proj)(\.|$)")),
    ("up", re.compile(r"(^|\.)(up_proj|w3|fc1|c_fc|dense_h_to_4h)(\.|$)")),
    ("down", re.compile(r"(^|\.)(down_proj|w2|fc2|dense_4h_to_h)(\.|$)")),
    ("norms", re.compile(r"norm|ln_")),
    ("lm_head", re.compile(r"lm_head|embed_out|(^|\.)output\.weight$")),
]
COLUMN_ORDER = [kind for kind, _ in MODULE_KINDS]
OTHER_ROW = "other"


def module_kind(name: str) -> str:
    """The heat map column of a tensor: q, k, v, o, gate, up, down, norms, embeddings ... or its own short name."""
    if "mlp" in name and re.search(r"(^|\.)(c_proj|dense)(\.|$)", name):
        return "down"
    for kind, pattern in MODULE_KINDS:
        if pattern.search(name):
            return kind
    parts = [p for p in name.split(".") if p not in ("weight", "bias")]
    return parts[-1] if parts else name


def layer_of(name: str) -> int | None:
    m = LAYER_INDEX.search(name)
    return int(m.group(1)) if m else None


@dataclass
class ModuleGrid:
    """Counts per (row, column): rows are layers 0..L−1 (then ``other`` for tensors outside layers),
    columns the module kinds present. ``params[r][c]``, ``updated[t][r][c]``, ``unique[t][r][c]``;
    ``tensors[r][c]`` lists the tensor names in a cell."""

    rows: list[str]
    columns: list[str]
    params: list[list[int]]
    updated: list[list[list[int]]]
    unique: list[list[list[int]]]
    tensors: list[list[list[str]]]

    def density(self, agent: int) -> list[list[float | None]]:
        return [[u / p if p else None for u, p in zip(urow, prow)]
                for urow, prow in zip(self.updated[agent], self.params)]

    def unique_share(self, agent: int) -> list[list[float | None]]:
        """unique / updated per cell: how much of the agent's update there no other agent touches."""
        return [[q / u if u else None for q, u in zip(qrow, urow)]
                for qrow, urow in zip(self.unique[agent], self.updated[agent])]


def module_grid(tensor_stats: list, n_agents: int) -> ModuleGrid:
    """The layer × module grid of a probe's per-tensor statistics (``TensorStats``)."""
    layers = sorted({i for t in tensor_stats if (i := layer_of(t.name)) is not None})
    has_other = any(layer_of(t.name) is None for t in tensor_stats)
    rows = [str(i) for i in layers] + ([OTHER_ROW] if has_other else [])
    row_of = {i: r for r, i in enumerate(layers)}
    kinds: list[str] = []
    for t in tensor_stats:
        k = module_kind(t.name)
        if k not in kinds:
            kinds.append(k)
    columns = [k for k in COLUMN_ORDER if k in kinds] + [k for k in kinds if k not in COLUMN_ORDER]
    col_of = {k: c for c, k in enumerate(columns)}
    R, C = len(rows), len(columns)
    params = [[0] * C for _ in range(R)]
    updated = [[[0] * C for _ in range(R)] for _ in range(n_agents)]
    unique = [[[0] * C for _ in range(R)] for _ in range(n_agents)]
    tensors: list[list[list[str]]] = [[[] for _ in range(C)] for _ in range(R)]
    for t in tensor_stats:
        layer = layer_of(t.name)
        r = row_of[layer] if layer is not None else R - 1
        c = col_of[module_kind(t.name)]
        params[r][c] += t.params
        tensors[r][c].append(t.name)
        for a in range(n_agents):
            updated[a][r][c] += t.updated[a]
            unique[a][r][c] += t.unique[a]
    return ModuleGrid(rows, columns, params, updated, unique, tensors)
