"""Generate and score: every model on every suite, greedy, batched, through ``transformers``.

- One model in memory at a time, freed before the next is loaded.
- bfloat16 on CUDA, float32 on the CPU.
- Prompts are left-padded into batches (longest first, so the slowest batch comes early and the
  ETA errs on the safe side); completions are returned in suite order.
- A suite's ``chat_template``: ``true`` formats each prompt (after an optional system message) with
  the tokenizer's chat template and asks for the assistant's turn; ``auto`` does so when the
  tokenizer has one; ``false`` (or ``auto`` without one) tokenizes the raw prompt with the
  tokenizer's special tokens (e.g. BOS), the system prompt put before it, separated by a blank line.
- Greedy means plain greedy: the model's own sampling settings (temperature, top-p, repetition
  penalty) are ignored. Generation stops at ``max_new_tokens`` or at any end-of-sequence token the
  model's generation config, its config or its tokenizer names.
- ``trust_remote_code`` is never set: a model (or tokenizer) that needs its repository's own code is
  refused with ``InputError``, as is anything ``transformers`` cannot load.
- Progress: ``Reporter.progress("evaluate", done_examples, total_examples, "examples", detail)``
  after every batch (detail: model, suite and generated tokens/s; the faces show examples/s); cancelling stops at
  the next batch boundary with ``Cancelled``. Nothing is written by this module.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import math
import os
import platform
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..core import InputError, Reporter, first_line, open_checkpoint, resolve_device
from ..core.storage.safe_read import check_regular, read_json
from . import vllm_backend
from .cache import ScoreCache, folder_fingerprint, score_key, suite_fingerprint
from .floors import Floor, floor_of
from .lm_eval_tasks import LmEvalTask, score_model
from .results import EvalResult, ModelRef, ScoreFailure, ScoringFailed, SuiteSummary
from .scorer_process import ScorerProcess
from .scorers import Scorer, make_scorer
from .suites import Suite, check_eval_options

log = logging.getLogger("ram_desktop")
STAGE = "evaluate"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)


@dataclass(frozen=True)
class InMemoryModel:
    """A model held in this process, scored as a folder is without its weights being read from disk (a search
    trial merged in memory, ``pipeline.InMemory``): ``folder`` holds what transformers reads beside the weights
    (config.json, the tokenizer, the generation config) and ``tensors`` the weights by name, as its safetensors
    would hold them. The transformers backend only (vLLM and lm-eval tasks load folders)."""

    name: str
    folder: Path
    tensors: Mapping[str, torch.Tensor]


Tensors = Mapping[str, torch.Tensor] | None  # a model's weights in memory, or None: read from its folder


def model_refs(sources: Sequence[str | Path], names: Sequence[str] | None = None) -> list[ModelRef]:
    """Name the models: ``names`` when given (one per source, distinct), else each folder's name (or
    the Hub repository's), with ``-2``, ``-3`` ... added where two would be the same."""
    texts = [str(s).strip() for s in sources]
    if not texts:
        raise InputError("no models to evaluate; name at least one model folder or Hub id")
    if names is not None:
        names = [n.strip() for n in names]
        if len(names) != len(texts):
            raise InputError(f"{len(names)} names for {len(texts)} models; give one name per model")
        if any(not n for n in names):
            raise InputError("a model name is empty")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InputError(f"model name {dupes[0]!r} is given twice; names must differ")
        return [ModelRef(n, s) for n, s in zip(names, texts)]
    refs: list[ModelRef] = []
    seen: dict[str, int] = {}
    for source in texts:
        base = _default_name(source)
        seen[base] = seen.get(base, 0) + 1
        refs.append(ModelRef(base if seen[base] == 1 else f"{base}-{seen[base]}", source))
    return refs


def _default_name(source: str) -> str:
    path = Path(source).expanduser()
    if path.exists():
        return path.resolve().name or source
    return source.removeprefix("hf://").split("@")[0].rstrip("/").split("/")[-1] or source


def evaluate(
    models: Sequence[ModelRef | InMemoryModel | str | Path],
    suites: Sequence[Suite | LmEvalTask],
    device: str = "auto",
    batch_size: int = 8,
    limit: int | None = None,
    reporter: Reporter | None = None,
    threads: int | None = None,
    scorer_timeout: float | None = None,
    cache: ScoreCache | None = None,
    scorer_process: ScorerProcess | None = None,
    backend: str = vllm_backend.TRANSFORMERS,
    pool_suites: bool | None = None,
) -> EvalResult:
    """Score every model on every suite (see the module docstring). ``limit`` keeps the first N
    examples of each suite. Python scorers are loaded (their files run, in their child process) here,
    before any model; after the models they score each suite's constant answers for its floor (``floors``). ``threads``:
    torch's CPU threads for this call (default: ``RAM_DESKTOP_THREADS`` when set, else per model: one
    for a tiny model on the CPU, torch's own setting otherwise); restored afterwards. ``scorer_timeout``:
    seconds a python scorer may take per batch, for every suite (default: each suite's
    ``scorer_timeout``). ``cache``: scores found there (same model files, suite, scorer, device and batch
    size) are reused, a model with all of them is not even loaded; new scores are added to it.
    ``scorer_process``: the child process python scorers run in, kept open by the caller across calls (a
    search's trials: its scorer files are loaded once); default a new one, ended on return. ``backend``:
    ``"transformers"`` (the model in this process) or ``"vllm"`` (``vllm_backend``: a CUDA GPU and vLLM, refused
    before any work without them; lm-eval tasks then run on lm-eval's own ``vllm`` model). An ``InMemoryModel``
    is loaded from its tensors (transformers backend, no lm-eval tasks; never cached). ``pool_suites``: suites
    that generate alike share one generation pass (``suite_passes``; fuller batches); None: on a GPU, where a
    batch costs about what one prompt does. Pooled or not, each example is its own greedy completion, so the
    scores are the same up to floating-point differences that a different padded width can make.

    Raises ``InputError`` for bad input (suites a scorer cannot score, models that cannot be loaded,
    a scorer file that cannot load), ``ScoringFailed`` (an ``InputError`` carrying the finished
    results) when a scorer fails during the run, and ``Cancelled`` when the reporter's token is cancelled.
    """
    reporter = reporter or Reporter()
    start = time.perf_counter()
    given = [m for m in models if not isinstance(m, (ModelRef, InMemoryModel))]
    plain = iter(model_refs(given) if given else [])
    refs = [
        m
        if isinstance(m, ModelRef)
        else ModelRef(m.name, str(m.folder))
        if isinstance(m, InMemoryModel)
        else next(plain)
        for m in models
    ]
    weights: list[Tensors] = [m.tensors if isinstance(m, InMemoryModel) else None for m in models]
    if not refs:
        raise InputError("no models to evaluate; name at least one model folder or Hub id")
    if not suites:
        raise InputError("no suites to evaluate on; give at least one --suite")
    check_eval_options(batch_size, limit, scorer_timeout)
    require_transformers()
    vllm_backend.check_backend(backend, device)
    torch_device = resolve_device(device)
    tasks = [(k, s) for k, s in enumerate(suites) if isinstance(s, LmEvalTask)]
    if any(w is not None for w in weights) and (backend != vllm_backend.TRANSFORMERS or tasks):
        raise InputError("a model held in memory is scored with the transformers backend on RAM Desktop suites only")
    own_suites = [s.head(limit) for s in suites if isinstance(s, Suite)]
    with contextlib.ExitStack() as stack:
        process = scorer_process or stack.enter_context(contextlib.closing(ScorerProcess(reporter.check)))
        scorers = [
            make_scorer(s.scorer_spec, process=process, timeout=scorer_timeout or s.scorer_timeout) for s in own_suites
        ]
        for scorer, suite in zip(scorers, own_suites):
            scorer.check(suite)
        resolved = [
            _resolve(ref, reporter) if w is None else _in_memory(ref, Path(ref.source)) for ref, w in zip(refs, weights)
        ]
        result = _evaluate(
            resolved,
            own_suites,
            scorers,
            torch_device,
            batch_size,
            reporter,
            threads,
            start,
            cache,
            backend,
            weights,
            torch_device.type == "cuda" if pool_suites is None else pool_suites,
        )
    return (
        _with_lm_eval(result, resolved, tasks, torch_device, batch_size, limit, reporter, backend) if tasks else result
    )


def _floor(suite: Suite, scorer: Scorer) -> Floor | None:
    """The suite's floor (``floors.floor_of``), scored after the models so that a scorer failing on every
    batch fails during the run with its finished scores kept; a scorer that fails only on a constant answer
    leaves the suite without a floor (one log line)."""
    try:
        return floor_of(suite, scorer)
    except InputError as e:
        log.warning("suite %r has no floor: its scorer failed on a constant answer (%s)", suite.name, e)
        return None


def _with_lm_eval(
    result: EvalResult,
    resolved: list[tuple[ModelRef, Path, str]],
    tasks: list[tuple[int, LmEvalTask]],
    device: torch.device,
    batch_size: int,
    limit: int | None,
    reporter: Reporter,
    backend: str = vllm_backend.TRANSFORMERS,
) -> EvalResult:
    """``result`` with the lm-eval tasks' columns put in their places (``tasks``: (position, task)), each
    model scored by lm-eval itself (``lm_eval_tasks.score_model``)."""
    for m, (ref, folder, _) in enumerate(resolved):
        reporter.check()
        reporter.progress(STAGE, m, len(resolved), "models", f"lm-eval: {ref.name}")
        scores = score_model(folder, [t for _, t in tasks], str(device), batch_size, limit, backend=backend)
        for (k, task), score in zip(tasks, scores):
            if m == 0:
                result.suites.insert(k, SuiteSummary(task.name, task.source, len(score.per_example), score.metric))
            result.scores[m].insert(k, score.score)
            if result.rewards:
                result.rewards[m].insert(k, score.per_example)
            if result.completions:
                result.completions[m].insert(k, score.responses)
    return result


def _evaluate(
    resolved: list[tuple[ModelRef, Path, str]],
    suites: list[Suite],
    scorers: list[Scorer],
    torch_device: torch.device,
    batch_size: int,
    reporter: Reporter,
    threads: int | None,
    start: float,
    cache: ScoreCache | None,
    backend: str = vllm_backend.TRANSFORMERS,
    weights: Sequence[Tensors] = (),
    pooled: bool = False,
) -> EvalResult:
    refs = [ref for ref, _, _ in resolved]
    weights = list(weights) or [None] * len(resolved)

    progress = _Progress(reporter, total=len(refs) * sum(len(s) for s in suites))
    progress.report("starting")
    completions: list[list[list[str]]] = []
    rewards: list[list[list[float] | None]] = []
    failures: list[ScoreFailure] = []
    # A full collection scans every object of the process (modules, a window's widgets) while holding the
    # GIL: 0.3-0.6 s with transformers imported, in which a window cannot draw. Frozen objects are left out
    # of every later collection, so the collections after each model scan only what was made since (the
    # model among it; 0.1 ms once transformers is warm). What is frozen is long-lived (modules, the caller's
    # objects) and stays frozen: unfreezing would hand the caller the full collection this avoids.
    gc.freeze()
    threads = _configured_threads(threads)
    suite_keys = [suite_fingerprint(s) for s in suites] if cache is not None else []
    with _torch_threads(threads):
        for (ref, folder, _), tensors in zip(resolved, weights):
            cached = cache if tensors is None else None  # a model in memory has no files to fingerprint
            model_key = folder_fingerprint(folder) if cached is not None else ""
            keys = [score_key(model_key, k, str(torch_device), batch_size, backend) for k in suite_keys]
            found = [cached.get(k) for k in keys] if cached is not None else [None] * len(suites)
            todo = [k for k, hit in enumerate(found) if hit is None]
            progress.skip(sum(len(suites[k]) for k, hit in enumerate(found) if hit is not None), "reused")
            texts_todo, scored_todo = (
                _complete(
                    ref,
                    folder,
                    [suites[k] for k in todo],
                    [scorers[k] for k in todo],
                    failures,
                    torch_device,
                    batch_size,
                    progress,
                    threads is None,
                    backend,
                    tensors,
                    pooled,
                )
                if todo
                else ([], [])
            )
            fresh = dict(zip(todo, zip(texts_todo, scored_todo)))
            texts = [list(hit.completions) if hit is not None else fresh[k][0] for k, hit in enumerate(found)]
            scored = [list(hit.rewards) if hit is not None else fresh[k][1] for k, hit in enumerate(found)]
            if cached is not None:
                for k in todo:
                    texts_k, rewards_k = fresh[k]
                    if rewards_k is not None:  # a suite whose scorer failed is not kept
                        cached.put(keys[k], texts_k, rewards_k)
            completions.append(texts)
            rewards.append(scored)
            gc.collect()  # the model is unreachable once _complete returns: free it before the next one loads
            gc.freeze()  # what loading it imported lazily (the modeling code, torch's dynamo) is long-lived
            if torch_device.type == "cuda":
                torch.cuda.empty_cache()
    scores = [[sum(r) / len(r) if r is not None else math.nan for r in per_model] for per_model in rewards]
    failed = {f.suite for f in failures}
    floors = [_floor(suite, scorer) if suite.name not in failed else None for suite, scorer in zip(suites, scorers)]
    result = EvalResult(
        models=[ModelRef(ref.name, display) for ref, _, display in resolved],
        suites=[SuiteSummary(s.name, str(s.source), len(s), s.scorer, f) for s, f in zip(suites, floors)],
        scores=scores,
        seconds=time.perf_counter() - start,
        device=str(torch_device),
        versions=versions(backend),
        completions=completions,
        rewards=[[r if r is not None else [] for r in per_model] for per_model in rewards],
        generated_tokens=progress.tokens,
        failures=failures,
    )
    if failures:
        raise ScoringFailed(result)
    return result


def _configured_threads(threads: int | None) -> int | None:
    """The thread count the caller asked for: ``threads``, else ``RAM_DESKTOP_THREADS``, else None (chosen
    per model: ``model_threads``)."""
    if threads is None:
        env = os.environ.get("RAM_DESKTOP_THREADS", "").strip()
        threads = int(env) if env.isdigit() and int(env) > 0 else None
    return threads


TINY_MODEL = 50_000_000  # parameters: below this a decoding step is too small to share between threads


def model_threads(model: Any, device: torch.device) -> int | None:
    """Threads for generating with ``model`` when nobody asked for a number: one for a tiny model on the
    CPU (its operations are so small that with several threads each ends waiting at a barrier for a thread
    another program has descheduled: 5x slower on a busy 2-core machine, benchmarks/README.md), else
    torch's own setting (None)."""
    if device.type != "cpu" or sum(p.numel() for p in model.parameters()) >= TINY_MODEL:
        return None
    return 1


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` CPU threads (None: as it is); torch's setting is restored after.

    Generation is many small operations with a barrier each: on a machine that other programs keep
    busy, one thread is often several times faster than all cores (see benchmarks/README.md)."""
    if threads is None:
        yield
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InputError(f"threads must be a whole number of at least 1, got {threads!r}")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class _Progress:
    """Examples done across models and suites, reported after every batch with this model's rates."""

    def __init__(self, reporter: Reporter, total: int) -> None:
        self.reporter, self.total, self.done, self.tokens = reporter, total, 0, 0
        self.model_start, self.model_done, self.model_tokens = time.perf_counter(), 0, 0

    def report(self, detail: str) -> None:
        self.reporter.progress(STAGE, self.done, self.total, "examples", detail)

    def start_model(self) -> None:
        self.model_start, self.model_done, self.model_tokens = time.perf_counter(), 0, 0

    def skip(self, examples: int, why: str | None = None) -> None:
        """Examples that will not be generated (their scores reused, or their suite's scorer failed): counted done."""
        self.done += examples
        if examples and why:
            self.report(f"{examples} examples' scores {why}")

    def batch(self, model: str, suite: str, examples: int, tokens: int) -> None:
        self.done += examples
        self.tokens += tokens
        self.model_done += examples
        self.model_tokens += tokens
        elapsed = max(time.perf_counter() - self.model_start, 1e-9)
        # examples per second is the progress line's own (each face computes it from done and time): one rate
        self.report(f"{model} · {suite} · {self.model_tokens / elapsed:.1f} tokens/s")


def suite_passes(suites: Sequence[Suite], pooled: bool) -> list[list[int]]:
    """The generation passes over ``suites``, each a list of suite positions generated together. Pooled, the
    suites that generate alike (the same ``max_new_tokens``: greedy decoding has no other setting) share one
    pass, in order of first appearance, so small suites fill a batch together; else each suite is its own pass."""
    if not pooled:
        return [[k] for k in range(len(suites))]
    passes: dict[int, list[int]] = {}
    for k, suite in enumerate(suites):
        passes.setdefault(suite.max_new_tokens, []).append(k)
    return list(passes.values())


def _complete(
    ref: ModelRef,
    folder: Path,
    suites: list[Suite],
    scorers: list[Scorer],
    failures: list[ScoreFailure],
    device: torch.device,
    batch_size: int,
    progress: _Progress,
    pick_threads: bool = False,
    backend: str = vllm_backend.TRANSFORMERS,
    tensors: Tensors = None,
    pooled: bool = False,
) -> tuple[list[list[str]], list[list[float] | None]]:
    """Load one model, generate the completions of every suite and score each batch as it comes, free the
    model. A scorer that fails adds to ``failures``: the rest of that suite is neither scored nor counted (nor
    generated, once no suite of its pass is left), for this model and the later ones (its rewards are None);
    other suites go on. ``pick_threads``: generate with ``model_threads``' choice for this model. ``tensors``:
    its weights, held in memory (``InMemoryModel``). ``pooled``: suites that generate alike share a pass
    (``suite_passes``); each example's prompt and greedy completion are its own either way."""
    progress.report(f"loading {ref.name}")
    texts = [[""] * len(s) for s in suites]
    rewards = [[0.0] * len(s) for s in suites]
    failed = [False] * len(suites)
    generated = [0] * len(suites)

    def fail(k: int, error: InputError) -> None:
        failures.append(ScoreFailure(ref.name, suites[k].name, f"model {ref.name}, {error}"))
        progress.skip(len(suites[k]) - generated[k])
        failed[k] = True

    with _generator(folder, ref.name, device, backend, pick_threads, tensors) as (tokenizer, generate):
        progress.report(f"generating with {ref.name}")
        progress.start_model()
        for group in suite_passes(suites, pooled):
            for k in group:
                if any(f.suite == suites[k].name for f in failures):  # failed with an earlier model
                    progress.skip(len(suites[k]))
                    failed[k] = True
            group = [k for k in group if not failed[k]]
            if not group:
                continue
            owners: list[tuple[int, int]] = []  # pooled prompt -> (suite, example)
            prompts: list[list[int]] = []
            for k in group:
                ids = prompt_ids(tokenizer, suites[k], ref.name)
                prompts += ids
                owners += [(k, i) for i in range(len(ids))]
            named = ", ".join(repr(suites[k].name) for k in group)
            where = f"model {ref.name}, suite{'s' * (len(group) > 1)} {named}"
            # a batch is scored while the next one is generated: its rewards are collected after that
            pending: list[tuple[int, list[int], Callable[[], list[float]]]] = []
            batches = generate(prompts, suites[group[0]].max_new_tokens, batch_size, progress.reporter, where)
            for batch in itertools.chain(batches, [None]):
                for k, indices, receive in pending:
                    if not failed[k]:
                        try:
                            for i, reward in zip(indices, receive()):
                                rewards[k][i] = reward
                        except InputError as e:  # the scorer failed (its code, its limit or its process)
                            fail(k, e)
                pending = []
                if batch is None or all(failed[k] for k in group):
                    break
                rows, outputs, tokens = batch
                by_suite: dict[int, tuple[list[int], list[str]]] = {}
                for row, text in zip(rows, outputs):
                    k, i = owners[row]
                    if not failed[k]:
                        texts[k][i] = text
                        by_suite.setdefault(k, ([], []))[0].append(i)
                        by_suite[k][1].append(text)
                counted = sum(len(indices) for indices, _ in by_suite.values())
                progress.batch(ref.name, ", ".join(suites[k].name for k in by_suite), counted, tokens)
                for k, (indices, outputs_k) in by_suite.items():
                    generated[k] += len(indices)
                    try:
                        pending.append((k, indices, scorers[k].submit(suites[k], outputs_k, indices)))
                    except InputError as e:
                        fail(k, e)
        del tokenizer, generate
    return texts, [None if failed[k] else rewards[k] for k in range(len(suites))]


Generate = Callable[[list[list[int]], int, int, Reporter, str], Iterator[tuple[list[int], list[str], int]]]


@contextlib.contextmanager
def _generator(
    folder: Path, name: str, device: torch.device, backend: str, pick_threads: bool, tensors: Tensors = None
) -> Iterator[tuple[Any, Generate]]:
    """The model's tokenizer and its greedy generation ``generate(prompts, max_new_tokens, batch_size, reporter,
    where)`` through ``backend``: transformers (the model loaded here, ``_generate``; ``pick_threads``: with
    ``model_threads``' choice) or vLLM (``vllm_backend``, the same prompts, stop tokens and decoding)."""
    if backend == vllm_backend.VLLM:
        tokenizer = load_tokenizer(folder, name)
        stops = stop_token_ids(_configs(folder, name), tokenizer)
        with vllm_backend.engine(folder, name) as llm:

            def generate_vllm(
                prompts: list[list[int]], max_new_tokens: int, batch_size: int, reporter: Reporter, where: str
            ) -> Iterator[tuple[list[int], list[str], int]]:
                for indices, rows in vllm_backend.generate(
                    llm, stops, prompts, max_new_tokens, batch_size, reporter, where
                ):
                    yield indices, *completions(tokenizer, rows, stops)

            yield tokenizer, generate_vllm
        return
    with (
        _loaded(folder, name, device, tensors) as (model, tokenizer),
        _torch_threads(model_threads(model, device) if pick_threads else None),
    ):

        def generate(
            prompts: list[list[int]], max_new_tokens: int, batch_size: int, reporter: Reporter, where: str
        ) -> Iterator[tuple[list[int], list[str], int]]:
            return _generate(model, tokenizer, prompts, max_new_tokens, batch_size, device, reporter, where)

        yield tokenizer, generate


def _configs(folder: Path, name: str) -> Any:
    """The model's config and generation config as transformers reads them (for ``stop_token_ids``), without
    loading its weights: the generation config from the model config where the folder has none, as
    transformers does."""
    from transformers import AutoConfig, GenerationConfig

    with _quiet_transformers():
        try:
            config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
        except Exception as e:  # noqa: BLE001  whatever transformers raises, the model is named
            raise InputError(
                f"model {name} ({folder}): transformers cannot read its config ({first_line(e)})"
            ) from None
        try:
            generation = GenerationConfig.from_pretrained(folder)
        except OSError:
            generation = GenerationConfig.from_model_config(config)
    return types.SimpleNamespace(config=config, generation_config=generation)


def require_transformers() -> None:
    """Evaluation runs on transformers (the ``eval`` extra); say so instead of a bare ImportError."""
    try:
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise InputError(
            f"evaluation needs transformers and tokenizers ({e}); install them with pip install 'ram-desktop[eval]'"
        ) from None


def versions(backend: str = vllm_backend.TRANSFORMERS) -> dict[str, str]:
    import tokenizers
    import transformers

    engine = {"vllm": vllm_backend.version()} if backend == vllm_backend.VLLM else {}
    return {
        **engine,
        "ram_desktop": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "python": platform.python_version(),
    }


def _in_memory(ref: ModelRef, folder: Path) -> tuple[ModelRef, Path, str]:
    """A model held in memory as ``_resolve`` gives a folder: its frame checked as a model folder would be."""
    check_loadable(folder, ref.name)
    return ref, folder, f"{ref.name} (in memory)"


def _resolve(ref: ModelRef, reporter: Reporter) -> tuple[ModelRef, Path, str]:
    """The model's local folder (a Hub id is downloaded into the Hugging Face cache) and how results
    name its source, after checking it is something ``transformers`` may load without remote code."""
    ckpt = open_checkpoint(ref.source, reporter)
    if not ckpt.path.is_dir():
        raise InputError(
            f"{ref.source}: evaluation needs a model folder (config.json, tokenizer and weights), "
            f"not a single weights file"
        )
    check_loadable(ckpt.path, ref.name)
    return ref, ckpt.path, ckpt.display


def _refuse_special_files(folder: Path, where: str) -> None:
    """transformers opens the folder's files itself (tokenizer, generation config, chat template, weights):
    a FIFO, socket or device among them would block it or fail deep inside it. Folders and dangling links
    are left alone (transformers reads neither)."""
    for item in sorted(folder.iterdir()):
        if item.is_dir() or not item.exists():
            continue
        try:
            check_regular(item)
        except InputError as e:
            raise InputError(f"{where}: {e}") from None


def _read_json(file: Path, where: str) -> Any:
    """A model folder's JSON file through ``safe_read`` (regular file, UTF-8, no repeated keys, bounded
    nesting); its errors prefixed with the model."""
    try:
        return read_json(file)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def check_loadable(folder: Path, name: str) -> None:
    """Refuse, before loading anything, a model folder that ``transformers`` cannot load without
    running the repository's own code: no config.json, an unknown model type, an ``auto_map``."""
    from transformers import CONFIG_MAPPING

    where = f"model {name} ({folder})"
    _refuse_special_files(folder, where)
    config_file = folder / "config.json"
    if not config_file.exists():
        raise InputError(f"{where}: no config.json; transformers needs it to load the model")
    config = _read_json(config_file, where)
    if not isinstance(config, dict):
        raise InputError(f"{where}: config.json is not a JSON object")
    model_type = config.get("model_type")
    known = isinstance(model_type, str) and model_type in CONFIG_MAPPING
    if not known and "auto_map" in config:
        raise InputError(
            f"{where}: needs the code in its own repository (config.json has auto_map and model type "
            f"{model_type!r}, which transformers does not know); evaluation never runs a model's own "
            f"code (trust_remote_code)"
        )
    if not known:
        raise InputError(
            f"{where}: transformers does not know the model type {model_type!r} in config.json; it cannot be loaded"
        )
    if not any((folder / f).is_file() for f in TOKENIZER_FILES) and not any(folder.glob("*.tiktoken")):
        raise InputError(
            f"{where}: no tokenizer ({', '.join(TOKENIZER_FILES[:3])} ...); evaluation needs the "
            f"model's tokenizer: copy the base model's tokenizer files into the folder"
        )
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.exists():
        tok = _read_json(tokenizer_config, where)
        if isinstance(tok, dict) and "auto_map" in tok and not _known_tokenizer_class(tok.get("tokenizer_class")):
            raise InputError(
                f"{where}: its tokenizer needs the code in its own repository (tokenizer_config.json "
                f"has auto_map and tokenizer class {tok.get('tokenizer_class')!r}); evaluation never "
                f"runs a model's own code (trust_remote_code)"
            )


def _known_tokenizer_class(name: Any) -> bool:
    if not isinstance(name, str):
        return False
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    return any(tokenizer_class_from_name(n) is not None for n in (name, name.removesuffix("Fast")))


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' own progress bars and warnings would interleave with the faces' progress."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def load_model(
    folder: Path, name: str, device: torch.device, dtype: torch.dtype, tensors: Tensors = None
) -> tuple[Any, Any]:
    """The causal LM of ``folder`` (in ``dtype``, eval mode, on ``device``) and its tokenizer, through
    transformers, never with the repository's own code; every failure is an ``InputError`` naming the
    model. Evaluation and the Fisher estimate both load models this way. ``tensors``: the weights, held in
    memory (by name, as the folder's safetensors would hold them), handed to transformers' own loading in place
    of the files it reads (the same conversion to ``dtype``, tied weights and checks); the config and
    generation config are still the folder's."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    where = f"model {name} ({folder})"
    tokenizer = load_tokenizer(folder, name)
    with _quiet_transformers():
        try:
            # mismatched shapes are loaded and then refused below, with the tensor and both shapes named
            # transformers annotates the return as the model alone; output_loading_info=True gives (model, info)
            kwargs: dict[str, Any] = {
                "dtype": dtype,
                "trust_remote_code": False,
                "ignore_mismatched_sizes": True,
                "output_loading_info": True,
            }
            if tensors is None:
                loaded: tuple[Any, dict[str, Any]] = AutoModelForCausalLM.from_pretrained(  # type: ignore[assignment]
                    folder, **kwargs
                )
            else:
                config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
                # the class AutoModelForCausalLM picks for a folder of this config; loaded with no folder
                model_class: Any = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
                loaded = model_class.from_pretrained(None, config=config, state_dict=dict(tensors), **kwargs)
            model, info = loaded
            if tensors is not None and (folder / "generation_config.json").is_file():
                model.generation_config = GenerationConfig.from_pretrained(folder)  # what a folder's load reads
        except Exception as e:  # noqa: BLE001  whatever transformers raises, the model is named (docs/evaluate.md)
            raise InputError(
                f"{where}: transformers cannot load it as a causal language model ({type(e).__name__}: {first_line(e)})"
            ) from None
    _check_loading_info(info, where)
    model.to(device)
    model.eval()
    return model, tokenizer


def load_tokenizer(folder: Path, name: str) -> Any:
    """The tokenizer of ``folder`` through transformers (the one the folder declares, ``_as_declared``), never
    with the repository's own code; a failure is an ``InputError`` naming the model."""
    from transformers import AutoTokenizer

    where = f"model {name} ({folder})"
    with _quiet_transformers():
        try:
            return _as_declared(folder, AutoTokenizer.from_pretrained(folder, trust_remote_code=False), where)
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001  whatever transformers raises, the model is named (docs/evaluate.md)
            raise InputError(
                f"{where}: transformers cannot load its tokenizer ({type(e).__name__}: {first_line(e)})"
            ) from None


@contextlib.contextmanager
def _loaded(folder: Path, name: str, device: torch.device, tensors: Tensors = None) -> Iterator[tuple[Any, Any]]:
    """The model for generation (bf16 on CUDA, float32 on CPU) and its tokenizer; freed on exit."""
    model = None
    try:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model, tokenizer = load_model(folder, name, device, dtype, tensors)
        yield model, tokenizer
    finally:
        del model  # the caller drops its own references; evaluate() collects once _complete returns


GENERIC_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")
PROBE_TEXT = "The agent calls a tool: search('weather', 42) -> 3.14\n\n  Done! It's DONE. é 中 #7"


def _as_declared(folder: Path, tokenizer: Any, where: str) -> Any:
    """The tokenizer the folder declares when transformers substituted another that encodes differently.

    transformers 5 loads any tokenizer of a model type it knows (e.g. ``qwen2``) with that type's own
    class, which rebuilds the normalizer and pre-tokenizer instead of reading them from
    ``tokenizer.json``. When ``tokenizer_config.json`` declares the generic class (the file as written)
    and the substitute encodes a probe text differently, the file as written is used, with a warning.
    """
    from transformers import PreTrainedTokenizerFast

    if type(tokenizer).__name__ in GENERIC_TOKENIZERS or not (folder / "tokenizer.json").is_file():
        return tokenizer
    try:
        declared = read_json(folder / "tokenizer_config.json").get("tokenizer_class")
    except (InputError, AttributeError):  # read and checked by check_loadable before; absent or not an object here
        return tokenizer
    if declared not in GENERIC_TOKENIZERS:
        return tokenizer
    as_written = PreTrainedTokenizerFast.from_pretrained(folder)
    if (
        as_written(PROBE_TEXT, add_special_tokens=False)["input_ids"]
        == tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    ):
        return tokenizer
    log.warning(
        "%s: transformers would load the tokenizer as %s, which encodes differently from the folder's "
        "tokenizer.json; using tokenizer.json as written (tokenizer_config.json declares %s)",
        where,
        type(tokenizer).__name__,
        declared,
    )
    return as_written


def _check_loading_info(info: dict[str, Any], where: str) -> None:
    """transformers fills weights the checkpoint lacks (or has in another shape) with random values and
    only logs it; an evaluation of such a model would be meaningless, so it is refused."""
    mismatched = sorted(info.get("mismatched_keys") or [], key=lambda item: item[0])
    if mismatched:
        name, stored, expected = mismatched[0]
        raise InputError(
            f"{where}: tensor {name} has shape {list(stored)} in the checkpoint but config.json "
            f"implies {list(expected)} ({len(mismatched)} tensor(s) differ); the weights do not match "
            f"the config"
        )
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise InputError(
            f"{where}: the checkpoint lacks {', '.join(missing[:5])}{more}, which config.json's "
            f"model needs; transformers would fill them with random values"
        )


def use_chat_template(tokenizer: Any, suite: Suite, model_name: str) -> bool:
    """Whether ``suite``'s prompts go through ``tokenizer``'s chat template."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if suite.chat_template == "true" and not has_template:
        raise InputError(
            f"suite {suite.name!r} asks for the chat template (chat_template: true) but the tokenizer "
            f"of model {model_name} has none; set chat_template: auto or false in "
            f"{suite.config_file or 'suite.yaml'}"
        )
    return suite.chat_template == "true" or (suite.chat_template == "auto" and has_template)


def prompt_ids(tokenizer: Any, suite: Suite, model_name: str) -> list[list[int]]:
    """The token ids of every prompt of ``suite`` as ``model_name``'s tokenizer sees it."""
    if use_chat_template(tokenizer, suite, model_name):
        system = [{"role": "system", "content": suite.system}] if suite.system else []
        try:
            texts = [
                tokenizer.apply_chat_template(
                    system + [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
                )
                for p in suite.prompts
            ]
        except Exception as e:  # noqa: BLE001  the template is the model's own Jinja code: any failure is named
            raise InputError(
                f"model {model_name}: its chat template failed on suite {suite.name!r} "
                f"({type(e).__name__}: {first_line(e)})"
            ) from None
        encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    else:
        texts = [f"{suite.system}\n\n{p}" if suite.system else p for p in suite.prompts]
        encoded = [tokenizer(t)["input_ids"] for t in texts]
    for ids, line in zip(encoded, suite.lines):
        if not ids:
            raise InputError(
                f"{suite.data_file}, line {line}: the prompt gives no tokens with the tokenizer of model {model_name}"
            )
    return [list(ids) for ids in encoded]


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every end-of-sequence id named by the generation config, the model config and the tokenizer."""
    ids: list[int] = []
    for value in (
        getattr(model.generation_config, "eos_token_id", None),
        getattr(model.config, "eos_token_id", None),
        tokenizer.eos_token_id,
    ):
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and v not in ids:
                ids.append(v)
    return ids


def _generate(
    model: Any,
    tokenizer: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int,
    device: torch.device,
    reporter: Reporter,
    where: str,
) -> Iterator[tuple[list[int], list[str], int]]:
    """Greedy completions in batches: yields (example indices, completion texts, generated tokens)."""
    from transformers import GenerationConfig

    stops = stop_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops[0] if stops else 0)
    config = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        eos_token_id=stops or None,
        pad_token_id=pad,
        bos_token_id=getattr(model.generation_config, "bos_token_id", None),
    )
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    for first in range(0, len(order), batch_size):
        reporter.check()
        indices = order[first : first + batch_size]
        width = max(len(prompts[i]) for i in indices)
        input_ids = torch.full((len(indices), width), pad, dtype=torch.long)
        attention = torch.zeros((len(indices), width), dtype=torch.long)
        for row, i in enumerate(indices):
            ids = prompts[i]
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids) :] = 1
        try:
            with torch.inference_mode(), _quiet_transformers():
                output = model.generate(
                    input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config
                )
        except torch.OutOfMemoryError:
            raise InputError(
                f"{where}: out of memory generating a batch of {len(indices)} prompts of up to "
                f"{width} tokens on {device}; use a smaller --batch-size"
            ) from None
        except (RuntimeError, ValueError, IndexError) as e:
            raise InputError(f"{where}: generation failed ({type(e).__name__}: {first_line(e)})") from None
        yield indices, *completions(tokenizer, output[:, width:].tolist(), stops)


def completions(tokenizer: Any, rows: list[list[int]], stops: list[int]) -> tuple[list[str], int]:
    """Each row of generated token ids decoded up to its first end-of-sequence token, and the tokens generated
    (that token counted: it was generated too); both backends decode so."""
    texts, tokens = [], 0
    for row in rows:
        stop = next((k for k, t in enumerate(row) if t in stops), None)
        tokens += len(row) if stop is None else stop + 1
        texts.append(tokenizer.decode(row[:stop], skip_special_tokens=True))
    return texts, tokens
