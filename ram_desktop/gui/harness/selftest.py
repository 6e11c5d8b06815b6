"""``ram-desktop --self-test``: drive the real window end to end, offscreen, and check what it wrote.

Frozen or from source. It forces Qt's offscreen platform, opens :class:`MainWindow` with a temporary
QSettings file (never the user's settings), generates the demo agents into a temporary folder, loads
them as sources, runs the analysis through the window's worker thread, picks RAM+ with float32
output, merges into a temporary folder through the (bundled) engine, exports the charts as PNG, and
checks the output folder: weights present and loadable with safetensors, config.json / README.md /
ram-recipe.yaml / merge-report.json present, the report's method ``ram-plus`` and every λ in (1, 1.2].

Prints ONE line, ``self-test ok: ...`` (exit 0) or ``self-test failed: <reason>`` (exit 1), and always
removes its temporary folder. A watchdog ends the process after ``timeout`` seconds so it cannot hang.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

DEFAULT_TIMEOUT_S = 120.0
METHOD = "ram-plus"  # the demo merge the self-test runs and checks (its λ in (1, 1.2])
REQUIRED_FILES = ("config.json", "README.md", "ram-recipe.yaml", "merge-report.json")


class SelfTestError(Exception):
    """A check failed; the message is the one-line reason."""


def _wait(app, condition, deadline: float, what: str) -> None:
    while not condition():
        if time.monotonic() > deadline:
            raise SelfTestError(f"timed out waiting for {what}")
        app.processEvents()
        time.sleep(0.005)


def _check_output(out: Path) -> tuple[int, list[float], str]:
    """(elements in the merged weights, λ values, dtype) or SelfTestError."""
    from safetensors import safe_open

    from ...core import InputError
    from ...core.storage.safe_read import check_regular, read_json

    if not out.is_dir():
        raise SelfTestError(f"the merge wrote no output folder {out}")
    missing = [name for name in REQUIRED_FILES if not (out / name).is_file() or (out / name).stat().st_size == 0]
    if missing:
        raise SelfTestError(f"the output folder lacks {', '.join(missing)}")
    shards = sorted(out.glob("*.safetensors"))
    if not shards:
        raise SelfTestError("the output folder has no .safetensors weights")
    elements, dtypes = 0, set()
    for shard in shards:
        try:
            check_regular(shard)  # safe_open opens it itself: a FIFO would block it
            with safe_open(str(shard), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118  safe_open is not a mapping: keys() is its only listing
                    tensor = f.get_tensor(key)
                    elements += tensor.numel()
                    dtypes.add(str(tensor.dtype).replace("torch.", ""))
        except Exception as e:
            raise SelfTestError(f"cannot load {shard.name} with safetensors: {type(e).__name__}: {e}") from e
    if elements == 0:
        raise SelfTestError("the merged weights hold no elements")
    if dtypes != {"float32"}:
        raise SelfTestError(f"merged weights are {sorted(dtypes)}, expected float32")
    try:
        report = read_json(out / "merge-report.json")
    except InputError as e:
        raise SelfTestError(f"merge-report.json cannot be read: {e}") from e
    if not isinstance(report, dict):
        raise SelfTestError("merge-report.json is not a JSON object")
    if report.get("method") != METHOD:
        raise SelfTestError(f"merge-report.json says method {report.get('method')!r}, expected {METHOD!r}")
    lambdas = report.get("lambda") or []
    if not lambdas or not all(isinstance(v, (int, float)) and 1.0 < v <= 1.2 for v in lambdas):
        raise SelfTestError(f"RAM+ λ values {lambdas} are not all in (1, 1.2]")
    if report.get("out_dtype") != "float32":
        raise SelfTestError(f"merge-report.json says out_dtype {report.get('out_dtype')!r}, expected 'float32'")
    return elements, lambdas, "float32"


def _drive(tmp: Path, deadline: float) -> str:
    """Run the whole flow in this process; return the summary line (without the prefix)."""
    from PySide6.QtCore import QSettings, qInstallMessageHandler
    from PySide6.QtWidgets import QApplication

    from ... import paths
    from ...core import write_demo
    from ..application import setup_application
    from ..main_window import MainWindow

    # Qt's own warnings (the offscreen plugin's "does not support propagateSizeHints()") would break the
    # one-line output: swallow them for the length of the test.
    qt_messages: list[str] = []
    previous_handler = qInstallMessageHandler(lambda kind, context, message: qt_messages.append(message))
    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "ram-desktop"])
    assert isinstance(app, QApplication)  # the self-test's process makes a QApplication, never a bare QCoreApplication
    icon_ok = setup_application(app)
    if paths.is_frozen() and not icon_ok:
        raise SelfTestError("the bundled window icon (resources/ram-desktop.svg) did not load")
    if app.platformName() != "offscreen":
        raise SelfTestError(f"Qt platform is {app.platformName()!r}, expected 'offscreen'")

    errors: list[str] = []
    previous_hook = sys.excepthook

    def hook(kind, value, tb) -> None:  # an exception in a slot: remember it, fail with it
        errors.append(f"{kind.__name__}: {value}")

    sys.excepthook = hook
    settings = QSettings(str(tmp / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings)
    try:
        window.resize(1360, 860)
        window.show()
        app.processEvents()

        t0 = time.monotonic()
        base, agents = write_demo(tmp / "demo")
        analysed: list[bool] = []
        window.analysis_finished.connect(analysed.append)
        window.set_sources(str(base), [str(a) for a in agents], None, analyse=True)
        _wait(app, lambda: analysed or errors, deadline, "the sources to load and the analysis to finish")
        if errors:
            raise SelfTestError(f"error in the window: {errors[0]}")
        if not analysed[0] or window.report is None:
            reason = window.message.text.text() or "no report"
            raise SelfTestError(f"the analysis failed: {reason}")
        n_agents = len(window.report.names)
        if n_agents != len(agents):
            raise SelfTestError(f"analysed {n_agents} agents, expected {len(agents)}")

        out = tmp / "merged"
        session = window.session  # the method form shows the session's draft, and writes back what it shows
        draft = session.draft.with_method(METHOD, {}, session.sources.identities)
        session.set_draft(draft.edited(out_dtype="float32", output=str(out)))
        if (session.draft.method, session.draft.out_dtype, session.draft.output) != (METHOD, "float32", str(out)):
            raise SelfTestError("could not select RAM+ with float32 output in the method panel")
        merged: list[str] = []
        window.merge_finished.connect(merged.append)
        t_merge = time.monotonic()
        window.merge()
        if not window.jobs.busy() and not merged:
            raise SelfTestError(f"the merge did not start: {window.message.text.text() or 'no reason shown'}")
        _wait(app, lambda: merged or errors, deadline, "the merge to finish")
        merge_s = time.monotonic() - t_merge
        if errors:
            raise SelfTestError(f"error in the window: {errors[0]}")
        if not merged or merged[0] != "done":
            reason = window.message.text.text() or (merged[0] if merged else "did not start")
            raise SelfTestError(f"the merge failed: {reason}")
        if window.result is None or Path(window.result.out) != out:
            raise SelfTestError("the window reports no merge result for the chosen output folder")

        _wait(app, window.analysis.charts_ready, deadline, "the charts to be drawn")
        chart_dir = tmp / "charts"
        chart_dir.mkdir()
        names = window.export_charts(chart_dir)
        if not names:
            raise SelfTestError("File > Export charts wrote no PNG")
        chart_bytes = 0
        for name in names:
            data = (chart_dir / name).read_bytes()
            if data[:8] != b"\x89PNG\r\n\x1a\n" or len(data) < 1000:
                raise SelfTestError(f"exported chart {name} is not a PNG image ({len(data)} bytes)")
            chart_bytes += len(data)

        elements, lambdas, _ = _check_output(out)
        total_s = time.monotonic() - t0
        lam = ", ".join(f"{v:.3f}" for v in lambdas)
        return (
            f"analysed {n_agents} agents, merged {elements:,} elements with RAM+ (λ {lam}) to float32 "
            f"in {merge_s:.1f} s, {len(names)} charts {chart_bytes // 1000} KB, all in {total_s:.1f} s"
        )
    finally:
        sys.excepthook = previous_hook
        qInstallMessageHandler(previous_handler)
        if window.jobs.busy():
            window.cancel()
            _wait(app, lambda: not window.jobs.busy(), time.monotonic() + 10, "the job to cancel")
        window.close()
        window.deleteLater()
        app.processEvents()


def run(timeout: float = DEFAULT_TIMEOUT_S) -> int:
    """The self-test. Returns the exit code (0 ok, 1 failed) after printing one line."""
    tmp = Path(tempfile.mkdtemp(prefix="ram-desktop-selftest-"))
    saved_env = {k: os.environ.get(k) for k in ("QT_QPA_PLATFORM", "RAM_DESKTOP_CACHE", "RAM_DESKTOP_CONFIG")}
    os.environ["QT_QPA_PLATFORM"] = "offscreen"  # before any QApplication exists
    os.environ["RAM_DESKTOP_CACHE"] = str(tmp / "cache")  # the probe cache too stays out of the user's folders
    os.environ["RAM_DESKTOP_CONFIG"] = str(tmp / "config")  # so does the record of the demo's scorer folder
    finished = threading.Event()

    def watchdog() -> None:
        if finished.wait(timeout + 15):  # _drive's own deadline should have fired first
            return
        print(f"self-test failed: timed out after {timeout:.0f} s", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watchdog, name="self-test watchdog", daemon=True).start()
    try:
        summary = _drive(tmp, time.monotonic() + timeout)
        line, code = f"self-test ok: {summary}", 0
    except SelfTestError as e:
        line, code = f"self-test failed: {e}", 1
    except Exception as e:  # noqa: BLE001  one line, no traceback: this is a check
        line, code = f"self-test failed: {type(e).__name__}: {e}", 1
    finally:
        finished.set()
        shutil.rmtree(tmp, ignore_errors=True)
        for key, value in saved_env.items():  # when called in process (tests), leave the environment as it was
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    print(line, flush=True)
    return code
