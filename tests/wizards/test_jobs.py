"""Job: the QThread wrapper the wizards run engine work in — one outcome signal each, errors by subject, and jobs
outliving their wizard are kept alive until their thread ends."""

from __future__ import annotations

import threading

from tessera.app.wizards import job_page
from tessera.app.wizards.jobs import Job
from tessera.engine.errors import Cancelled, TesseraError
from tessera.engine.events import ProgressEvent


def _run(qtbot, fn):
    job = Job(fn)
    seen = []
    job.succeeded.connect(lambda r: seen.append(("ok", r)))
    job.failed.connect(lambda s, m: seen.append(("failed", s, m)))
    job.cancelled.connect(lambda: seen.append(("cancelled",)))
    job.progressed.connect(lambda *a: seen.append(("progress", *a)))
    job.start()
    qtbot.waitUntil(lambda: job.isFinished() and any(e[0] != "progress" for e in seen), timeout=10_000)
    return seen


def test_success_with_progress(qtbot):
    def fn(progress, cancel):
        assert threading.current_thread() is not threading.main_thread()
        progress(ProgressEvent("step", 1, 2, "half"))
        return 42

    assert _run(qtbot, fn) == [("progress", 1, 2, "step", "half"), ("ok", 42)]


def test_tessera_error_keeps_its_subject(qtbot):
    def fn(progress, cancel):
        raise TesseraError("/models/x.gguf", "not a GGUF file")

    assert _run(qtbot, fn) == [("failed", "/models/x.gguf", "not a GGUF file")]


def test_unexpected_error_is_reported_not_raised(qtbot):
    def fn(progress, cancel):
        raise ValueError("boom")

    (event,) = _run(qtbot, fn)
    assert event[0] == "failed" and event[1] == "internal error (ValueError)" and "boom" in event[2]


def test_cancel(qtbot):
    def fn(progress, cancel):
        raise Cancelled()

    assert _run(qtbot, fn) == [("cancelled",)]


def test_a_job_outliving_its_wizard_is_kept_until_it_ends(qtbot):
    release = threading.Event()
    job = Job(lambda progress, cancel: release.wait(10))
    job.start()
    job_page.keep_until_finished(job)
    assert job in job_page.kept_jobs() and job.parent() is None
    release.set()
    qtbot.waitUntil(lambda: job not in job_page.kept_jobs(), timeout=10_000)


def test_convert_job_verifies_through_the_apps_backend(tmp_path):
    """The wizard's conversion verifies as `convert --verify` does, through the backend the app runs (Auto where the
    setting names one this machine lacks); a quantized output is judged against its dequantized-F32 twin."""
    from tessera.app.wizards.jobs import convert_model
    from tessera.engine import backends
    from tessera.engine.make_model import make_model

    src = make_model(tmp_path / "src", preset="tiny-kquant", seed=2)
    for backend, ran in (("Reference", "Reference"), ("NoSuchBackend", backends.auto()[0])):
        fn = convert_model(src=str(src), out=str(tmp_path / "q.gguf"), dtype="q4_k_m", verify=True, force=True,
                           backend=backend)
        v = fn(lambda ev: None, threading.Event())["verify"]
        assert v["backend"] == ran and v["passed"] and "dequantized-F32 twin" in v["rule"], v
