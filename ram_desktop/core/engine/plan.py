"""Align a base and its agents into tensor jobs, with every check that needs no tensor data."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field

from ..errors import InputError, NoAgents
from ..lazy import torch
from ..storage.formats import Checkpoint, lora
from ..storage.formats.base import ITEMSIZE_OF_NAME, SCALED_FLOAT_CODES, TensorInfo, torch_dtype

log = logging.getLogger("ram_desktop")

OUT_DTYPES: dict[str, str | None] = {  # --out-dtype -> the dtype's name (None: each tensor keeps the base's)
    "base": None,
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
}
MAX_LISTED = 5
VOCAB_MODES = ("exact", "common")
# output embedding -> the input embeddings it is tied to, by architecture family (first present wins)
TIED_OUTPUTS: dict[str, tuple[str, ...]] = {
    "lm_head.weight": (
        "model.embed_tokens.weight",
        "transformer.wte.weight",
        "model.decoder.embed_tokens.weight",
        "transformer.word_embeddings.weight",
        "model.tok_embeddings.weight",
        "embed_tokens.weight",
    ),
    "embed_out.weight": ("gpt_neox.embed_in.weight",),
    "output.weight": ("tok_embeddings.weight",),
}
VOCAB_TENSOR = re.compile(
    r"(^|\.)(embed_tokens|lm_head|wte|word_embeddings|embed_in|embed_out|tok_embeddings|output)"
    r"\.weight$"
)


@dataclass(frozen=True)
class TensorJob:
    """One output tensor: where its base and agent slices come from and what it becomes."""

    name: str
    shape: tuple[int, ...]
    base: TensorInfo
    agents: tuple[TensorInfo, ...]
    out_name: str  # the output dtype's name, e.g. "bfloat16"
    compute_name: str  # "float32", or "float64" when any input is float64
    mergeable: bool  # floating point: merged; otherwise copied from the base
    # with a layer map (``Layout``): the gradient position t of this output tensor and the slice whose
    # parameters apply; None: t follows the layer index in ``name`` (``methods.settings.layer_position``)
    position: float | None = None
    group: int = 0
    model: int = 0  # with a stacking layer map: the model every role reads (0: the base, k: agent k)

    @property
    def numel(self) -> int:
        return self.base.numel

    @property
    def out_dtype(self) -> torch.dtype:
        return torch_dtype(self.out_name)

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch_dtype(self.compute_name)

    @property
    def out_bytes(self) -> int:
        return self.numel * ITEMSIZE_OF_NAME[self.out_name]


@dataclass(frozen=True)
class SliceSource:
    """One input of a slice: ``model`` indexes ``[base, *agents]`` (0: the base); layers ``start:stop``."""

    model: int
    start: int
    stop: int


@dataclass(frozen=True)
class Slice:
    """Consecutive output layers read from the same layer range of each of its sources (docs/methods.md,
    "Slices and passthrough"). A merge's slice lists every model once; a stacking slice (passthrough) one."""

    sources: tuple[SliceSource, ...]

    @property
    def length(self) -> int:
        return self.sources[0].stop - self.sources[0].start


@dataclass(frozen=True)
class Layout:
    """A layer map: the output's decoder layers, slice after slice. ``stacking``: each slice has one source,
    and every role of a job (base and agents) reads that source's tensor."""

    slices: tuple[Slice, ...]
    stacking: bool = False

    @property
    def n_layers(self) -> int:
        return sum(s.length for s in self.slices)

    def layers(self) -> list[tuple[int, float, tuple[tuple[int, int], ...]]]:
        """Per output layer: its slice, its gradient position t (i / (n − 1) inside the slice, 1 for a one-layer
        slice: mergekit's ``plan_slice``) and per role (base, then each agent) the (model, input layer) read."""
        out = []
        for g, sl in enumerate(self.slices):
            n = sl.length
            for i in range(n):
                t = i / (n - 1) if n > 1 else 1.0
                out.append((g, t, self.roles(sl, i)))
        return out

    def roles(self, sl: Slice, offset: int) -> tuple[tuple[int, int], ...]:
        if self.stacking:
            src = sl.sources[0]
            return ((src.model, src.start + offset),)
        ordered = sorted(sl.sources, key=lambda s: s.model)
        return tuple((s.model, s.start + offset) for s in ordered)


def check_layout(layout: Layout, n_models: int, model_layers: list[int], where: str = "slices") -> None:
    """Every slice's sources name existing models and layer ranges inside them, of one length; a merge's slice
    names every model once, a stacking slice one model. ``InputError`` naming the slice otherwise."""
    if not layout.slices:
        raise InputError(f"{where}: no slices; give at least one")
    for g, sl in enumerate(layout.slices):
        at = f"{where}[{g}]"
        if not sl.sources:
            raise InputError(f"{at}.sources: no sources")
        for k, src in enumerate(sl.sources):
            if not 0 <= src.model < n_models:
                raise InputError(
                    f"{at}.sources[{k}].model: {src.model} names no model (0 is the base, 1..{n_models - 1} the agents)"
                )
            if not 0 <= src.start < src.stop <= model_layers[src.model]:
                raise InputError(
                    f"{at}.sources[{k}].layer_range: [{src.start}, {src.stop}] is not a non-empty range of the "
                    f"{model_layers[src.model]} layers of model {src.model}"
                )
        lengths = {s.stop - s.start for s in sl.sources}
        if len(lengths) > 1:
            raise InputError(
                f"{at}.sources: layer ranges of unequal length ({sorted(lengths)}); a slice reads the same number of layers from each source"
            )
        if layout.stacking and len(sl.sources) != 1:
            raise InputError(f"{at}.sources: a stacking slice (passthrough) has one source, found {len(sl.sources)}")
        if not layout.stacking and sorted(s.model for s in sl.sources) != list(range(n_models)):
            raise InputError(
                f"{at}.sources: a merge's slice names every model once (the base and each agent), found models "
                f"{sorted(s.model for s in sl.sources)}"
            )


@dataclass
class MergePlan:
    base: Checkpoint
    agents: list[Checkpoint]
    names: list[str]
    jobs: list[TensorJob]
    out_dtype: str
    warnings: list[str] = field(default_factory=list)
    layout: Layout | None = None
    # with a layout: per output layer, the input layer of its first role (for the config's per-layer lists)
    layer_sources: list[int] | None = None

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    @property
    def base_agents(self) -> list[str]:
        """The names of the agents whose files are the base's own."""
        base = sorted(map(str, self.base.files))
        return [name for ckpt, name in zip(self.agents, self.names) if sorted(map(str, ckpt.files)) == base]

    @property
    def mergeable_jobs(self) -> list[TensorJob]:
        return [j for j in self.jobs if j.mergeable]

    @property
    def params(self) -> int:
        """Elements compared between base and agents (the floating-point tensors)."""
        return sum(j.numel for j in self.jobs if j.mergeable)

    @property
    def out_bytes(self) -> int:
        return sum(j.out_bytes for j in self.jobs)

    @property
    def input_bytes(self) -> int:
        return sum(c.size_bytes for c in [self.base, *self.agents])

    def fingerprint(self) -> str:
        """Identifies the inputs (files, sizes, modification times, tensor set) for the probe cache."""
        h = hashlib.sha256()
        for ckpt in [self.base, *self.agents]:
            h.update(b"\0ckpt")
            for f in ckpt.files:
                st = f.stat()
                h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
            if ckpt.revision:
                h.update(ckpt.revision.encode())
        for job in self.mergeable_jobs:
            h.update(f"{job.name}{job.shape}".encode())
        return h.hexdigest()[:32]


@dataclass(frozen=True)
class AuxInput:
    """Per-agent auxiliary tensors read beside the agents (e.g. each agent's Fisher information):
    for every mergeable job, one tensor per agent with that agent's tensor name and shape."""

    key: str
    what: str  # how messages name these files, e.g. "Fisher"
    checkpoints: tuple[Checkpoint, ...]
    tensors: dict[int, tuple[TensorInfo, ...]]  # job index -> one per agent


def check_aux(plan: MergePlan, key: str, checkpoints: list[Checkpoint], what: str) -> AuxInput:
    """Check per-agent auxiliary checkpoints against the plan (the engine hands the result to the pass that
    reads them, ``passes.merge_pass``, which streams them beside the agents).

    Agent t's file must hold a floating tensor for every tensor the plan merges, under the name and
    with the shape agent t stores it, and nothing the agent does not store; otherwise ``InputError``
    naming the file, the tensors and both shapes."""
    if len(checkpoints) != plan.n_agents:
        raise InputError(
            f"{len(checkpoints)} {what} files for {plan.n_agents} agents; give one per agent, "
            f"in agent order ({', '.join(plan.names)})"
        )
    tensors: dict[int, list[TensorInfo]] = {i: [] for i, j in enumerate(plan.jobs) if j.mergeable}
    for t, (agent, ckpt) in enumerate(zip(plan.agents, checkpoints)):
        where = f"{what} file {ckpt.display} of agent {plan.names[t]!r}"
        needed = {plan.jobs[i].agents[t].name for i in tensors}
        missing = sorted(needed - ckpt.tensors.keys())
        extra = sorted(ckpt.tensors.keys() - {n for n, i in agent.tensors.items() if i.is_float})
        if missing or extra:
            parts = _differences(missing, extra, "lacks {}", "has tensors the agent does not ({})")
            raise InputError(
                f"{where} {' and '.join(parts)}; it was not computed for this agent — "
                f"compute it again for {agent.display}"
            )
        for i, found in tensors.items():
            info = plan.jobs[i].agents[t]
            aux = ckpt.tensors[info.name]
            if aux.shape != info.shape:
                raise InputError(
                    f"{where}: tensor {info.name!r} has shape {list(aux.shape)} but "
                    f"{list(info.shape)} in the agent {agent.display}; compute it again for this agent"
                )
            if not aux.is_float:
                raise InputError(f"{where}: tensor {info.name!r} is {aux.dtype}, not a floating-point tensor")
            found.append(aux)
    return AuxInput(key, what, tuple(checkpoints), {i: tuple(v) for i, v in tensors.items()})


def default_names(agents: list[Checkpoint]) -> list[str]:
    """Agent names from their folder, file or repository names, made unique."""
    names: list[str] = []
    for ckpt in agents:
        stem = (
            ckpt.repo_id.split("/")[-1] if ckpt.repo_id else (ckpt.path.name if ckpt.path.is_dir() else ckpt.path.stem)
        )
        name, k = stem, 2
        while name in names:
            name, k = f"{stem}-{k}", k + 1
        names.append(name)
    return names


MAX_AGENTS = 256  # a chunk's task vectors take ~N × 2 MiB per float32 copy (several copies): 256 agents ~2 GB


def check_agent_count(count: int) -> None:
    """Refuse more agents than the engine holds in memory per chunk, before any file is opened."""
    if count > MAX_AGENTS:
        raise InputError(
            f"{count} agents: RAM Desktop merges at most {MAX_AGENTS} agents at once (each chunk holds "
            "every agent's task vector in memory); merge them in groups"
        )


def make_plan(
    base: Checkpoint,
    agents: list[Checkpoint],
    names: list[str] | None = None,
    out_dtype: str = "base",
    vocab: str = "exact",
    layout: Layout | None = None,
) -> MergePlan:
    """Check that base and agents line up and list the tensor jobs; raise one clear ``InputError`` if not.

    Tied embeddings: the output's tensors are the base's. An agent that omits the base's output
    embedding (``lm_head.weight``) because its config ties it to the input embedding is read from that
    input embedding; an agent's ``lm_head`` that a tied base does not store is left out (the merged
    model stays tied), with a warning when the agent's config says it was untied.

    ``vocab``: "exact" (default) makes a vocabulary-size difference (first dimension of an embedding or
    ``lm_head``) an error that names the rows; "common" merges the rows base and agent share and keeps
    the base's rows for the rest: rows an agent lacks count as unchanged for that agent, rows beyond the
    base's vocabulary are dropped. The output always has the base's shapes.

    ``layout``: a layer map (slices): the output's decoder layers are read from the layers it names, in
    every role (``_laid_out``); without one, each output tensor is the base's tensor of the same name.
    """
    if vocab not in VOCAB_MODES:
        raise InputError(f"unknown vocab mode {vocab!r}; choose exact or common")
    if not agents:
        raise NoAgents()
    if out_dtype not in OUT_DTYPES:
        raise InputError(f"unknown output dtype {out_dtype!r}; choose one of {', '.join(OUT_DTYPES)}")
    if names is None:
        names = default_names(agents)
    names = [n.strip() for n in names]
    if len(names) != len(agents):
        raise InputError(f"{len(names)} names given for {len(agents)} agents; give one name per agent")
    if len(set(names)) != len(names) or not all(names):
        raise InputError(f"agent names must be unique and non-empty: {', '.join(names)}")

    agents = lora.bind_all(base, agents)  # LoRA adapters become agents with τ = scale·B·A
    warnings: list[str] = []
    aligned = [_aligned_tensors(base, a, warnings) for a in agents]
    _refuse_scaled_floats([base, *agents], [base.tensors, *aligned])
    base_table: dict[str, TensorInfo] = base.tensors
    placed: dict[str, tuple[float, int, int]] = {}
    layer_sources = None
    if layout is None:
        _check_tensor_sets(base, agents, aligned)
    else:
        base_table, aligned, placed, layer_sources = _laid_out(base, agents, aligned, layout)
    jobs: list[TensorJob] = []
    mixed: set[str] = set()
    vocab_problems: list[str] = []
    # jobs in tensor-name order: how a checkpoint is split into files (and the order within them) never
    # changes a result, the output's layout, or which element is "earliest" (TIES's ties at the cut)
    for name in sorted(base_table):
        b = base_table[name]
        infos = tuple(m[name] for m in aligned)
        for ckpt, info in zip(agents, infos):
            if info.shape != b.shape and _vocab_rows_differ(name, b, info, base, ckpt):
                rows_b, rows_a = b.shape[0], info.shape[0]
                if rows_a > rows_b:
                    extra = f"rows {rows_b}..{rows_a - 1} exist only in the agent"
                    fate = (
                        f"rows {rows_b}..{rows_a - 1} of the agent are dropped (the output keeps the base's vocabulary)"
                    )
                else:
                    extra = f"rows {rows_a}..{rows_b - 1} exist only in the base"
                    fate = f"rows {rows_a}..{rows_b - 1} count as unchanged for this agent"
                text = (
                    f"tensor {name!r} has {rows_a} vocabulary rows in {ckpt.display} but {rows_b} in the base "
                    f"{base.display}"
                )
                if vocab == "common":
                    warnings.append(f"{text}: merging rows 0..{min(rows_a, rows_b) - 1}; {fate}")
                else:
                    vocab_problems.append(f"{text} ({extra})")
            elif info.shape != b.shape:
                raise _shape_error(name, b, info, base, ckpt)
            if info.is_float != b.is_float:
                raise _kind_error(name, b, info, ckpt)
            if info.dtype != b.dtype:
                mixed.add(ckpt.display)
        compute = "float64" if "F64" in (b.dtype, *(i.dtype for i in infos)) else "float32"
        chosen = OUT_DTYPES[out_dtype]
        out = chosen if (b.is_float and chosen is not None) else b.dtype_name
        position, group, model = placed.get(name, (None, 0, 0))
        jobs.append(TensorJob(name, b.shape, b, infos, out, compute, b.is_float, position, group, model))
    if vocab_problems:
        raise InputError(
            "vocabulary sizes differ: "
            + "; ".join(vocab_problems[:MAX_LISTED])
            + ("; ..." if len(vocab_problems) > MAX_LISTED else "")
            + ". Rows 0..n-1 of both are the same tokens only if the agent's tokenizer extends the base's; "
            "if so, pass --vocab common (recipe: 'vocab: common') to merge the common rows and keep the base's "
            "rows for the rest"
        )

    # one agent only, or an agent that is the base itself: the method decides what that means (methods.plan_warnings)
    seen: dict[tuple, str] = {}
    for ckpt, name in zip(agents, names):
        key = tuple(sorted(map(str, ckpt.files)))
        if key in seen:
            warnings.append(f"agent {name!r} is the same checkpoint as agent {seen[key]!r}")
        seen.setdefault(key, name)
    for display in sorted(mixed):
        warnings.append(f"{display} stores some tensors in another dtype than the base; computing in float32")
    for w in warnings:
        log.warning(w)
    return MergePlan(base, agents, names, jobs, out_dtype, warnings, layout, layer_sources)


def check_fits(base: Checkpoint, agent: Checkpoint) -> None:
    """Whether ``agent`` lines up with ``base`` tensor by tensor as a whole-model merge needs (names, shapes,
    float or not), from the headers alone: what ``make_plan`` refuses, said before any weights are read.
    A vocabulary-size difference is left to the merge's vocabulary choice. ``InputError`` otherwise."""
    agent = lora.bind_all(base, [agent])[0]
    aligned = _aligned_tensors(base, agent, [])
    _refuse_scaled_floats([base, agent], [base.tensors, aligned])
    _check_tensor_sets(base, [agent], [aligned])
    for name in sorted(base.tensors):
        b, info = base.tensors[name], aligned[name]
        if info.shape != b.shape and not _vocab_rows_differ(name, b, info, base, agent):
            raise _shape_error(name, b, info, base, agent)
        if info.is_float != b.is_float:
            raise _kind_error(name, b, info, agent)


def _shape_error(name: str, b: TensorInfo, info: TensorInfo, base: Checkpoint, agent: Checkpoint) -> InputError:
    return InputError(
        f"tensor {name!r} has shape {list(info.shape)} in {agent.display} but {list(b.shape)} in "
        f"the base {base.display}; these models do not share an architecture"
    )


def _kind_error(name: str, b: TensorInfo, info: TensorInfo, agent: Checkpoint) -> InputError:
    return InputError(f"tensor {name!r} is {info.dtype} in {agent.display} but {b.dtype} in the base")


LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")
INPUT_EMBEDDING = re.compile(r"(^|\.)(embed_tokens|wte|wpe|word_embeddings|embed_in|tok_embeddings)\.weight$")


def count_model_layers(names: list[str] | set[str]) -> int:
    """Decoder layers of a model: one more than the highest ``layers.<i>.`` index among its tensors."""
    return max((int(m.group(2)) + 1 for m in map(LAYER.search, names) if m), default=0)


def _laid_out(
    base: Checkpoint, agents: list[Checkpoint], aligned: list[dict[str, TensorInfo]], layout: Layout
) -> tuple[dict[str, TensorInfo], list[dict[str, TensorInfo]], dict[str, tuple[float, int, int]], list[int]]:
    """The base's and each agent's tensors under the output's names, read through the layer map.

    Output layer o (of slice g, position t) takes in role r (the base, then each agent) the tensor of the same
    kind in layer j of model m, the (m, j) the layout names for that role. Tensors outside the layers take
    their own name: input embeddings from the first slice's models, every other (final norm, output head)
    from the last slice's, both at t = 0 with their slice's parameters (mergekit's pre- and post-weights).
    Stacking (one source per slice): every role reads the source's tensor."""
    tables = [base.tensors, *aligned]
    displays = [base.display, *(a.display for a in agents)]
    check_layout(layout, len(tables), [count_model_layers(set(t)) for t in tables])
    roles = len(tables)

    def per_role(pairs: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
        return list(pairs) * roles if layout.stacking else list(pairs)

    def layer_kinds(table: dict[str, TensorInfo], layer: int) -> dict[tuple[str, str], str]:
        kinds = {}
        for name in table:
            m = LAYER.search(name)
            if m and int(m.group(2)) == layer:
                kinds[(name[: m.start(2)], name[m.end(2) :])] = name
        return kinds

    out: list[dict[str, TensorInfo]] = [{} for _ in range(roles)]
    placed: dict[str, tuple[float, int, int]] = {}
    sources: list[int] = []
    reference: set[tuple[str, str]] | None = None
    shapes = {kind: base.tensors[name].shape for kind, name in layer_kinds(base.tensors, 0).items()}
    for o, (g, t, pairs) in enumerate(layout.layers()):
        sources.append(pairs[0][1])
        for r, (m, j) in enumerate(per_role(pairs)):
            kinds = layer_kinds(tables[m], j)
            if reference is None:
                reference = set(kinds)
            if set(kinds) != reference:
                differ = sorted("".join(k).replace("..", f".{j}.") for k in set(kinds) ^ reference)
                raise InputError(
                    f"slices: layer {j} of {displays[m]} does not hold the same tensors as the other layers read "
                    f"({_listing(differ)}); these models do not share an architecture"
                )
            for (head, tail), name in kinds.items():
                if (head, tail) in shapes and tables[m][name].shape != shapes[(head, tail)]:
                    raise InputError(
                        f"tensor {name!r} has shape {list(tables[m][name].shape)} in {displays[m]} but "
                        f"{list(shapes[(head, tail)])} in the base {base.display}; these models do not share an "
                        "architecture"
                    )
                out_name = f"{head}{o}{tail}"
                out[r][out_name] = tables[m][name]
                placed[out_name] = (t, g, m)
    first, last = layout.layers()[0], layout.layers()[-1]
    for name in sorted(n for n in base.tensors if not LAYER.search(n)):
        g, pairs = (first[0], first[2]) if INPUT_EMBEDDING.search(name) else (last[0], last[2])
        for r, (m, _) in enumerate(per_role(pairs)):
            if name not in tables[m]:
                raise InputError(
                    f"tensor {name!r} of the base {base.display} is missing in {displays[m]}; "
                    "these models do not share an architecture"
                )
            out[r][name] = tables[m][name]
        placed[name] = (0.0, g, pairs[0][0])
    return out[0], out[1:], placed, sources


def _ties(ckpt: Checkpoint, output: str) -> bool:
    """Whether a checkpoint ties ``output`` to its input embedding: its config says so, or (no such key)
    it does not store ``output`` at all."""
    config = ckpt.config or {}
    value = config.get("tie_word_embeddings")
    if value is None and isinstance(config.get("text_config"), dict):
        value = config["text_config"].get("tie_word_embeddings")
    return bool(value) if value is not None else output not in ckpt.tensors


def _aligned_tensors(base: Checkpoint, agent: Checkpoint, warnings: list[str]) -> dict[str, TensorInfo]:
    """The agent's tensors under the base's names, resolving tied output embeddings (see ``make_plan``)."""
    tensors = dict(agent.tensors)
    for output, inputs in TIED_OUTPUTS.items():
        source = next((i for i in inputs if i in base.tensors and i in agent.tensors), None)
        if source is None:
            continue
        if output in base.tensors and output not in tensors and _ties(agent, output):
            tensors[output] = agent.tensors[source]  # read the agent's input embedding in its place
            log.info("%s: %s is tied to %s; reading it from there", agent.display, output, source)
        elif output not in base.tensors and output in tensors and _ties(base, output):
            del tensors[output]
            if not _ties(agent, output):
                warnings.append(
                    f"{agent.display} has an untied {output} but the base ties it to {source}; the "
                    f"merged model stays tied and this agent's {output} is not merged"
                )
    return tensors


def _refuse_scaled_floats(checkpoints: list[Checkpoint], tables: list[dict[str, TensorInfo]]) -> None:
    """FP8 and other scaled float formats store values that only mean something with their scale tensors;
    merging them as stored would be wrong and copying them from the base would drop every agent's update."""
    for ckpt, tensors in zip(checkpoints, tables):
        scaled = sorted(n for n, t in tensors.items() if t.dtype in SCALED_FLOAT_CODES)
        if scaled:
            first = tensors[scaled[0]]
            raise InputError(
                f"{ckpt.display}: {_listing(scaled)} tensors are stored as {first.dtype} (first in {first.file.name}), "
                "a scaled float format RAM Desktop cannot merge exactly; dequantise the checkpoints to bf16 or "
                "float32 first (e.g. load and save_pretrained with torch_dtype=torch.bfloat16)"
            )


def _vocab_rows_differ(name: str, b: TensorInfo, info: TensorInfo, base: Checkpoint, agent: Checkpoint) -> bool:
    """A shape difference in the first dimension only, of a vocabulary tensor (embedding or output head)."""
    if len(b.shape) == 0 or len(info.shape) != len(b.shape) or info.shape[1:] != b.shape[1:]:
        return False
    if VOCAB_TENSOR.search(name) or VOCAB_TENSOR.search(info.name):
        return True
    vocab_b, vocab_a = (base.config or {}).get("vocab_size"), (agent.config or {}).get("vocab_size")
    return vocab_b == b.shape[0] and vocab_a == info.shape[0]


def _check_tensor_sets(base: Checkpoint, agents: list[Checkpoint], aligned: list[dict[str, TensorInfo]]) -> None:
    expected = set(base.tensors)
    problems = []
    for ckpt, tensors in zip(agents, aligned):
        have = set(tensors)
        missing, extra = sorted(expected - have), sorted(have - expected)
        if missing or extra:
            parts = _differences(missing, extra, "missing {}", "extra {}")
            problems.append(f"{ckpt.display}: {'; '.join(parts)}")
    if problems:
        raise InputError(
            "tensor names differ from the base "
            + base.display
            + " — "
            + " | ".join(problems)
            + "; agents must be fine-tuned from this base with the same architecture"
        )


def _differences(missing: list[str], extra: list[str], missing_text: str, extra_text: str) -> list[str]:
    """The non-empty sides of a tensor-name mismatch, each listed into its ``{}``."""
    return [text.format(_listing(names)) for names, text in ((missing, missing_text), (extra, extra_text)) if names]


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return f"{len(names)} ({shown}{', ...' if len(names) > MAX_LISTED else ''})"
