#!/usr/bin/env python3
"""RAM+ probe + merge at two (or more) model sizes: wall time, CPU time, peak anonymous memory,
throughput, and the ratio to the I/O floor, with a PNG plot of throughput versus model size.

For each size the synthetic three-agent set of ``make_agents.py`` is used (generated on first use
under ``--data-root/<size>``, or given with ``--data SIZE=FOLDER``). Per size, in one run:

1. **I/O floor**: read every input safetensors file once from the page cache (after one warm-up
   read) into a reused buffer, the least any tool must do to see the inputs.
2. **ours**: ``python -m ram_desktop merge BASE A B C --method ram-plus --device cpu`` in a
   subprocess with an empty probe cache, so it runs both passes (probe, then merge). Peak anonymous
   memory is polled from ``/proc/<pid>/status`` (``RssAnon``: excludes the page cache mapped by the
   safetensors readers, which the kernel can drop at will); ``/usr/bin/time``'s max RSS counts it.

Benchmarks are not timed tests. On a shared machine, watch the reported load average: the
timings of a loaded machine are not comparable with an idle one (CPU seconds are shown too).

    python benchmarks/bench_scaling.py --sizes 75M,300M --data 300M=/work/bench-data \\
        --data-root /work/perf-data --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
AGENTS = ("code", "tool", "memory")


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}.get(text[-1:], 1)
    return int(float(text.rstrip("KMBG")) * mult)


def ensure_data(size: str, given: dict[str, Path], root: Path) -> Path:
    if size in given:
        return given[size]
    folder = root / size
    if not (folder / "agents.json").exists():
        print(f"generating {size} agents into {folder} ...", flush=True)
        subprocess.run(
            [sys.executable, str(HERE / "make_agents.py"), "--params", size, "--out", str(folder)], check=True
        )
    return folder


def model_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def io_floor(files: list[Path], block: int = 64 << 20) -> float:
    """Seconds to read ``files`` once from the page cache (best of 3, after a warm-up read)."""
    buf = bytearray(block)
    view = memoryview(buf)

    def read_all() -> None:
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(view):
                    pass

    read_all()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        read_all()
        best = min(best, time.perf_counter() - t0)
    return best


def run_ours(data: Path, out: Path, extra: list[str]) -> dict:
    """One RAM+ probe + merge in a subprocess; wall, CPU seconds, peak RssAnon, the report's timings."""
    env = dict(os.environ)
    env["RAM_DESKTOP_CACHE"] = tempfile.mkdtemp(prefix="ram-bench-cache-")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [
        sys.executable,
        "-m",
        "ram_desktop",
        "merge",
        str(data / "base"),
        *[str(data / a) for a in AGENTS],
        "--out",
        str(out),
        "--method",
        "ram-plus",
        "--overwrite",
        "--device",
        "cpu",
        *extra,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_anon = 0
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("RssAnon:"):
                    peak_anon = max(peak_anon, int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.01)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    shutil.rmtree(env["RAM_DESKTOP_CACHE"], ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"ram-merge failed ({proc.returncode}):\n{stderr}")
    report = json.loads((out / "merge-report.json").read_text())
    return {
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "peak_rss_anon_bytes": peak_anon,
        "max_rss_bytes": after.ru_maxrss * 1024,
        "timings": report.get("timings", {}),
        "lambda": report.get("lambda"),
    }


def plot(results: list[dict], path: Path) -> None:
    """Throughput (input GB/s) of ours and of the I/O floor versus parameters per model, as a PNG."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import pyqtgraph as pg
    import pyqtgraph.exporters
    from pyqtgraph.Qt import QtWidgets

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    pg.setConfigOptions(background="w", foreground="k", antialias=True)
    widget = pg.PlotWidget()
    widget.resize(900, 540)
    plot_item = widget.getPlotItem()
    plot_item.setTitle("RAM+ probe + merge, 3 bf16 agents, CPU", size="11pt")
    plot_item.setLabel("bottom", "parameters per model (millions)")
    plot_item.setLabel("left", "input throughput (GB/s)")
    plot_item.addLegend(offset=(-10, -10))
    xs = [r["params"] / 1e6 for r in results]
    plot_item.plot(
        xs,
        [r["throughput_gb_s"] for r in results],
        pen=pg.mkPen("b", width=2),
        symbol="o",
        symbolBrush="b",
        name="ram-desktop RAM+ (probe + merge)",
    )
    plot_item.plot(
        xs,
        [r["io_floor_gb_s"] for r in results],
        pen=pg.mkPen("g", width=2, style=pg.QtCore.Qt.DashLine),
        symbol="s",
        symbolBrush="g",
        name="I/O floor (read inputs once)",
    )
    plot_item.setLogMode(y=True)  # the I/O floor is an order of magnitude above a compute-bound merge
    plot_item.showGrid(x=True, y=True, alpha=0.3)
    plot_item.layout.setContentsMargins(10, 10, 10, 10)
    widget.show()  # offscreen: lays the scene out at the widget size before exporting
    app.processEvents()
    # the whole scene, not the plot item: an item export clips the title drawn above the item's rect
    exporter = pyqtgraph.exporters.ImageExporter(widget.scene())
    exporter.parameters()["width"] = 900
    exporter.export(str(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="75M,300M", help="parameters per model, comma-separated")
    ap.add_argument("--data", action="append", default=[], help="SIZE=FOLDER: an existing agent set for SIZE")
    ap.add_argument("--data-root", type=Path, default=Path("/work/perf-data"), help="where to generate missing sets")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="folder for scaling.json and scaling.png")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder for merge outputs (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per size; the fastest is kept")
    ap.add_argument("--ours-args", default="", help="extra ram-merge arguments")
    ap.add_argument("--plot-only", action="store_true", help="redraw scaling.png from an existing scaling.json")
    args = ap.parse_args(argv)

    if args.plot_only:
        plot(json.loads((args.out / "scaling.json").read_text()), args.out / "scaling.png")
        return 0
    given = {k: Path(v) for k, v in (d.split("=", 1) for d in args.data)}
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="ram-bench-"))
    results = []
    for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        data = ensure_data(size, given, args.data_root)
        meta = json.loads((data / "agents.json").read_text())
        files = [f for m in ("base", *AGENTS) for f in model_files(data / m)]
        in_bytes = sum(f.stat().st_size for f in files)
        floor = io_floor(files)
        runs = [run_ours(data, work / f"out-{size}", args.ours_args.split()) for _ in range(args.repeat)]
        best = min(runs, key=lambda r: r["wall_s"])
        row = {
            "size": size,
            "params": meta["params"],
            "input_bytes": in_bytes,
            "io_floor_s": floor,
            "io_floor_gb_s": in_bytes / floor / 1e9,
            **best,
            "throughput_gb_s": in_bytes / best["wall_s"] / 1e9,
            "ratio_to_io_floor": best["wall_s"] / floor,
            "load_avg": os.getloadavg(),
            "cpus": os.cpu_count(),
        }
        results.append(row)
        print(
            f"{size:>6}: {meta['params'] / 1e6:7.1f} M params, inputs {in_bytes / 1e9:5.2f} GB | "
            f"ours {best['wall_s']:6.2f} s wall ({best['cpu_s']:6.2f} s CPU; probe "
            f"{best['timings'].get('probe_s', 0):.2f} s, merge {best['timings'].get('merge_s', 0):.2f} s) "
            f"{row['throughput_gb_s']:.2f} GB/s, peak RssAnon {best['peak_rss_anon_bytes'] / 2**20:6.0f} MiB | "
            f"I/O floor {floor:5.2f} s ({row['io_floor_gb_s']:.2f} GB/s) -> {row['ratio_to_io_floor']:.1f}x the floor"
            f" | load {row['load_avg'][0]:.1f}",
            flush=True,
        )
        shutil.rmtree(work / f"out-{size}", ignore_errors=True)
    (args.out / "scaling.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, args.out / "scaling.png")
    print(f"wrote {args.out / 'scaling.json'} and {args.out / 'scaling.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
