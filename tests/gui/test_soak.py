"""A finished job is released with all it held: the short soak (the long one is
``python -m ram_desktop.gui.harness.soak``) and the lifecycle of one Job."""

from __future__ import annotations

import gc
import weakref

import shiboken6

from ram_desktop.gui.harness import soak
from ram_desktop.gui.worker import Job


class Payload:
    """Stands for what a job's function captures (a merge's chart images)."""


def test_a_finished_job_releases_worker_thread_and_captures(qtbot):
    payload = Payload()
    captured = weakref.ref(payload)
    job = Job(lambda reporter, p=payload: id(p))
    worker, thread = job.worker, job.qthread
    del payload
    with qtbot.waitSignal(job.finished, timeout=10000):
        job.start()
    assert job.worker is None and job.qthread is None and not job.is_running() and job.wait(1)
    qtbot.waitUntil(lambda: not shiboken6.isValid(job), timeout=5000)  # deleteLater: gone at the next turn
    assert not shiboken6.isValid(worker) and not shiboken6.isValid(thread)
    job = worker = thread = None
    gc.collect()
    assert captured() is None


def test_short_soak_keeps_no_job_alive(qtbot):
    samples = soak.soak(cycles=15, every=5, out=lambda line: None)
    assert [s.cycle for s in samples] == [5, 10, 15]
    for sample in samples:
        assert max(sample.threads, sample.workers, sample.jobs) <= soak.ONE_JOB, sample.line()
    assert soak.verdict(samples, max_growth_mb=float("inf")) == []


def test_the_first_start_look_at_the_machine_leaves_no_job_behind(qtbot, window):
    """The compute offer looks at the machine once, a second after start, in a job of its own: once it has
    looked, no job object of it stays alive (a kept reference held one for the window's life)."""
    face = window.compute
    before = soak.live_job_objects()[2]
    face._look()
    qtbot.waitUntil(lambda: face.detection is not None, timeout=20000)
    qtbot.wait(100)  # the job deletes itself at the next turn of the event loop
    assert soak.live_job_objects()[2] <= before
