"""The Remote dialog with the real worker against a real `serve` on 127.0.0.1: test the connection (models listed),
save the profile (key kept out of the profiles file), then chat through the server."""

from __future__ import annotations

from pathlib import Path

import pytest
from app_fakes import data_dir  # noqa: F401 - fixture

from tessera import engine
from tessera.app.remote_profiles import KeyStore, ProfileStore
from tessera.app.views.remote_dialog import RemoteDialog
from tessera.app.worker import EngineWorker
from tessera.engine.scheduler import EngineScheduler
from tessera.engine.server.app import ServerOptions
from tessera.engine.server.run import ServerThread

DEMO = Path(__file__).resolve().parents[2] / "tessera" / "resources" / "demo" / "tessera-demo-moe.gguf"


@pytest.fixture(scope="module")
def server():
    session = engine.load(DEMO)
    scheduler = EngineScheduler(session)
    srv = ServerThread(scheduler, ServerOptions("tessera-demo-moe", "k3y")).start()
    yield srv
    srv.stop()
    scheduler.close()
    session.close()


def test_profile_test_save_and_connect(qtbot, server, tmp_path):
    worker = EngineWorker()
    worker.start()
    try:
        store = ProfileStore(tmp_path, KeyStore(tmp_path / "remote_keys.json", use_keyring=False))
        dialog = RemoteDialog(store)
        qtbot.addWidget(dialog)
        dialog.test_requested.connect(worker.test_remote)
        worker.remote_checked.connect(dialog.show_check)
        dialog.connect_requested.connect(worker.connect_remote)
        dialog.name.setText("local serve")
        dialog.url.setText(server.url)
        dialog.key.setText("wrong")
        with qtbot.waitSignal(worker.remote_checked, timeout=30000):
            dialog.test_button.click()
        assert "Not reachable" in dialog.status.text() and "401" in dialog.status.text()
        dialog.key.setText("k3y")
        with qtbot.waitSignal(worker.remote_checked, timeout=30000):
            dialog.test_button.click()
        assert "it serves tessera-demo-moe" in dialog.status.text() and dialog.model.currentText() == "tessera-demo-moe"
        with qtbot.waitSignal(worker.state_changed, timeout=30000) as sig:
            dialog.connect_button.click()
        assert sig.args[0].loaded and sig.args[0].backend == "remote"
        assert store.get("local serve").base_url == server.url and store.api_key("local serve") == "k3y"
        assert "k3y" not in store.path.read_text()
        reopened = RemoteDialog(store)
        qtbot.addWidget(reopened)
        assert reopened.profile.currentText() == "local serve" and reopened.key.text() == "k3y"
    finally:
        worker.shutdown()


def test_remote_mode_disables_local_settings_and_keeps_urls_out_of_recent(qtbot, server, data_dir):  # noqa: F811
    from tessera.app import paths
    from tessera.app.main_window import MainWindow
    from tessera.app.settings import Settings
    from tessera.app.store import ConversationStore

    worker = EngineWorker()
    worker.start()
    settings = Settings(paths.settings_path())
    window = MainWindow(settings, ConversationStore(paths.database_path()), worker)
    qtbot.addWidget(window)
    try:
        with qtbot.waitSignal(worker.state_changed, timeout=30000):
            worker.connect_remote(server.url, "k3y", "")
        assert window.state.backend == "remote"
        assert server.url not in (settings.get("recent/models") or [])
        dialog = window.open_settings()
        assert not dialog.editors["model/backend"].isEnabled() and not dialog.editors["model/threads"].isEnabled()
        assert "remote server" in dialog.remote_note.text()
        assert dialog.editors["model/reopen_last"].isEnabled()
        dialog.close()
    finally:
        window.close()
        worker.shutdown()
