"""The "Serve this model" panel with the real worker and the demo model: off until a model is loaded, the toggle
starts a server whose URL, key and model name are shown and copyable, and turning it off stops it.

The worker's signals reach the panel queued to this thread, while pytest-qt's waitSignal handler runs in the worker
thread the moment the signal is emitted: its loop can end before the panel's slot has run. So each step waits for
what the panel shows (qtbot.waitUntil), not for the worker's signal."""

from __future__ import annotations

from pathlib import Path

import httpx
from app_fakes import data_dir  # noqa: F401 - fixture
from PySide6.QtGui import QGuiApplication

from tessera.app.views.serve_panel import ServePanel
from tessera.app.worker import EngineWorker

DEMO = Path(__file__).resolve().parents[2] / "tessera" / "resources" / "demo" / "tessera-demo-moe.gguf"


def test_toggle_serves_and_shows_what_to_copy(qtbot):
    worker = EngineWorker()
    worker.start()
    panel = ServePanel()
    qtbot.addWidget(panel)
    worker.state_changed.connect(panel.set_state)
    errors = []
    worker.failed.connect(errors.append)
    worker.serving.connect(panel.show_state)
    panel.serve_requested.connect(lambda on, network, port: worker.serve(on, network, 0))  # a free port in tests
    try:
        assert not panel.toggle.isEnabled()  # nothing loaded yet
        worker.load(str(DEMO), "Auto", 2, 0)
        qtbot.waitUntil(lambda: panel.toggle.isEnabled() or bool(errors), timeout=60000)
        assert panel.toggle.isEnabled(), errors
        panel.toggle.setChecked(True)
        qtbot.waitUntil(lambda: panel.url.text() != "" or "Not serving" in panel.status.text(), timeout=30000)
        assert panel.toggle.isChecked() and panel.url.text().startswith("http://127.0.0.1:"), panel.status.text()
        assert panel.key.text().startswith("tsk-") and panel.model.text() == "tessera-demo-moe"
        assert not panel.port.isEnabled() and "Serving" in panel.status.text()
        models = httpx.get(panel.url.text() + "/models", headers={"Authorization": f"Bearer {panel.key.text()}"})
        assert models.json()["data"][0]["id"] == "tessera-demo-moe"
        panel.key.copy_button.click()
        assert QGuiApplication.clipboard().text() == panel.key.text()
        url = panel.url.text()
        panel.toggle.setChecked(False)
        qtbot.waitUntil(panel.port.isEnabled, timeout=30000)
        assert panel.url.text() == "" and panel.key.text() == "" and panel.port.isEnabled()
        try:
            httpx.get(url.removesuffix("/v1") + "/health", timeout=5)
            raise AssertionError("still serving after the toggle went off")
        except httpx.ConnectError:
            pass
    finally:
        worker.shutdown()
