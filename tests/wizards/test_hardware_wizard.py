"""HardwareWizard under pytest-qt: the probe runs off the UI thread with progress, the report exports, cancel works."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtGui import QGuiApplication

from tessera.app.wizards.hardware_wizard import HardwareWizard


@pytest.fixture
def wizard(qtbot):
    w = HardwareWizard(seconds=0.1)
    qtbot.addWidget(w)
    w.show()
    yield w
    w.probe_page.wait_for_job()


def test_probe_runs_off_the_ui_thread_and_reports(wizard, qtbot, tmp_path):
    wizard.intro.gpu.setChecked(False)
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start(20)
    progress = []
    with qtbot.waitSignal(wizard.report_ready, timeout=120_000) as blocker:
        wizard.next()
        assert wizard.currentPage() is wizard.probe_page
        assert wizard.probe_page.job.isRunning() and not wizard.probe_page.isComplete()
        wizard.probe_page.job.progressed.connect(lambda *a: progress.append(a))
    timer.stop()
    report = blocker.args[0]
    assert len(ticks) >= 3  # the UI thread kept running its event loop during the probe
    assert progress and progress[-1][0] == progress[-1][1]  # the last event completes the bar
    assert report["memory"]["read_bandwidth_gbs"] > 0 and "avx512_bf16" in report["cpu"]["flags"]
    assert report["gpu_status"].startswith("GPU probe skipped")
    assert report["model"]["name"] == "Qwen3-30B-A3B"  # the intro page's default choice
    qtbot.waitUntil(wizard.probe_page.isComplete)
    wizard.next()
    page = wizard.result_page
    assert wizard.currentPage() is page
    html = page.view.toPlainText()
    assert f"Auto will use {report['auto_backend']}" in html and "Remedies" in html and "Backends" in html
    assert "Kernel tuning" in html and "spin_us" in html  # measured on this CPU, or the defaults and why
    md = page.save(tmp_path / "report.md")
    assert md.read_text().startswith("# Tessera hardware report")
    js = page.save(tmp_path / "report.json")
    assert json.loads(js.read_text())["auto_backend"] == report["auto_backend"]
    page.copy_to_clipboard()
    assert QGuiApplication.clipboard().text().startswith("# Tessera hardware report")
    assert wizard.report == report


def test_file_choice_needs_a_path(wizard):
    wizard.intro.file_radio.setChecked(True)
    assert not wizard.intro.isComplete()
    wizard.intro.path.setText("/some/model.gguf")
    assert wizard.intro.isComplete()
    assert wizard.intro.options()["model"] == "/some/model.gguf" and wizard.intro.options()["preset"] is None


def test_bad_model_path_is_a_named_error(wizard, qtbot, tmp_path):
    wizard.intro.path.setText(str(tmp_path / "missing.gguf"))
    with qtbot.waitSignal(wizard.probe_page.finished_bad, timeout=60_000) as blocker:
        wizard.next()
    assert f"{tmp_path / 'missing.gguf'}: no such file or folder" in blocker.args[0]
    assert not wizard.probe_page.isComplete() and wizard.probe_page.error.isVisible()


def test_cancel_stops_the_probe(qtbot):
    w = HardwareWizard(seconds=1.0)
    qtbot.addWidget(w)
    w.show()
    w.intro.none_radio.setChecked(True)
    with qtbot.waitSignal(w.probe_page.finished_bad, timeout=60_000) as blocker:
        w.next()
        w.probe_page.cancel_button.click()
    assert blocker.args[0].startswith("Cancelled")
    assert w.probe_page.result is None and not w.probe_page.isComplete()
    w.probe_page.wait_for_job()
    assert not w.probe_page.job.isRunning()
