"""``ram-merge``: the headless face of the core. Progress on stderr, exit 0 / 2 (bad input) / 130 (cancelled)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Sequence

from . import __version__
from .core.errors import Cancelled, InputError
from .core.events import ProgressEvent, Reporter
from .core.methods import METHODS, Param
from .core.plan import OUT_DTYPES

EXIT_OK, EXIT_BUG, EXIT_INPUT, EXIT_CANCELLED = 0, 1, 2, 130
log = logging.getLogger("ram_desktop")


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line and exit 2 through ``main``."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def method_flags() -> dict[str, list[tuple[str, Param]]]:
    """Every parameter flag, with the methods that take it (methods share flags such as --scale)."""
    flags: dict[str, list[tuple[str, Param]]] = {}
    for name, method in METHODS.items():
        for p in method.params:
            flags.setdefault(p.name, []).append((name, p))
    return flags


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ram-merge", description="Merge RL-trained agent checkpoints with RAM / RAM+ and baselines.")
    parser.add_argument("--version", action="version", version=f"ram-merge {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar or log lines")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def sources(p: argparse.ArgumentParser) -> None:
        p.add_argument("base", help="base model: folder, .safetensors file, or Hub id org/name[@rev]")
        p.add_argument("agents", nargs="+", help="agent checkpoints fine-tuned from the base")
        p.add_argument("--names", help="comma-separated agent names (default: folder names)")
        p.add_argument("--eps", type=float, default=1e-5, help="update threshold ε (default 1e-5)")
        p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
        p.add_argument("--vocab", default="exact", choices=["exact", "common"],
                       help="vocabulary-size differences between base and agents: exact (default) refuses them; "
                            "common merges the shared rows and keeps the base's rows for the rest")

    p = sub.add_parser("probe", help="measure task-vector density and overlap")
    sources(p)
    p.add_argument("--json", type=Path, help="write the ram-probe/1 report to this file")

    p = sub.add_parser("merge", help="merge agents into one model", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=_methods_epilog())
    sources(p)
    p.add_argument("--out", type=Path, required=True, help="output folder (must not exist or be empty)")
    p.add_argument("--method", default="ram-plus", choices=list(METHODS), help="merge method (default ram-plus)")
    for name, takers in method_flags().items():
        first = takers[0][1]
        kwargs = {"choices": first.choices} if first.choices else {}
        by_text: dict[str, list[str]] = {}
        for method_name, prm in takers:
            by_text.setdefault(prm.describe(), []).append(method_name)
        text = " | ".join(f"{', '.join(ms)}: {d}" for d, ms in by_text.items())
        p.add_argument(first.flag, dest=f"param_{name}", metavar=name.upper(), type=first.kind, default=None,
                       help=text, **kwargs)
    p.add_argument("--out-dtype", default="base", choices=list(OUT_DTYPES), help="output dtype (default: the base's)")
    p.add_argument("--shard-size", default="5GB", help="largest output shard (default 5GB)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")

    p = sub.add_parser("run", help="run a ram-recipe.yaml")
    p.add_argument("recipe", type=Path)
    p.add_argument("--out", type=Path, help="output folder (default: the recipe's)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")

    p = sub.add_parser("demo", help="write the built-in demo: base, three RL-trained agents, their test suites, demo.json")
    p.add_argument("dir", type=Path)
    return parser


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
            bar = tqdm(total=event.total, desc=event.stage, unit="B" if event.unit == "B" else "el",
                       unit_scale=True, file=sys.stderr, leave=True, dynamic_ncols=True)
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
    except InputError as e:
        bar.close()
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INPUT
    except (Cancelled, KeyboardInterrupt):
        bar.close()
        print("error: cancelled; nothing was written", file=sys.stderr)
        return EXIT_CANCELLED
    finally:
        bar.close()


def _setup_logging(quiet: bool) -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.ERROR if quiet else logging.INFO)


def _dispatch(args: argparse.Namespace, reporter: Reporter) -> int:
    from .core import engine
    from .core.recipe import Recipe

    if args.command == "demo":
        from .core.demo import write_demo

        from .core.demo import read_manifest

        base, agents = write_demo(args.dir)
        print(f"demo base: {base}")
        for a in read_manifest(args.dir)["agents"]:
            print(f"demo agent: {a['path']}  (suite {a['suite']})")
        print(f"try: ram-merge merge {base} {' '.join(map(str, agents))} --out {Path(args.dir) / 'merged'}")
        return EXIT_OK
    if args.command == "probe":
        report = engine.probe(args.base, args.agents, _names(args.names), args.eps, args.device, reporter,
                              vocab=args.vocab)
        if args.json:
            try:
                args.json.write_text(json.dumps(report.to_json(), indent=1) + "\n")
            except OSError as e:
                raise InputError(f"{args.json}: cannot write ({e.strerror})") from None
        print(format_probe(report))
        return EXIT_OK
    if args.command == "merge":
        params = {k[len("param_"):]: v for k, v in vars(args).items() if k.startswith("param_") and v is not None}
        request = engine.MergeRequest(args.base, args.agents, args.out, args.method, params, _names(args.names),
                                      args.eps, args.device, args.out_dtype, args.shard_size, args.overwrite,
                                      vocab=args.vocab)
    else:
        request = engine.MergeRequest.from_recipe(Recipe.load(args.recipe), args.out, overwrite=args.overwrite)
    result = engine.merge(request, reporter)
    print(format_probe(result.probe, result.lambdas))
    print(f"merged model written to {result.out} ({result.bytes_written / 1e6:.1f} MB, {result.seconds:.1f} s)")
    return EXIT_OK


def _names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",")] if text else None


def format_probe(report, lambdas: list[float] | None = None) -> str:
    """A plain table of per-agent statistics."""
    head = f"{'agent':16s} {'density':>8s} {'unique':>12s} {'shared':>12s} {'rho':>8s}"
    if lambdas:
        head += f" {'lambda':>8s}"
    lines = [f"{report.params:,} elements in {report.tensors} tensors, eps = {report.eps:g}", head]
    for t, a in enumerate(report.agents):
        rho = "inf" if a.rho == float("inf") else f"{a.rho:.3f}"
        line = f"{a.name[:16]:16s} {a.density:8.2%} {a.unique:12,} {a.shared:12,} {rho:>8s}"
        if lambdas:
            line += f" {lambdas[t]:8.4f}"
        lines.append(line)
    return "\n".join(lines)


def entry() -> None:
    """Console-script entry point."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("error: cancelled; nothing was written", file=sys.stderr)
        sys.exit(EXIT_CANCELLED)
