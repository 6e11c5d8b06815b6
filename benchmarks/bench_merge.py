#!/usr/bin/env python3
"""Time RAM Desktop's ``ram-merge`` against mergekit on the same synthetic RL-like agents.

For each method pair (ours vs mergekit) it runs both as subprocesses on the same inputs, one after
the other, and measures

* wall time of the whole command (start-up, reading, probe, merge, writing);
* peak anonymous memory (sum of ``RssAnon`` over the process and all its descendants, polled from
  ``/proc`` every ``--poll-ms``), plus peak total RSS of the tree and the kernel's ``ru_maxrss``
  (those two include page-cache pages the process maps, e.g. mmapped safetensors);

after warming the page cache (every input file is read once), and it reports the I/O floor: the
time to read every input file once more from the page cache.  Output: a table on stdout with the
speed-up (mergekit time / ours) and ours / I/O floor, and a JSON results file.

Default pair: our ``ram-plus`` (probe + merge, the global RAM+ of SPEC.md) vs mergekit ``ram``
(which is plain RAM: mergekit has no global RAM+, and its ``ramplus_tl`` is per tensor).  More with
``--methods``, e.g. ``--methods ram-plus,ram,ties,dare-ties`` or explicit pairs
``ours:mergekit`` such as ``ram-plus:ramplus_tl``.  ``ours:`` or ``:mergekit`` runs one side only.
A run that fails is reported as failed (exit status and the end of its log); the script goes on.

Examples (run from the repository root, with the project venv's python):

    .venv/bin/python benchmarks/bench_merge.py --data /work/bench-data --generate --params 300M
    .venv/bin/python benchmarks/bench_merge.py --data /work/bench-data --methods ram-plus,ties,dare-ties
    .venv/bin/python benchmarks/bench_merge.py --data /tmp/agents-20m --generate --params 20M \\
        --methods ram --compare

Needs: Linux /proc, the agents folder from ``make_agents.py`` (``--generate`` makes it; that
needs torch + safetensors in this python), mergekit in its own venv (``setup_mergekit.sh``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
AGENT_NAMES = ("code", "tool", "memory")

# our method -> mergekit method (closest equivalent)
DEFAULT_PAIR = {
    "ram-plus": "ram",  # spec section 5: RAM+ probe+merge vs mergekit's `ram`
    "ram": "ram",
    "ram-plus-soft": "ram",
    "average": "linear",
    "task-arithmetic": "task_arithmetic",
    "ties": "ties",
    "dare-ta": "dare_linear",
    "dare-ties": "dare_ties",
    "slerp": "slerp",  # mergekit's methods (core/methods/slerp.py, della.py, model_stock.py)
    "della": "della",
    "model-stock": "model_stock",
}
ONE_AGENT = {"slerp", "nearswap", "arcee-fusion", "arcee_fusion"}  # methods of a base and one agent: the first
DEFAULT_SCALE = {"task-arithmetic": 0.3, "dare-ta": 0.3, "ties": 1.0, "dare-ties": 1.0}


# ---------------------------------------------------------------------------------------------
# process-tree memory sampling from /proc


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.extend(int(x) for x in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return out


def _status_kb(pid: int) -> tuple[int, int]:
    """(RssAnon, VmRSS) in kB, zeros when the process is gone."""
    anon = rss = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
    except OSError:
        pass
    return anon, rss


class TreeMonitor(threading.Thread):
    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_anon_kb = self.peak_rss_kb = 0
        self.samples = 0
        self.max_procs = 0
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            stack, seen, anon, rss = [self.pid], set(), 0, 0
            while stack:
                p = stack.pop()
                if p in seen:
                    continue
                seen.add(p)
                a, r = _status_kb(p)
                anon += a
                rss += r
                stack.extend(_children(p))
            self.peak_anon_kb = max(self.peak_anon_kb, anon)
            self.peak_rss_kb = max(self.peak_rss_kb, rss)
            self.max_procs = max(self.max_procs, len(seen))
            self.samples += 1
            self._halt.wait(self.interval)

    def stop(self):
        self._halt.set()
        self.join()


def cpu_ticks() -> tuple[float, float]:
    """(busy, total) CPU seconds over all cores since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    total = sum(v[:8])  # user nice system idle iowait irq softirq steal
    idle = v[3] + v[4]
    return (total - idle) / hz, total / hz


def system_busy(seconds: float = 1.0) -> float:
    """Cores' worth of CPU in use by anything over the next ``seconds``."""
    b0, _t0 = cpu_ticks()
    time.sleep(seconds)
    b1, _t1 = cpu_ticks()
    return (b1 - b0) / max(seconds, 1e-9)


def wait_idle(max_wait: float, threshold: float) -> float:
    """Wait (up to max_wait s) until other work uses < threshold cores; returns last reading."""
    deadline = time.monotonic() + max_wait
    busy = system_busy()
    while busy >= threshold and time.monotonic() < deadline:
        busy = system_busy(2.0)
    return busy


def run_measured(cmd: list[str], log_path: Path, poll_s: float, timeout: float | None, env=None) -> dict:
    busy0, _ = cpu_ticks()
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        except OSError as e:
            return {"ok": False, "error": f"cannot start: {e}", "cmd": cmd}
        mon = TreeMonitor(proc.pid, poll_s)
        mon.start()
        killed = []
        timer = None
        if timeout:
            timer = threading.Timer(timeout, lambda: (killed.append(1), proc.kill()))
            timer.start()
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        if timer:
            timer.cancel()
        mon.stop()
    rc = os.waitstatus_to_exitcode(status)
    proc.returncode = rc
    own_cpu = ru.ru_utime + ru.ru_stime
    # CPU time everything else on the machine used meanwhile (other jobs steal our cores; the
    # monitor thread itself is included, it is small)
    other_cpu = max(0.0, cpu_ticks()[0] - busy0 - own_cpu)
    res = {
        "ok": rc == 0,
        "rc": rc,
        "wall_s": round(wall, 3),
        "peak_anon_mb": round(mon.peak_anon_kb / 1024, 1),
        "peak_rss_mb": round(mon.peak_rss_kb / 1024, 1),
        "ru_maxrss_mb": round(ru.ru_maxrss / 1024, 1),
        "cpu_user_s": round(ru.ru_utime, 2),
        "cpu_sys_s": round(ru.ru_stime, 2),
        "other_cpu_s": round(other_cpu, 2),
        "other_cores": round(other_cpu / max(wall, 1e-9), 2),
        "max_procs": mon.max_procs,
        "samples": mon.samples,
        "cmd": cmd,
        "log": str(log_path),
    }
    if killed:
        res["error"] = f"timed out after {timeout}s"
    if rc != 0:
        try:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-8:]
        except OSError:
            tail = []
        res.setdefault("error", f"exit status {rc}")
        res["log_tail"] = tail
    return res


# ---------------------------------------------------------------------------------------------
# inputs, page cache


def model_dirs(data: Path) -> tuple[Path, list[Path]]:
    base = data / "base"
    agents = [data / a for a in AGENT_NAMES]
    missing = [str(p) for p in [base, *agents] if not (p / "config.json").exists()]
    if missing:
        raise SystemExit(
            f"error: no generated agents at {data} (missing {', '.join(missing)}); "
            f"run benchmarks/make_agents.py --out {data} or pass --generate"
        )
    return base, agents


def input_files(dirs) -> list[Path]:
    return sorted(p for d in dirs for p in d.iterdir() if p.is_file())


def read_all(files, bufsize=16 << 20) -> tuple[float, int]:
    buf = bytearray(bufsize)
    mv = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while True:
                n = f.readinto(mv)
                if not n:
                    break
                total += n
    return time.perf_counter() - t0, total


def drop_dir(p: Path):
    if p.exists():
        shutil.rmtree(p)
    for q in p.parent.glob(p.name + ".partial*"):
        shutil.rmtree(q, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# commands


def default_ram_merge() -> list[str]:
    exe = REPO / ".venv" / "bin" / "ram-merge"
    if exe.exists():
        return [str(exe)]
    py = REPO / ".venv" / "bin" / "python"
    return [str(py if py.exists() else sys.executable), "-m", "ram_desktop"]


def ours_cmd(a, method: str, base: Path, agents: list[Path], out: Path) -> list[str]:
    agents = agents[:1] if method in ONE_AGENT else agents
    cmd = [
        *a.ram_merge,
        "merge",
        str(base),
        *map(str, agents),
        "--out",
        str(out),
        "--method",
        method,
        "--names",
        ",".join(AGENT_NAMES[: len(agents)]),
    ]
    if method in ("ram", "ram-plus", "ram-plus-soft"):
        cmd += ["--eps", repr(a.eps)]
    if method in ("ram-plus", "ram-plus-soft"):
        cmd += ["--r", repr(a.r), "--alpha", repr(a.alpha)]
    if method in DEFAULT_SCALE:
        cmd += ["--scale", repr(a.scale if a.scale is not None else DEFAULT_SCALE[method])]
    if method == "ties":
        cmd += ["--density", repr(a.density)]
    if method in ("dare-ta", "dare-ties"):
        cmd += ["--drop", repr(a.drop), "--seed", str(a.seed)]
    if method == "slerp":
        cmd += ["--t", "0.5"]
    if method == "della":  # mergekit's defaults: normalize and rescale on; one density and epsilon for all
        cmd += ["--density", repr(1.0 - a.drop), "--epsilon", "0.1", "--seed", str(a.seed)]
    if method in ("slerp", "della", "model-stock"):
        cmd += ["--dtype", a.mk_dtype or "inputs"]  # mergekit's compute dtype, so both compute the same
    return cmd + shlex.split(a.ours_args)


def mergekit_config(a, method: str, base: Path, agents: list[Path]) -> str:
    """YAML for mergekit-yaml (written by hand: no pyyaml needed here)."""
    agents = agents[:1] if method in ONE_AGENT else agents
    lines = [f"merge_method: {method}"]
    if method != "linear":
        lines.append(f"base_model: {base}")
    if a.mk_dtype:
        lines.append(f"dtype: {a.mk_dtype}")
    lines.append(f"out_dtype: {a.mk_out_dtype}")
    per_model, glob = {}, {}
    if method == "ram":
        glob = {"epsilon": a.eps}
    elif method == "ramplus_tl":
        glob = {"epsilon": a.eps, "r": a.r, "alpha": a.alpha}
    elif method == "linear":
        per_model = {"weight": 1.0}
        glob = {"normalize": "true"}
    elif method == "task_arithmetic":
        per_model = {"weight": a.scale if a.scale is not None else 0.3}
    elif method == "ties":
        per_model = {"weight": 1.0, "density": a.density}
        glob = {"normalize": "true", "lambda": a.scale if a.scale is not None else 1.0}
    elif method == "dare_ties":
        per_model = {"weight": 1.0, "density": round(1.0 - a.drop, 6)}
        glob = {"normalize": "true", "lambda": a.scale if a.scale is not None else 1.0}
    elif method == "slerp":
        glob = {"t": 0.5}
    elif method == "della":
        per_model = {"weight": 1.0, "density": round(1.0 - a.drop, 6), "epsilon": 0.1}
    elif method == "dare_linear":
        per_model = {"weight": a.scale if a.scale is not None else 0.3, "density": round(1.0 - a.drop, 6)}
    lines.append("models:")
    for p in agents:
        lines.append(f"  - model: {p}")
        if per_model:
            lines.append("    parameters: {" + ", ".join(f"{k}: {v}" for k, v in per_model.items()) + "}")
    if glob:
        lines.append("parameters:")
        lines += [f"  {k}: {v}" for k, v in glob.items()]
    return "\n".join(lines) + "\n"


def mergekit_cmd(a, cfg: Path, out: Path) -> list[str]:
    return [a.mergekit_yaml, str(cfg), str(out), "--random-seed", str(a.seed), *shlex.split(a.mk_args)]


def version_of(python: Path, dist: str) -> str | None:
    try:
        r = subprocess.run(
            [str(python), "-c", (f"import importlib.metadata as m; print(m.version('{dist}'))")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------------------------------------
# optional output comparison (needs torch + safetensors)


def compare_outputs(d1: Path, d2: Path) -> dict:
    import torch  # noqa: F401
    from safetensors import safe_open

    def table(d):
        idx = d / "model.safetensors.index.json"
        if idx.exists():
            wm = json.loads(idx.read_text())["weight_map"]
            return {k: d / v for k, v in wm.items()}
        files = sorted(d.glob("*.safetensors"))
        out = {}
        for f in files:
            with safe_open(str(f), "pt") as h:
                out.update({k: f for k in h.keys()})  # noqa: SIM118 — safe_open is not iterable
        return out

    t1, t2 = table(d1), table(d2)
    if set(t1) != set(t2):
        return {
            "error": "tensor names differ",
            "only_first": sorted(set(t1) - set(t2))[:5],
            "only_second": sorted(set(t2) - set(t1))[:5],
        }
    n = differing = 0
    max_abs = 0.0
    for k in sorted(t1):
        with safe_open(str(t1[k]), "pt") as h1, safe_open(str(t2[k]), "pt") as h2:
            x, y = h1.get_tensor(k), h2.get_tensor(k)
        if x.dtype != y.dtype or x.shape != y.shape:
            return {"error": f"{k}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}"}
        ne = x != y
        n += x.numel()
        c = int(ne.sum())
        if c:
            differing += c
            max_abs = max(max_abs, float((x.float() - y.float()).abs().max()))
    return {"elements": n, "differing": differing, "max_abs_diff": max_abs, "identical": differing == 0}


# ---------------------------------------------------------------------------------------------


def fmt_mb(v):
    return "-" if v is None else f"{v / 1024:.2f} GB" if v >= 1024 else f"{v:.0f} MB"


def fmt_s(r):
    if r is None:
        return "-"
    return f"{r['wall_s']:.1f} s" if r.get("ok") else "FAILED"


def best(runs):
    ok = [r for r in runs if r.get("ok")]
    if not ok:
        return runs[-1] if runs else None
    b = dict(min(ok, key=lambda r: r["wall_s"]))
    b["peak_anon_mb"] = max(r["peak_anon_mb"] for r in ok)
    b["runs_wall_s"] = [r["wall_s"] for r in ok]
    return b


def parse_pairs(text: str) -> list[tuple[str | None, str | None]]:
    pairs = []
    for item in [x.strip() for x in text.split(",") if x.strip()]:
        if ":" in item:
            o, m = item.split(":", 1)
            pairs.append((o or None, m or None))
        else:
            if item not in DEFAULT_PAIR:
                raise SystemExit(
                    f"error: unknown method {item!r}; ours are {', '.join(DEFAULT_PAIR)} (or give ours:mergekit)"
                )
            pairs.append((item, DEFAULT_PAIR[item]))
    return pairs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument(
        "--data",
        type=Path,
        default=Path("/work/bench-data"),
        help="agents folder from make_agents.py (default /work/bench-data)",
    )
    ap.add_argument(
        "--generate", action="store_true", help="generate the agents into --data first (reused when already there)"
    )
    ap.add_argument("--params", default="300M", help="with --generate: size per model")
    ap.add_argument("--gen-seed", type=int, default=0, help="with --generate: generator seed")
    ap.add_argument(
        "--methods",
        default="ram-plus",
        help="comma list of our methods (paired with mergekit's closest) or "
        "ours:mergekit pairs; default ram-plus (vs mergekit ram)",
    )
    ap.add_argument(
        "--ram-merge",
        type=shlex.split,
        default=None,
        help="our command, e.g. '/work/main/.venv/bin/ram-merge' or "
        "'python -m ram_desktop' (default: the repo's .venv)",
    )
    ap.add_argument(
        "--ours-args", default="--device cpu", help="extra arguments for our merge (default '--device cpu')"
    )
    ap.add_argument("--mergekit-yaml", default="/work/mergekit-venv/bin/mergekit-yaml")
    ap.add_argument(
        "--mk-args",
        default="--lazy-unpickle --quiet",
        help="extra mergekit-yaml arguments (default '--lazy-unpickle --quiet')",
    )
    ap.add_argument(
        "--mk-dtype",
        default="float32",
        help="mergekit compute dtype (config 'dtype'; default float32, as the spec computes; '' = the checkpoint's)",
    )
    ap.add_argument("--mk-out-dtype", default="bfloat16")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--r", type=float, default=0.1)
    ap.add_argument("--alpha", type=float, default=2.0)
    ap.add_argument(
        "--scale", type=float, default=None, help="lambda (default per method: TA/DARE-TA 0.3, TIES/DARE-TIES 1.0)"
    )
    ap.add_argument("--density", type=float, default=0.2, help="TIES keep fraction k")
    ap.add_argument("--drop", type=float, default=0.5, help="DARE drop probability p")
    ap.add_argument("--seed", type=int, default=0, help="DARE seed (both tools)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per command (best time kept)")
    ap.add_argument(
        "--reuse-probe-cache",
        action="store_true",
        help="let our runs reuse the user's probe cache (a repeated RAM+ run then skips its probe "
        "pass); by default every run of ours gets an empty cache",
    )
    ap.add_argument("--order", choices=["ours-first", "mergekit-first"], default="ours-first")
    ap.add_argument("--poll-ms", type=float, default=25.0)
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each run wait up to this long for other work to stop",
    )
    ap.add_argument(
        "--idle-threshold",
        type=float,
        default=0.3,
        metavar="CORES",
        help="CPU use by other work counted as busy (default 0.3 cores)",
    )
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run")
    ap.add_argument(
        "--scratch",
        type=Path,
        default=Path("/work/bench-out"),
        help="outputs, configs and logs (default /work/bench-out)",
    )
    ap.add_argument("--keep-outputs", action="store_true", help="keep merged models")
    ap.add_argument(
        "--compare", action="store_true", help="compare ours vs mergekit output element-wise per pair (needs torch)"
    )
    ap.add_argument("--json", type=Path, default=None, help="results file (default SCRATCH/bench-<time>.json)")
    a = ap.parse_args(argv)

    a.ram_merge = a.ram_merge or default_ram_merge()
    pairs = parse_pairs(a.methods)
    a.scratch.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    json_path = a.json or a.scratch / f"bench-{stamp}.json"

    if a.generate:
        sys.path.insert(0, str(HERE))
        import make_agents

        print(f"generating agents ({a.params}/model) in {a.data} ...", flush=True)
        make_agents.generate(str(a.data), make_agents.parse_size(a.params), a.gen_seed)
    base, agents = model_dirs(a.data)
    files = input_files([base, *agents])
    read_all(files)  # warm the page cache
    io_s, nbytes = read_all(files)  # the I/O floor
    info_path = a.data / "agents.json"
    data_info = json.loads(info_path.read_text()) if info_path.exists() else {}
    print(
        f"inputs: {len(files)} files, {nbytes / 1e9:.2f} GB; "
        f"I/O floor (read once from page cache): {io_s:.2f} s ({nbytes / 1e9 / io_s:.2f} GB/s)",
        flush=True,
    )

    mk_python = Path(a.mergekit_yaml).parent / "python"
    with open("/proc/cpuinfo") as cpuinfo:
        cpu = next(
            (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), platform.processor()
        )
    env_info = {
        "time": stamp,
        "host": platform.node(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "mergekit_version": version_of(mk_python, "mergekit"),
        "mergekit_torch": version_of(mk_python, "torch"),
        "ours_cmd": a.ram_merge,
    }
    results = {
        "format": "ram-bench/1",
        "env": env_info,
        "data": str(a.data),
        "params_per_model": data_info.get("params"),
        "input_bytes": nbytes,
        "input_files": len(files),
        "io_floor_s": round(io_s, 3),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "pairs": [],
    }

    def one(side: str, method: str) -> dict:
        out = a.scratch / f"out-{side}-{method}"
        runs = []
        for i in range(a.repeat):
            drop_dir(out)
            read_all(files)  # keep inputs hot
            if side == "ours":
                cmd = ours_cmd(a, method, base, agents, out)
            else:
                cfg = a.scratch / f"mergekit-{method}.yml"
                cfg.write_text(mergekit_config(a, method, base, agents))
                cmd = mergekit_cmd(a, cfg, out)
            busy = wait_idle(a.wait_idle, a.idle_threshold) if a.wait_idle else system_busy(0.5)
            if busy >= a.idle_threshold:
                print(
                    f"  warning: machine busy before the run ({busy:.2f} cores in use by other "
                    f"work); timings will be inflated",
                    flush=True,
                )
            print(f"  [{side} {method} run {i + 1}/{a.repeat}] {shlex.join(cmd)}", flush=True)
            env = None
            if side == "ours" and not a.reuse_probe_cache:
                # an empty probe cache for every run: RAM+ then runs both passes (probe, then merge),
                # as the comparison claims; a cached probe from the previous run would skip the first
                env = dict(os.environ, RAM_DESKTOP_CACHE=tempfile.mkdtemp(prefix="ram-bench-cache-"))
            r = run_measured(cmd, a.scratch / f"{side}-{method}.log", a.poll_ms / 1000, a.timeout, env=env)
            if env is not None:
                shutil.rmtree(env["RAM_DESKTOP_CACHE"], ignore_errors=True)
            if side == "ours" and r["ok"]:
                rep = out / "merge-report.json"
                if rep.exists():
                    try:
                        mr = json.loads(rep.read_text())
                        r["report"] = {k: mr[k] for k in ("timings", "lambda", "versions") if k in mr}
                    except (OSError, ValueError, KeyError, TypeError):
                        pass  # a report we cannot read: the timing row stands without it
            r["busy_before_cores"] = round(busy, 2)
            print(
                f"    -> {'ok' if r['ok'] else 'FAILED: ' + r.get('error', '')}"
                f"  {r.get('wall_s', 0):.2f} s, peak anon {fmt_mb(r.get('peak_anon_mb'))}, "
                f"cpu {r.get('cpu_user_s', 0) + r.get('cpu_sys_s', 0):.1f} s; other work "
                f"used {r.get('other_cores', 0):.2f} cores meanwhile",
                flush=True,
            )
            if r.get("other_cores", 0) >= a.idle_threshold:
                print("      warning: other processes competed for the CPU during this run", flush=True)
            if not r["ok"] and r.get("log_tail"):
                print("      " + "\n      ".join(r["log_tail"]), flush=True)
            runs.append(r)
            if not r["ok"]:
                break
        b = best(runs)
        b["out"] = str(out)
        return b

    for ours_m, mk_m in pairs:
        print(f"\n== ours {ours_m or '-'}  vs  mergekit {mk_m or '-'}", flush=True)
        entry = {"ours_method": ours_m, "mergekit_method": mk_m, "ours": None, "mergekit": None}
        sides = [("ours", ours_m), ("mergekit", mk_m)]
        if a.order == "mergekit-first":
            sides.reverse()
        for side, m in sides:
            if m:
                entry[side] = one(side, m)
        o, k = entry["ours"], entry["mergekit"]
        if o and k and o.get("ok") and k.get("ok"):
            entry["speedup"] = round(k["wall_s"] / o["wall_s"], 2)
            entry["mem_ratio"] = round(k["peak_anon_mb"] / max(o["peak_anon_mb"], 1e-9), 2)
            if a.compare:
                entry["compare"] = compare_outputs(Path(o["out"]), Path(k["out"]))
                print(f"  compare: {entry['compare']}", flush=True)
        for r in (o, k):
            if r and r.get("ok"):
                r["vs_io_floor"] = round(r["wall_s"] / io_s, 2)
            if r and not a.keep_outputs:
                drop_dir(Path(r["out"]))
        results["pairs"].append(entry)
        json_path.write_text(json.dumps(results, indent=2))

    # table
    print()
    print(
        f"inputs {a.data}: base + {len(agents)} agents, "
        f"{(results['params_per_model'] or 0) / 1e6:.0f}M params/model, "
        f"{nbytes / 1e9:.2f} GB; I/O floor {io_s:.2f} s; {env_info['cpus']} CPUs; "
        f"mergekit {env_info['mergekit_version']}"
    )
    hdr = (
        f"{'ours':<16}{'time':>9}{'peak anon':>11}{'xIO':>9}   {'mergekit':<16}{'time':>9}"
        f"{'peak anon':>11}{'xIO':>9}   {'speed-up':>9}{'mem ratio':>10}"
    )
    print(hdr)
    print("-" * len(hdr))
    for e in results["pairs"]:
        o, k = e["ours"], e["mergekit"]

        def cols(r):
            if r is None:
                return f"{'-':>9}{'-':>11}{'-':>9}"
            ok = r.get("ok")
            t = fmt_s(r) + ("*" if ok and r.get("other_cores", 0) >= a.idle_threshold else "")
            return (
                f"{t:>9}{fmt_mb(r.get('peak_anon_mb')) if ok else '-':>11}"
                f"{(str(r.get('vs_io_floor')) + 'x') if ok else '-':>9}"
            )

        sp = f"{e['speedup']}x" if "speedup" in e else "-"
        mr = f"{e['mem_ratio']}x" if "mem_ratio" in e else "-"
        print(f"{e['ours_method'] or '-':<16}{cols(o)}   {e['mergekit_method'] or '-':<16}{cols(k)}   {sp:>9}{mr:>10}")
    print(
        "\nspeed-up = mergekit time / ours; mem ratio = mergekit peak anon / ours; "
        "xIO = time / I/O floor; * = other processes used >= "
        f"{a.idle_threshold} cores during that run (time inflated)"
    )
    print(f"results: {json_path}")
    json_path.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
