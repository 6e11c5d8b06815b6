"""Soak: many cycles of Analyze, Merge and a cancelled Merge on the built-in demo in one offscreen window,
reporting memory and live job objects; fails when finished jobs are not released.

    python -m ram_desktop.gui.harness.soak [--cycles 200] [--every 20]

Exit 1 when, after the last cycle, more job or thread objects are alive than one job needs, or the
resident memory grew more than ``--max-growth-mb`` beyond where it stood after the first report.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..application import wait_until

# at most this many of each job object may outlive the cycles: one job (worker, thread, job)
ONE_JOB = 1


@dataclass
class Sample:
    """What one report shows: after ``cycle`` cycles, resident memory and the live job objects."""

    cycle: int
    rss_mb: float
    threads: int
    workers: int
    jobs: int
    window_objects: int  # QObjects under the window (C++ side: a job parented to it shows here too)

    def line(self) -> str:
        return (
            f"cycle {self.cycle:4d}: RSS {self.rss_mb:7.1f} MB, live QThread {self.threads}, "
            f"Worker {self.workers}, Job {self.jobs}, QObjects in the window {self.window_objects}"
        )


def rss_mb() -> float:
    """Resident memory of this process in MB (Linux /proc; psutil elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss / 1e6


def live_job_objects() -> tuple[int, int, int]:
    """Live (QThread, Worker, Job) Python wrappers, after a full collection."""
    from PySide6.QtCore import QThread

    from ..worker import Job, Worker

    gc.collect()
    objects = gc.get_objects()
    types = [type(o) for o in objects]  # type(), not isinstance: no lazy module's __class__ is touched
    return tuple(sum(issubclass(t, cls) for t in types) for cls in (QThread, Worker, Job))  # type: ignore[return-value]


def _wait(app, condition: Callable[[], bool], timeout: float, what: str) -> None:
    if not wait_until(condition, timeout, app):
        raise TimeoutError(f"soak: waited {timeout:.0f} s for {what}")


def _settle(app, window) -> None:
    """Let deferred deletions run: they happen in the event loop, after the job's thread finished."""
    from PySide6.QtCore import QCoreApplication, QEvent

    for _ in range(3):
        app.processEvents()
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        time.sleep(0.01)


def soak(cycles: int, every: int = 20, out: Callable[[str], None] = print, timeout: float = 120.0) -> list[Sample]:
    """Run ``cycles`` of Analyze, Merge and a cancelled Merge on the demo in one window; a sample after
    every ``every`` cycles and after the last one. Needs a QApplication-free process or an existing one."""
    from PySide6.QtCore import QObject, QSettings
    from PySide6.QtWidgets import QApplication

    from ...core import write_demo
    from ..main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0]])
    # what was alive before this window (another window's jobs in a long test process) is not the soak's
    baseline = live_job_objects()
    tmp = Path(tempfile.mkdtemp(prefix="ram-desktop-soak-"))
    window = MainWindow(QSettings(str(tmp / "settings.ini"), QSettings.Format.IniFormat))
    samples: list[Sample] = []
    try:
        window.resize(1360, 860)
        window.show()
        base, agents = write_demo(tmp / "demo")
        analysed: list[bool] = []
        merged: list[str] = []
        window.analysis_finished.connect(analysed.append)
        window.merge_finished.connect(merged.append)
        window.set_sources(str(base), [str(a) for a in agents], None, analyse=True)
        _wait(app, lambda: bool(analysed), timeout, "the demo to load and be analysed")
        for cycle in range(1, cycles + 1):
            analysed.clear()
            window.analyse()
            _wait(app, lambda: bool(analysed) and not window.busy(), timeout, "the analysis")
            if analysed != [True]:
                raise RuntimeError(f"soak: the analysis failed: {window.message.text.text()}")
            for cancel in (False, True):
                folder = tmp / "merged"
                shutil.rmtree(folder, ignore_errors=True)
                window.edit_draft(output=str(folder))
                merged.clear()
                window.merge()
                if cancel:
                    window.cancel()
                _wait(app, lambda: bool(merged) and not window.busy(), timeout, "the merge")
                expected = ("cancelled", "done") if cancel else ("done",)
                if merged[0] not in expected:
                    raise RuntimeError(f"soak: the merge ended {merged[0]}: {window.message.text.text()}")
            if cycle % every == 0 or cycle == cycles:
                _settle(app, window)
                threads, workers, jobs = (max(0, n - b) for n, b in zip(live_job_objects(), baseline, strict=True))
                sample = Sample(cycle, rss_mb(), threads, workers, jobs, len(window.findChildren(QObject)))
                samples.append(sample)
                out(sample.line())
    finally:
        _wait(app, lambda: not window.busy(), timeout, "the last job")
        window.log_bridge.uninstall()
        window.close()
        window.deleteLater()
        app.processEvents()
        shutil.rmtree(tmp, ignore_errors=True)
    return samples


def verdict(samples: list[Sample], max_growth_mb: float) -> list[str]:
    """Why the soak failed (empty: it passed)."""
    if not samples:
        return ["no sample taken"]
    first, last = samples[0], samples[-1]
    faults = []
    if max(last.threads, last.workers, last.jobs) > ONE_JOB:
        faults.append(
            f"{last.threads} QThread, {last.workers} Worker, {last.jobs} Job objects alive after "
            f"{last.cycle} cycles (one job needs {ONE_JOB} of each)"
        )
    if len(samples) > 1 and last.rss_mb - first.rss_mb > max_growth_mb:
        faults.append(
            f"RSS grew {last.rss_mb - first.rss_mb:.0f} MB from cycle {first.cycle} to {last.cycle} "
            f"(limit {max_growth_mb:.0f} MB)"
        )
    return faults


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ram_desktop.gui.harness.soak", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cycles", type=int, default=200, help="cycles of analyse, merge, cancelled merge (200)")
    parser.add_argument("--every", type=int, default=20, help="report after this many cycles (20)")
    parser.add_argument(
        "--max-growth-mb",
        type=float,
        default=100.0,
        help="fail when RSS grows more than this beyond the first report (100)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("RAM_DESKTOP_CACHE", tempfile.mkdtemp(prefix="ram-desktop-soak-cache-"))
    start = time.monotonic()
    samples = soak(args.cycles, args.every, lambda line: print(line, flush=True))
    faults = verdict(samples, args.max_growth_mb)
    print(f"{args.cycles} cycles in {time.monotonic() - start:.0f} s: " + ("; ".join(faults) or "ok"), flush=True)
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
