"""The diagonal Fisher information of an agent on its own calibration prompts (docs/methods.md, Fisher merging; no Qt).

Estimator (``ESTIMATOR``): the empirical Fisher of the agent's own greedy completions. Example i is
the suite's prompt x_i, formatted exactly as evaluation formats it (chat template, system prompt), and
the agent's greedy completion ŷ_i of it (plain greedy, up to the suite's ``max_new_tokens``, the
end-of-sequence token included when generated). It contributes the square of the gradient of the
completion's log-likelihood,

    g_i = ∇_θ log p_θ(ŷ_i | x_i) = ∇_θ Σ_k log p_θ(ŷ_i,k | x_i, ŷ_i,<k),     F = (1/n) Σ_i g_i ⊙ g_i,

over the first n = min(examples, len(suite)) prompts. Each completion is generated alone (batch size 1, so
padding never touches a greedy choice); the per-example gradients are then computed for a batch of
examples at once with ``torch.func`` (``vmap`` of ``grad`` of a ``functional_call``: the square of a
per-example gradient cannot be read off a batch's summed gradient). The batch is right-padded: in a
causal model a position never attends to the positions after it, so the padding cannot change any real
position's logits, and the padded positions carry no weight in the log-likelihood. Where the model's
forward cannot be vmapped (data-dependent control flow, an operation without a batching rule that
raises), the estimate goes on one example per forward and backward pass (``_one_by_one``).
Why greedy rather than labels sampled from the output distribution (Matena & Raffel): the
completion is the behaviour RL trained the agent to produce, so F weights the parameters that
behaviour depends on; and it is deterministic, so an estimate is reproducible and cacheable. See
docs/methods.md.

Memory: a batch of per-example gradients costs batch × the model's float32 size, so the batch
(``batch_size``) is as many examples as fit twice over (the gradients and what the backward pass holds
beside them) in 4 GiB, and in a quarter of the memory available where that is less, at most
``MAX_BATCH``: a 135M-parameter model (540 MB of float32 gradients per example) gets 3 on a 24 GB machine. One example
at a time (``batch=1``, or the fallback), each parameter's squared gradient is added to a float32 host
accumulator the moment autograd has finished it (``register_post_accumulate_grad_hook``) and the
gradient is freed right there, so gradients for the whole model are never held at once: beyond the
weights, the accumulator and the activations, the peak holds about one parameter's gradient (and its
square on a GPU).

The model runs in float32 (CPU and GPU alike). Files: ``fisher.safetensors`` (or
``fisher-0000i-of-0000n.safetensors`` + ``fisher.safetensors.index.json`` above the shard size), float32,
one tensor per floating tensor of the agent's checkpoint under its name (0 for a stored tensor that is
no trainable parameter), and ``fisher.json``. ``cached_fisher`` keeps estimates under
``<cache>/fisher/<key>`` (key: agent files' fingerprint, suite contents, examples, estimator).
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import math
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import paths
from ..core import Checkpoint, InputError, Reporter, open_checkpoint, parse_size, resolve_device
from ..core.methods.fisher import INDEX_FILE, SINGLE_FILE
from ..core.storage.formats.safetensors_format import SafetensorsStreamWriter
from ..core.storage.manifest import foreign_entries, read_manifest, write_manifest
from ..core.storage.output import check_output, staging_folder
from .runner import _quiet_transformers, check_loadable, load_model, prompt_ids, require_transformers, stop_token_ids
from .suites import Suite, load_suite

log = logging.getLogger("ram_desktop")

STAGE = "fisher"
ESTIMATOR = "empirical-greedy/1"
FORMAT = "ram-fisher/1"
FISHER_JSON = "fisher.json"
DEFAULT_EXAMPLES = 256
DEFAULT_SHARD = "5GB"
MAX_BATCH = 16  # examples per batched gradient pass, at most: a bound on a batch's padding and memory
GRADIENT_BUDGET = 4 * 2**30  # bytes for a batch's per-example gradients (twice their size), on any machine
MEMORY_SHARE = 0.25  # of the memory available, at most, for the same


@dataclass
class FisherEstimate:
    """F per checkpoint tensor name (float32, on the host) and what produced it."""

    tensors: dict[str, torch.Tensor]
    info: dict[str, Any]


def agent_fingerprint(ckpt: Checkpoint) -> str:
    """The agent's files (paths, sizes, modification times), Hub revision and tensor table."""
    h = hashlib.sha256()
    for f in ckpt.files:
        st = f.stat()
        h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    h.update((ckpt.revision or "").encode())
    for name in sorted(ckpt.tensors):
        info = ckpt.tensors[name]
        h.update(f"{name}{info.shape}{info.dtype}".encode())
    return h.hexdigest()[:32]


def suite_fingerprint(suite: Suite) -> str:
    """What the examples are: the data file's and suite.yaml's bytes."""
    h = hashlib.sha256()
    for f in (suite.data_file, suite.config_file):
        h.update(b"\0")
        if f is not None:
            h.update(Path(f).read_bytes())
    return h.hexdigest()[:32]


def _check_examples(examples: Any) -> int:
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise InputError(f"--examples must be a whole number of at least 1, got {examples!r}")
    return examples


def estimate_fisher(
    agent: str | Path,
    suite: Suite | str | Path,
    examples: int = DEFAULT_EXAMPLES,
    device: str = "auto",
    reporter: Reporter | None = None,
    batch: int | None = None,
) -> FisherEstimate:
    """The diagonal Fisher of ``agent`` on the first ``examples`` prompts of ``suite`` (module docstring).
    ``batch``: examples per gradient pass (None: ``batch_size``, from the model's size and the memory; 1: one
    example per forward and backward pass, the memory-lean loop); it changes the float rounding of the sums,
    never what they sum.

    Progress: ``Reporter.progress("fisher", done, total, "examples", detail)`` after every example;
    cancelling stops at the next example with ``Cancelled``."""
    reporter = reporter or Reporter()
    start = time.perf_counter()
    examples = _check_examples(examples)
    suite = suite if isinstance(suite, Suite) else load_suite(suite)
    require_transformers()
    torch_device = resolve_device(device)
    ckpt = open_checkpoint(str(agent), reporter)
    if not ckpt.path.is_dir():
        raise InputError(
            f"{agent}: the Fisher estimate needs a model folder (config.json, tokenizer and weights), "
            f"not a single weights file"
        )
    name = ckpt.path.name
    check_loadable(ckpt.path, name)
    used = suite.head(examples)
    n = len(used)
    reporter.progress(STAGE, 0, n, "examples", f"loading {name}")
    # what exists now is long-lived (or the caller's: a window's objects, which only its GUI thread may free):
    # frozen, it is left out of the collection below, which then frees the model and scans little else
    gc.freeze()
    model, tokenizer = _load(ckpt.path, name, torch_device)
    try:
        accumulators, names_of = _accumulators(model, ckpt)
        prompts = prompt_ids(tokenizer, used, name)
        stops = stop_token_ids(model, tokenizer)
        parameters = sum(p.numel() for p, _ in accumulators.values())
        size = batch_size(parameters, torch_device) if batch is None else max(1, batch)
        squares = _Squares(model, accumulators, size)
        pending: list[tuple[list[int], list[int]]] = []
        tokens = 0
        for i, ids in enumerate(prompts):
            reporter.check()
            completion = _completion(model, ids, stops, used.max_new_tokens, torch_device)
            tokens += len(completion)
            if completion:  # an empty completion has no log-likelihood: it adds nothing
                pending.append((ids, completion))
            if len(pending) == size or i == n - 1:
                squares.add(pending, torch_device)
                pending = []
            reporter.progress(STAGE, i + 1, n, "examples", f"{name} · {suite.name}")  # the faces show the rate
        tensors: dict[str, torch.Tensor] = {}
        for pid, (_, acc) in accumulators.items():
            acc.div_(n)
            for tensor_name in names_of[pid]:
                tensors[tensor_name] = acc
        for tensor_name, info in ckpt.tensors.items():
            if info.is_float and tensor_name not in tensors:  # a stored buffer: no gradient, no information
                tensors[tensor_name] = torch.zeros(info.shape, dtype=torch.float32)
    finally:
        del model
        gc.collect()
        if torch_device.type == "cuda":
            torch.cuda.empty_cache()
    details = {
        "format": FORMAT,
        "agent": ckpt.display,
        "agent_fingerprint": agent_fingerprint(ckpt),
        "suite": {"name": suite.name, "source": str(suite.source), "fingerprint": suite_fingerprint(suite)},
        "examples": n,
        "examples_requested": examples,
        "estimator": ESTIMATOR,
        "completion_tokens": tokens,
        "device": str(torch_device),
        "dtype": "float32",
        "batch": squares.batch,
        "seconds": round(time.perf_counter() - start, 3),
        "versions": _versions(),
    }
    return FisherEstimate(tensors, details)


def _versions() -> dict[str, str]:
    from .runner import versions

    return versions()


def _load(folder: Path, name: str, device: torch.device) -> tuple[Any, Any]:
    """The model in float32, in eval mode (no dropout), with gradients on every parameter."""
    model, tokenizer = load_model(folder, name, device, torch.float32)
    for p in model.parameters():
        p.requires_grad_(True)
    return model, tokenizer


def _accumulators(
    model: Any, ckpt: Checkpoint
) -> tuple[dict[int, tuple[torch.nn.Parameter, torch.Tensor]], dict[int, list[str]]]:
    """One float32 host accumulator per distinct parameter, and the checkpoint names each one answers
    (a tied parameter answers every name it is stored under)."""
    accumulators: dict[int, tuple[torch.nn.Parameter, torch.Tensor]] = {}
    names_of: dict[int, list[str]] = {}
    stored = {n for n, i in ckpt.tensors.items() if i.is_float}
    for pname, p in model.named_parameters(remove_duplicate=False):
        if pname not in stored:
            continue
        if tuple(p.shape) != ckpt.tensors[pname].shape:
            raise InputError(
                f"{ckpt.display}: tensor {pname} has shape {list(ckpt.tensors[pname].shape)} in the "
                f"checkpoint but {list(p.shape)} in the loaded model"
            )
        if id(p) not in accumulators:
            accumulators[id(p)] = (p, torch.zeros(p.shape, dtype=torch.float32))
        names_of.setdefault(id(p), []).append(pname)
    unstored = sorted({id(p): n for n, p in model.named_parameters() if id(p) not in accumulators}.values())
    if unstored:  # transformers renamed tensors on load: F could not be written under the agent's names
        more = f" and {len(unstored) - 5} more" if len(unstored) > 5 else ""
        raise InputError(
            f"{ckpt.display}: the model transformers loaded has parameters the checkpoint does not store "
            f"under that name ({', '.join(unstored[:5])}{more}); the Fisher file must carry the "
            f"agent's tensor names, so this architecture is not supported for Fisher merging yet"
        )
    return accumulators, names_of


def batch_size(parameters: int, device: torch.device) -> int:
    """Examples per batched gradient pass for a model of ``parameters`` (distinct) parameters: a batch of
    per-example gradients costs batch × the model's float32 size, counted twice (the gradients and what the
    backward pass holds beside them), within ``GRADIENT_BUDGET`` (the model's own batch, the same on every
    machine with room for it, so the float rounding of F does not follow the free memory of the moment) and
    within a quarter of the memory available (the device's free memory on a GPU); 1 to ``MAX_BATCH``."""
    per_example = 2 * 4 * parameters
    if device.type == "cuda":
        available: int | None = torch.cuda.mem_get_info(device)[0]
    else:
        from .search import available_memory

        available = available_memory()
    room = int(MEMORY_SHARE * available) // per_example if available is not None else GRADIENT_BUDGET
    return max(1, min(MAX_BATCH, GRADIENT_BUDGET // per_example, room))


class _Squares:
    """Adds the squared per-example gradients of batches of examples to the accumulators: batched with
    ``torch.func`` (``_batched``) while the model allows it, else one example per pass (``_one_by_one``)."""

    def __init__(
        self, model: Any, accumulators: dict[int, tuple[torch.nn.Parameter, torch.Tensor]], batch: int
    ) -> None:
        self.model, self.accumulators, self.batch = model, accumulators, batch

    def add(self, examples: list[tuple[list[int], list[int]]], device: torch.device) -> None:
        """``examples``: (prompt, completion) token ids, the completion not empty."""
        if not examples:
            return
        if self.batch > 1:
            try:
                self._batched(examples, device)
                return
            except (RuntimeError, NotImplementedError) as e:  # the forward cannot be vmapped: one by one from here
                log.info("Fisher: per-example gradients one example at a time (%s)", str(e).splitlines()[0])
                self.batch = 1
        for prompt, completion in examples:
            self._one_by_one(prompt, completion, device)

    def _batched(self, examples: list[tuple[list[int], list[int]]], device: torch.device) -> None:
        """vmap(grad(log-likelihood)) over the right-padded examples (module docstring); the squares are summed
        over the batch and added to the accumulators only once every gradient is there."""
        import warnings

        from torch.func import functional_call, grad, vmap

        length = max(len(p) + len(c) for p, c in examples)
        ids = torch.zeros(len(examples), length, dtype=torch.long)
        weights = torch.zeros(len(examples), length)
        for i, (prompt, completion) in enumerate(examples):
            ids[i, : len(prompt) + len(completion)] = torch.tensor(prompt + completion)
            weights[i, len(prompt) : len(prompt) + len(completion)] = 1.0  # the completion's tokens only
        ids, weights = ids.to(device), weights.to(device)
        params = {n: p.detach() for n, p in self.model.named_parameters() if id(p) in self.accumulators}
        model = self.model

        def log_likelihood(values: dict[str, torch.Tensor], row: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            logits = functional_call(model, values, args=(), kwargs={"input_ids": row[None]}).logits[0, :-1].float()
            picked = torch.log_softmax(logits, dim=-1).gather(1, row[1:, None])[:, 0]
            return (picked * weight[1:]).sum()

        with warnings.catch_warnings():  # torch's note that an op (CPU attention) runs its batch as a loop
            warnings.filterwarnings("ignore", message="There is a performance drop", category=UserWarning)
            gradients = vmap(grad(log_likelihood), in_dims=(None, 0, 0))(params, ids, weights)
        for pname, g in gradients.items():
            acc = self.accumulators[id(self.model.get_parameter(pname))][1]
            acc.add_(g.square().sum(0).to("cpu", torch.float32))

    def _one_by_one(self, prompt: list[int], completion: list[int], device: torch.device) -> None:
        """One forward and one backward pass of the completion's log-likelihood; hooks square each gradient
        into its accumulator as autograd finishes it and free it."""
        hooks = [p.register_post_accumulate_grad_hook(_square_into(acc)) for p, acc in self.accumulators.values()]
        try:
            full = torch.tensor([prompt + completion], dtype=torch.long, device=device)
            logits = self.model(input_ids=full).logits[0, len(prompt) - 1 : -1].float()
            target = full[0, len(prompt) :]
            torch.log_softmax(logits, dim=-1).gather(1, target[:, None]).sum().backward()
        finally:
            for h in hooks:
                h.remove()


def _square_into(acc: torch.Tensor) -> Callable[[torch.Tensor], None]:
    """A post-accumulate-grad hook: acc += grad², then the gradient is freed."""

    def hook(param: torch.Tensor) -> None:
        grad = param.grad
        if grad is not None:
            if grad.device.type == "cpu":
                acc.addcmul_(grad, grad)
            else:
                acc.add_(grad.square().to("cpu", torch.float32))
        param.grad = None

    return hook


def _completion(
    model: Any, prompt: list[int], stops: list[int], max_new_tokens: int, device: torch.device
) -> list[int]:
    """The greedy completion of ``prompt``, generated alone, up to and including the first stop token."""
    from transformers import GenerationConfig

    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    config = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        eos_token_id=stops or None,
        pad_token_id=stops[0] if stops else 0,
        bos_token_id=getattr(model.generation_config, "bos_token_id", None),
    )
    with torch.no_grad(), _quiet_transformers():
        output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    completion = output[0, len(prompt) :].tolist()
    stop = next((k for k, t in enumerate(completion) if t in stops), None)
    return completion if stop is None else completion[: stop + 1]


# --- files ---------------------------------------------------------------------------------------


def _layout(entries: list[tuple[str, tuple[int, ...]]], shard_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    used = 0
    for name, shape in entries:
        size = math.prod(shape) * 4
        if shards[-1] and used + size > shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append((name, shape))
        used += size
    return shards


def write_fisher_files(folder: Path, estimate: FisherEstimate, shard_size: str | int = DEFAULT_SHARD) -> list[str]:
    """Write ``estimate`` into ``folder`` (which exists): float32 safetensors, sharded with an index above
    ``shard_size``, and ``fisher.json``. Returns the weight file names."""
    entries = [(n, tuple(estimate.tensors[n].shape)) for n in sorted(estimate.tensors)]
    shards = _layout(entries, parse_size(shard_size))
    names = (
        [SINGLE_FILE]
        if len(shards) == 1
        else [f"fisher-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    for file, shard in zip(names, shards):
        writer = SafetensorsStreamWriter(
            folder / file, [(n, "float32", s) for n, s in shard], {"format": "pt", "ram_desktop": FORMAT}
        )
        for n, _ in shard:
            writer.write(estimate.tensors[n].contiguous())
        writer.close()
    if len(shards) > 1:
        total = sum(math.prod(s) * 4 for _, s in entries)
        index = {
            "metadata": {"total_size": total},
            "weight_map": {n: f for f, shard in zip(names, shards) for n, _ in shard},
        }
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2))
    info = dict(estimate.info, files=names + ([INDEX_FILE] if len(shards) > 1 else []))
    (folder / FISHER_JSON).write_text(json.dumps(info, indent=1) + "\n")
    return names


def write_fisher(
    agent: str | Path,
    suite: Suite | str | Path,
    out: str | Path,
    examples: int = DEFAULT_EXAMPLES,
    device: str = "auto",
    reporter: Reporter | None = None,
    overwrite: bool = False,
    shard_size: str | int = DEFAULT_SHARD,
) -> dict[str, Any]:
    """``ram-merge fisher``: estimate and write into ``out`` (staged; nothing written on error or cancel)."""
    reporter = reporter or Reporter()
    suite = suite if isinstance(suite, Suite) else load_suite(suite)
    _check_examples(examples)
    ckpt = open_checkpoint(str(agent), reporter)
    size = sum(i.numel for i in ckpt.tensors.values() if i.is_float) * 4
    out = check_output(Path(out), [ckpt], overwrite, size)
    estimate = estimate_fisher(agent, suite, examples, device, reporter)
    with staging_folder(out, overwrite) as folder:
        write_fisher_files(folder, estimate, shard_size)
    return estimate.info


# --- cache ---------------------------------------------------------------------------------------


def cache_root() -> Path:
    """Where Fisher estimates are cached (``paths.cache_dir("fisher")``)."""
    return paths.cache_dir("fisher")


def cache_key(ckpt: Checkpoint, suite: Suite, examples: int) -> str:
    text = f"{ESTIMATOR}\0{agent_fingerprint(ckpt)}\0{suite_fingerprint(suite)}\0{examples}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_fisher(
    agent: str | Path,
    suite: Suite | str | Path,
    examples: int = DEFAULT_EXAMPLES,
    device: str = "auto",
    reporter: Reporter | None = None,
) -> Path:
    """The Fisher folder of ``agent`` on ``suite``: from the cache when an estimate with the same agent
    fingerprint, suite contents, examples and estimator exists, else estimated and cached."""
    reporter = reporter or Reporter()
    suite = suite if isinstance(suite, Suite) else load_suite(suite)
    examples = _check_examples(examples)
    ckpt = open_checkpoint(str(agent), reporter)
    key = cache_key(ckpt, suite, examples)
    folder = cache_root() / key
    if os.path.lexists(folder):
        why = _cache_unusable(folder, key)
        if why is None:
            log.info(
                "reusing the cached Fisher of %s on suite %s (%d examples): %s",
                ckpt.display,
                suite.name,
                examples,
                folder,
            )
            return folder
        log.warning("ignoring the cached Fisher %s (%s); estimating it again", folder, why)
    estimate = estimate_fisher(agent, suite, examples, device, reporter)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f"{folder.name}.partial-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        write_fisher_files(tmp, estimate)
        write_manifest(tmp, key=key)
        if _cache_unusable(folder, key) is None:  # another run finished the same estimate meanwhile
            shutil.rmtree(tmp)
        else:
            if os.path.lexists(folder):  # the unusable entry goes; it is the cache's own, never the user's
                stale = folder.with_name(f"{folder.name}.stale-{uuid.uuid4().hex[:8]}")
                os.replace(folder, stale)
                if stale.is_dir() and not stale.is_symlink():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink()
            os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info(
        "Fisher of %s on suite %s: %d examples in %.1f s, cached in %s",
        ckpt.display,
        suite.name,
        estimate.info["examples"],
        estimate.info["seconds"],
        folder,
    )
    return folder


def _cache_unusable(folder: Path, key: str) -> str | None:
    """Why the cache entry ``folder`` cannot be used for ``key`` (None: it can): it must be a real folder whose
    manifest names this key and lists every file with its size and SHA-256, unchanged."""
    if folder.is_symlink() or not folder.is_dir():
        return "not a folder" if os.path.lexists(folder) else "missing"
    manifest = read_manifest(folder)
    if manifest is None:
        return "no readable manifest"
    if manifest.get("key") != key:
        return "it describes another agent, suite or example count"
    changed = foreign_entries(folder) + [n for n in manifest["files"] if not (folder / n).is_file()]
    if changed or FISHER_JSON not in manifest["files"]:
        return f"its content does not match its checksums: {', '.join(changed[:3]) or FISHER_JSON}"
    return None


def resolve_fisher_params(
    method: str, params: dict[str, Any], agents: list[str], device: str = "auto", reporter: Reporter | None = None
) -> dict[str, Any]:
    """For a calibrated method (``--method fisher``) with ``suite``: the parameters with ``fisher`` set to each
    agent's cached (or freshly estimated) Fisher folder; any other method's parameters unchanged."""
    from ..core import get_method

    merge_method = get_method(method)
    if not merge_method.interop.calibrated:
        return params
    resolved = merge_method.resolve(params)
    suites = resolved.get("suite")
    if not suites:
        if resolved.get("fisher"):  # local folders by absolute path, so the written recipe runs from anywhere
            return dict(params, fisher=[_absolute(f) for f in resolved["fisher"]])
        return params
    if len(suites) != len(agents):
        raise InputError(
            f"{len(suites)} calibration suites for {len(agents)} agents; give one --fisher-suite per agent, "
            f"comma-separated, in agent order"
        )
    loaded = [load_suite(s) for s in suites]  # every suite checked before the first estimate starts
    folders = [str(cached_fisher(a, s, resolved["examples"], device, reporter)) for a, s in zip(agents, loaded)]
    return dict(params, suite=[_absolute(s) for s in suites], fisher=folders)


def _absolute(path: str) -> str:
    local = Path(path).expanduser()
    return str(local.resolve()) if local.exists() else path
