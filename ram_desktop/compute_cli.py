"""``ram-desktop --setup-compute`` and ``--compute-info``: the command-line face of the compute set-up
(docs/compute.md). Exit 0 done (or a dry run), 2 nothing can be installed / bad usage / the install
failed (one ``error:`` line; the bundled torch stays in use), 130 cancelled."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .core import Cancelled, ComputeError, ProgressEvent, Reporter
from .core.compute import builds, detect, runtime
from .core.compute.summary import describe_torch

EXIT_OK, EXIT_INPUT, EXIT_CANCELLED = 0, 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message}", file=sys.stderr)
        sys.exit(EXIT_INPUT)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ram-desktop --setup-compute",
        description="Detect the GPU, and fetch and check the torch build that uses it.",
    )
    parser.add_argument(
        "--setup-compute",
        dest="variant",
        nargs="?",
        const="auto",
        default="auto",
        choices=builds.VARIANTS,
        help="which build: auto (from the detection), cpu, cuda, rocm, mps",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the detection and the plan, change nothing")
    parser.add_argument("--offline", action="store_true", help="no network: only local wheels or uv's cache")
    parser.add_argument("--find-links", type=Path, metavar="DIR", help="install from this folder of wheels")
    parser.add_argument("--fresh", action="store_true", help="re-check uv's cache instead of resuming from it")
    parser.add_argument("--json", action="store_true", help="print the detection and the plan as JSON")
    return parser


def _progress_printer() -> tuple[Reporter, list[float]]:
    last = [0.0]

    def show(event: ProgressEvent) -> None:
        now = time.monotonic()
        if event.stage == "download" and now - last[0] >= 2.0:
            last[0] = now
            print(f"  {event.detail} ({event.elapsed:.0f} s)", file=sys.stderr, flush=True)
        elif event.stage == "verify" and event.done == 0:
            print(f"  {event.detail}", file=sys.stderr, flush=True)

    return Reporter(show), last


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cancel_on_termination() -> None:
    """SIGTERM and SIGHUP cancel the install like Ctrl-C: uv or the check's child process ends, the staging
    folder goes, exit 130 (the default would end this process alone and leave both behind). A signal the
    parent set to be ignored stays ignored (``nohup``)."""
    for name in ("SIGTERM", "SIGHUP"):
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) is not signal.SIG_IGN:
            signal.signal(number, _interrupt)


def setup(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.find_links is not None and not args.find_links.is_dir():
        print(f"error: --find-links {args.find_links}: no such folder", file=sys.stderr)
        return EXIT_INPUT
    found = detect.detect()
    plan = builds.choose(found, args.variant, find_links=args.find_links.resolve() if args.find_links else None)
    if args.json:
        print(json.dumps({"detection": found.to_json(), "plan": plan.to_json()}, indent=1))
    else:
        print("\n".join(found.describe() + plan.describe()))
    if args.dry_run:
        return EXIT_OK
    if plan.action == "none":
        return EXIT_OK
    if plan.action == "impossible":
        print(f"error: {plan.reason}", file=sys.stderr)
        return EXIT_INPUT
    from .core.compute import install

    reporter, _ = _progress_printer()
    cancel_on_termination()
    try:
        done = install.install(
            plan, reporter, offline=args.offline, fresh=args.fresh, log=lambda line: print(f"  {line}", file=sys.stderr)
        )
    except Cancelled:
        print("error: cancelled; the runtime folder was not changed", file=sys.stderr)
        return EXIT_CANCELLED
    except KeyboardInterrupt:
        print("error: cancelled; the runtime folder was not changed", file=sys.stderr)
        return EXIT_CANCELLED
    except ComputeError as e:
        print(f"error: {e}; the bundled CPU torch stays in use", file=sys.stderr)
        return EXIT_INPUT
    v = done.verified
    where = v.get("device_name") or "the CPU"
    print(
        f"installed torch {v.get('torch')} (CUDA {v.get('cuda')}) into {done.folder}: "
        f"{builds.human_bytes(done.bytes_on_disk)} in {done.seconds:.0f} s; check passed on {where}"
    )
    if not v.get("gpu") and plan.variant != "cpu":
        print(f"note: {v.get('why_no_gpu') or 'no GPU is usable'}; merges run on the CPU until one is")
    print("RAM Desktop uses it from its next start")
    return EXIT_OK


def info() -> int:
    """``--compute-info``: the torch in use, where it came from, and the device a merge would use."""
    state = runtime.status()
    if state.message:
        print(f"note: {state.message}")
    summary = describe_torch()
    for key, value in summary.items():
        print(f"{key}: {value}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--compute-info"]:
        return info()
    return setup(args)
