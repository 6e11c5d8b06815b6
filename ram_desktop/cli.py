"""``ram-merge``: the headless face of the core. Progress on stderr, exit 0 / 2 (bad input) / 130 (cancelled)."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .core import (
    METHODS,
    OUT_DTYPES,
    SEARCH_METHODS,
    VOCAB_MODES,
    Cancelled,
    DeviceOutOfMemory,
    InputError,
    Param,
    ProgressEvent,
    Reporter,
    defaults,
)

if TYPE_CHECKING:
    from .core import MergeMethod

EXIT_OK, EXIT_BUG, EXIT_INPUT, EXIT_CANCELLED = 0, 1, 2, 130
log = logging.getLogger("ram_desktop")


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line and exit 2 through ``main``."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def method_flags() -> dict[str, list[tuple[str, Param]]]:
    """Every parameter by name (its recipe key), with the methods that take it (methods share parameters such
    as --scale); a parameter's flag is the same in every method that takes it."""
    flags: dict[str, list[tuple[str, Param]]] = {}
    for name, method in METHODS.items():
        for p in method.params:
            flags.setdefault(p.name, []).append((name, p))
    for name, takers in flags.items():
        if len({p.flag for _, p in takers}) > 1:
            raise RuntimeError(f"parameter {name} has different flags in {', '.join(m for m, _ in takers)}")
    return flags


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ram-merge", description="Merge RL-trained agent checkpoints with RAM / RAM+ and baselines.")
    parser.add_argument("--version", action="version", version=f"ram-merge {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar or log lines")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def sources(p: argparse.ArgumentParser, or_recipe: bool = False) -> None:
        """BASE AGENT... and the flags of the inputs; ``or_recipe``: optional, the spec may come from --recipe
        instead (the flags then default to None, so that one given beside a recipe is seen and refused)."""
        if or_recipe:
            p.add_argument("base", nargs="?", help="base model: folder, .safetensors file, or Hub id org/name[@rev]")
            p.add_argument("agents", nargs="*", help="agent checkpoints fine-tuned from the base")
        else:
            p.add_argument("base", help="base model: folder, .safetensors file, or Hub id org/name[@rev]")
            p.add_argument("agents", nargs="+", help="agent checkpoints fine-tuned from the base")
        p.add_argument("--names", help="comma-separated agent names (default: folder names)")
        p.add_argument(
            "--eps",
            type=float,
            default=None if or_recipe else defaults.EPS,
            help=f"update threshold ε (default {defaults.EPS:g})",
        )
        p.add_argument(
            "--device",
            default=None if or_recipe else defaults.DEVICE,
            help="auto, cpu, cuda or cuda:N (default auto" + (", or the recipe's)" if or_recipe else ")"),
        )
        p.add_argument(
            "--vocab",
            default=None if or_recipe else defaults.VOCAB,
            choices=list(VOCAB_MODES),
            help="vocabulary-size differences between base and agents: exact (default) refuses them; "
            "common merges the shared rows and keeps the base's rows for the rest",
        )

    p = sub.add_parser("probe", help="measure task-vector density and overlap")
    sources(p)
    p.add_argument("--json", type=Path, help="write the ram-probe/1 report (with the method advice) to this file")
    p.add_argument(
        "--out-dtype",
        default="bfloat16",
        choices=["bfloat16", "float16", "float32"],
        help="the output precision the advice reads RAM+'s rescale survival for (default bfloat16)",
    )

    p = sub.add_parser(
        "merge",
        help="merge agents into one model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_methods_epilog(),
    )
    sources(p)
    p.add_argument("--out", type=Path, required=True, help="output folder (must not exist or be empty)")
    p.add_argument(
        "--method", default=defaults.METHOD, choices=list(METHODS), help=f"merge method (default {defaults.METHOD})"
    )
    merge_options(p)

    p = sub.add_parser(
        "compare",
        help="merge several variants from one read of the inputs, then score them",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_methods_epilog(),
    )
    sources(p)
    p.add_argument("--out", type=Path, required=True, help="folder for one output folder per variant and compare.json")
    p.add_argument(
        "--variant",
        action="append",
        required=True,
        metavar="SPEC",
        help="METHOD or METHOD:key=value,...[,name=NAME], e.g. ram-plus:r=0.2,alpha=1.0 (repeat)",
    )
    suite_option(p, "evaluate base, agents and variants on these suites; see ram-merge eval", required=False)
    include_path_option(p)
    p.add_argument("--limit", type=int, help="with --suite: only the first N examples of each suite")
    p.add_argument("--batch-size", type=int, default=8, help="with --suite: prompts generated together (default 8)")
    backend_option(p)
    scorer_timeout_option(p)
    merge_options(p, "shared defaults for every variant whose method takes them; ")

    p = sub.add_parser(
        "search", help="search methods and parameters for the best merge on validation suites (Optuna), then test it"
    )
    sources(p, or_recipe=True)
    p.add_argument(
        "--recipe",
        type=Path,
        metavar="FILE",
        help="start from a ram-recipe.yaml or a mergekit YAML (read as ram-merge run reads it) instead of BASE "
        "AGENT...: every trial keeps its tokenizer, chat template, layer map, dtype and names; its method and "
        "parameters are the first trial",
    )
    suite_option(p, "validation suites")
    include_path_option(p)
    p.add_argument(
        "--test-suite", nargs="+", action="extend", default=[], metavar="SUITE", help="test suites for the best merge"
    )
    p.add_argument(
        "--trials", type=int, required=True, help="trials to complete (a rerun with the same --out continues)"
    )
    p.add_argument("--out", type=Path, required=True, help="folder for study.db, search.json and best/")
    p.add_argument(
        "--methods",
        help="comma-separated methods to try (default: "
        + ",".join(SEARCH_METHODS)
        + ", with --recipe its method first)",
    )
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    p.add_argument("--workers", type=int, default=1, help="trials run at once (default 1)")
    p.add_argument("--ray", metavar="ADDRESS", help="run trials as Ray tasks: a cluster address, or local")
    p.add_argument("--out-dtype", choices=list(OUT_DTYPES), help="output dtype (default: the base's)")
    p.add_argument("--limit", type=int, help="only the first N examples of each suite")
    p.add_argument("--batch-size", type=int, default=32, help="prompts generated together (default 32)")
    backend_option(p)
    calibration_options(p)

    p = sub.add_parser("run", help="run a ram-recipe.yaml or a mergekit YAML whose method RAM Desktop has")
    p.add_argument("recipe", type=Path)
    p.add_argument("--out", type=Path, help="output folder (default: the recipe's)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")

    p = sub.add_parser(
        "demo", help="write the built-in demo: base, three RL-trained agents, their test suites, demo.json"
    )
    p.add_argument("dir", type=Path)

    p = sub.add_parser("fisher", help="estimate an agent's diagonal Fisher information on its calibration suite")
    p.add_argument("agent", help="agent model folder (Hugging Face layout) or Hub id org/name[@rev]")
    suite_option(p, "calibration suite (JSONL file or suite folder); one")
    p.add_argument("--out", type=Path, required=True, help="output folder for fisher.safetensors and fisher.json")
    p.add_argument("--examples", type=int, default=256, help="calibration examples (default 256; paper 256-2048)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--shard-size", default="5GB", help="largest Fisher shard (default 5GB)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")

    p = sub.add_parser("export-mergekit", help="write the closest mergekit YAML for a recipe, differences as comments")
    p.add_argument("recipe", type=Path)
    p.add_argument("--out", type=Path, help="file to write (default: stdout)")

    p = sub.add_parser("publish", help="upload a merged output folder to a new Hugging Face Hub repository")
    p.add_argument("dir", type=Path, help="the output folder of a merge (with its README.md model card)")
    p.add_argument("repo_id", metavar="org/name")
    p.add_argument("--private", action="store_true", help="create the repository private")

    p = sub.add_parser("eval", help="score models on evaluation suites (greedy generation with transformers or vLLM)")
    p.add_argument("models", nargs="+", help="model folders (Hugging Face layout) or Hub ids org/name[@rev]")
    suite_option(p, "JSONL file (optionally beside a suite.yaml), folder with data.jsonl + suite.yaml, or lm-eval:TASK")
    p.add_argument("--names", help="comma-separated model names (default: folder names)")
    p.add_argument(
        "--json",
        type=Path,
        help="write the ram-eval/2 results (scores, per-example rewards, intervals, floors) to this file",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--limit", type=int, help="evaluate only the first N examples of each suite")
    p.add_argument("--batch-size", type=int, default=8, help="prompts generated together (default 8)")
    backend_option(p)
    scorer_timeout_option(p)
    include_path_option(p)
    return parser


def scorer_timeout_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scorer-timeout",
        type=float,
        metavar="SECONDS",
        help="time a python scorer may take per batch, for every suite (default: the suite.yaml's scorer_timeout, "
        "else 60); a scorer that runs longer is stopped and reported",
    )


def backend_option(p: argparse.ArgumentParser) -> None:
    """``--backend``: what generates the completions (docs/evaluate.md, Backends)."""
    p.add_argument(
        "--backend",
        default="transformers",
        choices=("transformers", "vllm"),
        help="generate with transformers (default) or with vLLM 0.33 on a CUDA GPU (the [vllm] extra)",
    )


def include_path_option(p: argparse.ArgumentParser) -> None:
    """``--include-path DIR``: folders of lm-eval task YAMLs of one's own, for ``--suite lm-eval:TASK``."""
    p.add_argument(
        "--include-path",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="a folder of lm-eval task YAMLs, for --suite lm-eval:TASK (lm-eval's own --include_path); repeatable",
    )


def suite_option(p: argparse.ArgumentParser, help: str, required: bool = True) -> None:
    """``--suite``, one grammar in every subcommand: ``--suite A B`` and ``--suite A --suite B`` alike."""
    p.add_argument(
        "--suite",
        nargs="+",
        action="extend",
        required=required,
        default=[],
        metavar="SUITE",
        help=help + " (--suite A B or --suite A --suite B)",
    )


def check_suites(suites: list[str], most: int | None = None) -> list[str]:
    """``--suite`` values: a comma-separated list (another grammar) or more than ``most`` is refused."""
    for text in suites:
        if "," in text and not Path(text).expanduser().exists():
            raise InputError(
                f"--suite {text}: no such suite; separate suites with spaces (--suite A B) or repeat --suite"
            )
    if most is not None and len(suites) > most:
        raise InputError(f"--suite takes {most} suite here, got {len(suites)} ({' '.join(suites)})")
    return suites


def merge_options(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """The flags ``merge`` and ``compare`` share: every method parameter (from the schemas), output dtype,
    shard size, overwrite. A method parameter never shares a flag with a subcommand's own option (the schema
    renames it: ``Param.flag_name``)."""
    for name, takers in method_flags().items():
        first = takers[0][1]
        if first.flag in p._option_string_actions:
            raise RuntimeError(f"method parameter {name} clashes with {p.prog}'s own {first.flag}; give it a flag_name")
        by_text: dict[str, list[str]] = {}
        for method_name, prm in takers:
            by_text.setdefault(prm.describe(), []).append(method_name)
        text = prefix + " | ".join(f"{', '.join(ms)}: {d}" for d, ms in by_text.items())
        shown = (first.flag_name or name).upper()
        metavar = f"{shown},..." if first.per_agent else shown
        # per-agent lists and true/false may arrive as text: the method's Param validates them
        loose = any(prm.per_agent or prm.kind is bool for _, prm in takers)
        kind = _loose(first.kind) if loose else first.kind
        p.add_argument(
            first.flag,
            dest=f"param_{name}",
            metavar=metavar,
            type=kind,
            default=None,
            choices=first.choices or None,
            help=text,
        )
    p.add_argument(
        "--out-dtype", default=defaults.OUT_DTYPE, choices=list(OUT_DTYPES), help="output dtype (default: the base's)"
    )
    p.add_argument(
        "--shard-size", default=defaults.SHARD_SIZE, help=f"largest output shard (default {defaults.SHARD_SIZE})"
    )
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    p.add_argument(
        "--tokenizer-source",
        metavar="base|union|model:NAME",
        help="build the output's vocabulary as mergekit does (default: copy the base's tokenizer files); "
        "union adds every agent's tokens, model:NAME takes that agent's (or base's) tokenizer",
    )
    p.add_argument(
        "--chat-template",
        metavar="NAME|FILE",
        help="the output tokenizer's chat template: auto, chatml, llama3, alpaca, mistral, exaone, or a Jinja file",
    )


def calibration_options(p: argparse.ArgumentParser) -> None:
    """``search``'s flags for the calibrated methods' calibration, as ``merge`` has them (``--fisher-suite``,
    ``--examples``, ``--fisher``): given, Fisher merging is searched too, each agent calibrated once."""
    for name, method in METHODS.items():
        for prm in method.params:
            if prm.name not in method.interop.calibration:
                continue
            shown = (prm.flag_name or prm.name).upper()
            p.add_argument(
                prm.flag,
                dest=f"param_{prm.name}",
                metavar=f"{shown},..." if prm.per_agent else shown,
                type=_loose(prm.kind) if prm.per_agent else prm.kind,
                default=None,
                help=f"{name}: {prm.describe()}; given, {name} is searched too",
            )


def _tokenizer_args(args: argparse.Namespace) -> dict[str, Any]:
    """``--tokenizer-source`` and ``--chat-template`` as the spec's ``tokenizer`` and ``chat_template``."""
    from .core import read_chat_template, read_tokenizer_source

    out: dict[str, Any] = {}
    if getattr(args, "tokenizer_source", None) is not None:
        out["tokenizer"] = {"source": read_tokenizer_source("--tokenizer-source", args.tokenizer_source)}
    template = getattr(args, "chat_template", None)
    if template is not None:
        path = Path(template).expanduser()
        if path.is_file():
            from .core.storage.safe_read import read_text

            template = read_text(path)
        out["chat_template"] = read_chat_template("--chat-template", template)
    return out


def _loose(kind: type) -> Callable[[str], Any]:
    """A flag's value as ``kind`` where it reads as one, else the text (a comma-separated per-agent list,
    true/false), which the method's ``Param`` then validates."""

    def convert(text: str) -> Any:
        if kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                return text
        return text

    return convert


def _methods_epilog() -> str:
    lines = ["methods:"]
    for name, m in METHODS.items():
        lines.append(f"  {name:16s} {m.summary}")
        for p in m.params:
            lines.append(f"  {'':16s}   {p.flag}: {p.describe()}")
    return "\n".join(lines)


class _ProgressBar:
    """Turns core progress events into one tqdm bar per stage, on stderr."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bars: dict[str, object] = {}

    def __call__(self, event: ProgressEvent) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        bar = self.bars.get(event.stage)
        if bar is None:
            bar = tqdm(
                total=event.total,
                desc=event.stage,
                unit={"B": "B", "examples": "ex", "trials": " trials"}.get(event.unit, "el"),
                unit_scale=event.unit not in ("examples", "trials"),
                file=sys.stderr,
                leave=True,
                dynamic_ncols=True,
            )
            self.bars[event.stage] = bar
        if event.total != bar.total:  # type: ignore[attr-defined]
            bar.total = event.total  # type: ignore[attr-defined]  # a download's total grows as files are listed
        if event.detail:
            bar.set_postfix_str(event.detail, refresh=False)  # type: ignore[attr-defined]
        bar.update(event.done - bar.n)  # type: ignore[attr-defined]

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        print(f"error: {e} (see ram-merge --help)", file=sys.stderr)
        return EXIT_INPUT
    _setup_logging(args.quiet)
    bar = _ProgressBar(not args.quiet and args.command != "demo")
    reporter = Reporter(bar)
    try:
        return _dispatch(args, reporter)
    except (InputError, DeviceOutOfMemory) as e:  # a GPU out of memory: one line too, with what to try
        bar.close()
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INPUT
    except (Cancelled, KeyboardInterrupt):
        bar.close()
        print("error: cancelled; nothing was written", file=sys.stderr)
        return EXIT_CANCELLED
    except OSError as e:  # disk full after the check, read-only or unwritable location, an unreadable file
        bar.close()
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        return EXIT_INPUT
    finally:
        bar.close()


def os_error_line(error: OSError) -> str:
    """One line for an OS error: the path(s) it names and its cause; staging has been removed by then."""
    where = " -> ".join(str(f) for f in (error.filename, error.filename2) if f is not None)
    cause = error.strerror or str(error) or error.__class__.__name__
    return f"{where}: {cause}; nothing was written" if where else f"{cause}; nothing was written"


def _cancel_on_signal(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cancel_on_termination() -> None:
    """SIGTERM and SIGHUP cancel like Ctrl-C: staging removed, exit 130 (the default would kill the process
    and leave its staging folder behind). A signal the parent set to be ignored stays ignored: ``nohup
    ram-merge ...`` must survive the terminal closing."""
    import signal

    for name in ("SIGTERM", "SIGHUP"):
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) is not signal.SIG_IGN:  # nohup: stays ignored
            signal.signal(number, _cancel_on_signal)


def _setup_logging(quiet: bool) -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.ERROR if quiet else logging.INFO)


def _dispatch(args: argparse.Namespace, reporter: Reporter) -> int:
    from . import workflow
    from .core import MergeSpec, RunOptions, advise, get_method

    if args.command == "demo":
        from .core import read_manifest, write_demo

        base, agents = write_demo(args.dir)
        print(f"demo base: {base}")
        for a in read_manifest(args.dir)["agents"]:
            print(f"demo agent: {a['path']}  (suite {a['suite']})")
        print(f"try: ram-merge merge {base} {' '.join(map(str, agents))} --out {Path(args.dir) / 'merged'}")
        return EXIT_OK
    if args.command == "eval":
        return _eval(args, reporter)
    if args.command == "fisher":
        return _fisher(args, reporter)
    if args.command == "compare":
        return _compare(args, reporter)
    if args.command == "search":
        return _search(args, reporter)
    if args.command == "probe":
        report = workflow.analyse(spec_from_args(args), reporter=reporter)
        advice = advise(report, args.out_dtype)
        if args.json:
            try:
                args.json.write_text(json.dumps({**report.to_json(), "advice": advice.to_json()}, indent=1) + "\n")
            except OSError as e:
                raise InputError(f"{args.json}: cannot write ({e.strerror})") from None
        print(format_probe(report))
        print(advice.text())
        return EXIT_OK
    if args.command == "merge":
        spec = spec_from_args(args)
    elif args.command == "export-mergekit":
        from .core import to_mergekit

        text = to_mergekit(MergeSpec.load(args.recipe))
        if args.out is None:
            sys.stdout.write(text)
        else:
            try:
                args.out.write_text(text, encoding="utf-8")
            except OSError as e:
                raise InputError(f"{args.out}: cannot write ({e.strerror})") from None
        return EXIT_OK
    elif args.command == "publish":
        from .core import publish

        print(f"published: {publish(args.dir, args.repo_id, private=args.private, reporter=reporter).url}")
        return EXIT_OK
    else:
        spec = load_recipe(args.recipe)
        spec = spec if args.out is None else spec.replace(output=str(args.out))
    result = workflow.merge(spec, RunOptions(overwrite=args.overwrite), reporter)
    table = format_probe(result.probe, result.lambdas, [get_method(spec.method)])
    if table:
        print(table)
    print(f"merged model written to {result.out} ({result.bytes_written / 1e6:.1f} MB, {result.seconds:.1f} s)")
    return EXIT_OK


def load_recipe(path: Path) -> Any:
    """The ``MergeSpec`` of a ram-recipe.yaml or a mergekit YAML, as ``run`` reads it (its warnings logged)."""
    from .core import load_recipe_or_mergekit

    loaded = load_recipe_or_mergekit(path)
    for warning in loaded.warnings:
        log.warning("%s", warning)
    return loaded.spec


def spec_from_args(args: argparse.Namespace) -> Any:
    """The ``MergeSpec`` that ``probe``'s, ``merge``'s or ``compare``'s flags describe (per-agent values given in
    the order of the agents on the command line, or as NAME=VALUE,...)."""
    from .core import MergeSpec

    params = _given_params(args)
    out = getattr(args, "out", None)
    return MergeSpec.build(
        args.base,
        list(args.agents),
        str(out) if out is not None else None,
        method=getattr(args, "method", defaults.METHOD),
        params=params,
        names=_names(args.names),
        eps=args.eps,
        device=args.device,
        out_dtype=getattr(args, "out_dtype", defaults.OUT_DTYPE),
        shard_size=getattr(args, "shard_size", defaults.SHARD_SIZE),
        vocab=args.vocab,
        **_tokenizer_args(args),
    )


def _given_params(args: argparse.Namespace) -> dict[str, Any]:
    """The method parameters given as flags, by recipe key."""
    return {k[len("param_") :]: v for k, v in vars(args).items() if k.startswith("param_") and v is not None}


def _compare(args: argparse.Namespace, reporter: Reporter) -> int:
    from .core import RunOptions, Variant, get_method
    from .evaluate import ScoringFailed, load_suites
    from .workflow import COMPARE_JSON, COMPARE_PNG, compare

    variants = [Variant.parse(text) for text in args.variant]
    suites = load_suites(check_suites(args.suite), args.include_path)
    check_scorer_timeout(args)
    check_backend(args.backend, args.device)
    name_new_code(suites)
    try:
        result = compare(
            spec_from_args(args),
            variants,
            args.out,
            suites,
            RunOptions(overwrite=args.overwrite),
            reporter,
            batch_size=args.batch_size,
            limit=args.limit,
            scorer_timeout=args.scorer_timeout,
            backend=args.backend,
        )
    except ScoringFailed as e:
        print(e.result.table())
        raise ScoringFailed(e.result, f"; the finished scores are in {args.out / COMPARE_JSON}") from None
    print(format_probe(result.merges[0].probe, methods=[get_method(v.method) for v in variants]))
    for variant, merged in zip(variants, result.merges):
        print(
            f"{variant.name}: {merged.report['method']} {params_text(merged.report['method_params'])} -> {merged.out}"
        )
    if result.evaluation is not None:
        print(result.evaluation.table())
    drawn = f", {COMPARE_PNG}" if (args.out / COMPARE_PNG).exists() else ""
    print(f"compared {len(variants)} variants in {args.out} ({COMPARE_JSON}{drawn})")
    return EXIT_OK


def _search(args: argparse.Namespace, reporter: Reporter) -> int:
    from .workflow import SearchOptions, search, spec_calibration

    spec = _search_spec(args)
    calibration = _given_params(args) or None
    methods = list(SEARCH_METHODS) if args.methods is None else args.methods.split(",")
    if args.methods is None and args.recipe is not None and spec.method not in methods:
        method = METHODS.get(spec.method)
        calibration_ok = method is not None and (not method.interop.calibrated or spec_calibration(spec) is not None)
        if method is not None and not method.streaming.stacks and calibration_ok:
            methods.insert(0, spec.method)  # the recipe's method is searched too: its merge is the first trial
    if args.methods is None and calibration is not None:  # calibration given: the calibrated methods join
        methods += [n for n, m in METHODS.items() if m.interop.calibrated and n not in methods]
    options = SearchOptions(
        spec,
        check_suites(args.suite),
        check_suites(args.test_suite),
        args.out,
        args.trials,
        methods,
        args.seed,
        args.workers,
        args.ray,
        args.batch_size,
        args.limit,
        args.include_path,
        args.backend,
        calibration,
    )
    try:
        result = search(options, reporter)
    except (Cancelled, KeyboardInterrupt) as e:
        kept = str(e) or f"finished trials kept in {args.out / 'study.db'}"
        print(f"error: cancelled; {kept}", file=sys.stderr)
        return EXIT_CANCELLED
    print(format_search(result))
    return EXIT_OK


def _search_spec(args: argparse.Namespace) -> Any:
    """The whole spec ``search`` starts from: the recipe's (``--recipe FILE``, read as ``run`` reads it), or
    BASE AGENT... with the input flags; one of the two, never both."""
    from .core import MergeSpec

    if args.recipe is not None:
        if args.base is not None:
            raise InputError(
                f"search takes BASE AGENT... or --recipe FILE, not both; the recipe {args.recipe} names its sources"
            )
        flags = {"--names": args.names, "--eps": args.eps, "--vocab": args.vocab, "--out-dtype": args.out_dtype}
        flags.update((method_flags()[name][0][1].flag, value) for name, value in _given_params(args).items())
        given = [flag for flag, value in flags.items() if value is not None]
        if given:
            raise InputError(f"{given[0]} with --recipe: set it in the recipe {args.recipe}")
        spec = load_recipe(args.recipe)
        return spec if args.device is None else spec.replace(device=args.device)
    if args.base is None or not args.agents:
        raise InputError("search needs BASE AGENT... (the base and at least one agent) or --recipe FILE")
    return MergeSpec.build(
        args.base,
        list(args.agents),
        names=_names(args.names),
        eps=defaults.EPS if args.eps is None else args.eps,
        device=args.device or defaults.DEVICE,
        out_dtype=args.out_dtype or defaults.OUT_DTYPE,
        vocab=args.vocab or defaults.VOCAB,
    )


def format_search(result) -> str:
    """The best trial, the test table beside the references and the paired differences, in plain text."""
    best = result.best
    params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in best.params.items())
    lines = [
        f"{len(result.trials)} trials; best: trial {best.number}, {best.method}"
        + (f" ({params})" if params else "")
        + f", validation {best.validation:.4f} -> {result.folder / 'best'}"
    ]
    if result.test is not None:
        lines.append(f"{'test':28s} {'score':>7s}  95% interval")
        for m in result.test["models"]:
            low, high = m["test_interval"]
            lines.append(f"{m['name'][:28]:28s} {m['test']:7.4f}  [{low:.4f}, {high:.4f}]")
        for d in result.test["differences"]:
            verdict = "clearly better" if d["clearly_better"] else "not clearly better"
            lines.append(f"best - {d['versus']}: {d['difference']:+.4f} (SE {d['se']:.4f}), {verdict}")
    lines.append(f"summary: {result.folder / 'search.json'}")
    return "\n".join(lines)


def _fisher(args: argparse.Namespace, reporter: Reporter) -> int:
    from .workflow import fisher

    (suite,) = check_suites(args.suite, most=1)
    info = fisher(args.agent, suite, args.out, args.examples, args.device, reporter, args.overwrite, args.shard_size)
    print(
        f"Fisher of {info['agent']} on suite {info['suite']['name']}: {info['examples']} examples, "
        f"{info['completion_tokens']} completion tokens, {info['seconds']:.1f} s -> {args.out}"
    )
    return EXIT_OK


def _eval(args: argparse.Namespace, reporter: Reporter) -> int:
    from .evaluate import ScoringFailed, check_json_path, load_suites
    from .workflow import evaluate, model_refs

    suites = load_suites(check_suites(args.suite), args.include_path)
    models = model_refs(args.models, _names(args.names))
    if args.json:
        check_json_path(args.json)
    check_scorer_timeout(args)
    check_backend(args.backend, args.device)
    name_new_code(suites)
    try:
        result = evaluate(
            models,
            suites,
            args.device,
            args.batch_size,
            args.limit,
            reporter,
            scorer_timeout=args.scorer_timeout,
            backend=args.backend,
        )
    except ScoringFailed as e:  # bad input found mid-run: the finished scores are kept (docs/contracts.md)
        if args.json:
            e.result.write_json(args.json)
        print(e.result.table())
        raise ScoringFailed(e.result, f"; the finished scores are in {args.json}" if args.json else "") from None
    if args.json:
        result.write_json(args.json)
    print(result.table())
    return EXIT_OK


def check_backend(backend: str, device: str) -> None:
    """Refuse ``--backend vllm`` without vLLM or a CUDA GPU before any work (and before the notes on new code)."""
    from .workflow import check_backend as check

    check(backend, device)


def check_scorer_timeout(args: argparse.Namespace) -> None:
    """Refuse a bad --scorer-timeout before any work (compare merges before it evaluates)."""
    from .evaluate import check_timeout

    if args.scorer_timeout is not None:
        check_timeout(args.scorer_timeout, "--scorer-timeout")


def name_new_code(suites: list[Any]) -> None:
    """The first time a suite's python scorer runs from a folder RAM Desktop did not write, say so (one
    ``note:`` line per folder, also with --quiet: it is the user's code running with the user's rights)."""
    from .core import new_code_folders, remember_code_folders
    from .evaluate import scorer_folders

    folders = scorer_folders(suites)
    for folder in new_code_folders(folders):
        using = folders[folder]
        names = ", ".join(repr(name) for name, _ in using)
        files = ", ".join(sorted({file for _, file in using}))
        print(
            f"note: suite{'s' if len(using) > 1 else ''} {names} run{'' if len(using) > 1 else 's'} Python code "
            f"from {folder} ({files}) with your rights; RAM Desktop did not write that folder (said once per folder)",
            file=sys.stderr,
        )
    remember_code_folders(folders)


def params_text(params: dict[str, Any]) -> str:
    """Parameters as a person writes them (``r=0.2, alpha=1.0``); a per-agent list as its values, comma-separated."""
    return ", ".join(
        f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}"
        for k, v in params.items()
        if v is not None
    )


def _names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",")] if text else None


def format_probe(report, lambdas: list[float] | None = None, methods: Sequence[MergeMethod] = ()) -> str:
    """A plain table of per-agent statistics. With the methods merged: ρ (and λ) only where one of them is RAM's
    selective rule that they describe, and no table for layer stacking (no task vectors are compared)."""
    if methods and all(m.streaming.stacks for m in methods):
        return ""
    rho = not methods or any(m.analysis.selective for m in methods)
    lambdas = lambdas if rho else None
    head = f"{'agent':16s} {'density':>8s} {'unique':>12s} {'shared':>12s}" + (f" {'rho':>8s}" if rho else "")
    if lambdas:
        head += f" {'lambda':>8s}"
    lines = [f"{report.params:,} elements in {report.tensors} tensors, eps = {report.eps:g}", head]
    for t, a in enumerate(report.agents):
        line = f"{a.name[:16]:16s} {a.density:8.2%} {a.unique:12,} {a.shared:12,}"
        if rho:
            line += f" {'inf' if a.rho == float('inf') else f'{a.rho:.3f}':>8s}"
        if lambdas:
            line += f" {lambdas[t]:8.4f}"
        lines.append(line)
    return "\n".join(lines)


def entry() -> None:
    """Console-script entry point (``ram-merge``, ``python -m ram_desktop COMMAND``).

    The imports made so far are frozen out of the garbage collector's view (they live until the process
    ends), and the process ends with ``os._exit`` once the command has returned and stdout / stderr are
    flushed: every output file is closed and every worker thread joined by then, and Python's own
    teardown (torch's modules, a last full collection) would cost ~0.5 CPU-s after the work is done. An
    unexpected exception still propagates the usual way (traceback, exit 1)."""
    import multiprocessing

    multiprocessing.freeze_support()  # frozen: a spawned child (a python scorer's process) runs its task, not the CLI
    from .core.compute.runtime import activate

    state = activate()  # before torch is imported: a verified runtime folder goes ahead of the bundled torch
    if state.message and not {"-q", "--quiet"} & set(sys.argv[1:]):
        print(f"note: {state.message}", file=sys.stderr)
    gc.freeze()
    cancel_on_termination()
    try:
        code = main()
    except KeyboardInterrupt:
        print("error: cancelled; nothing was written", file=sys.stderr)
        code = EXIT_CANCELLED
    exit_now(code)


def exit_now(code: int) -> None:
    """Flush logging, stdout and stderr, then end the process at once with ``code``."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said on it
            pass
    os._exit(code)
