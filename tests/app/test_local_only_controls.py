"""Issue 14: while chatting through a remote server, the model panel's local controls and the local-only settings are
greyed out with the reason, and they follow every change of engine (remote -> local -> remote) while the settings
dialog is open, not only when it is built. Issue 13: Settings shows the packed-weight cache's size with a Clear
button, answered by the worker (the dialog never touches the engine)."""

from __future__ import annotations

import pytest
from app_fakes import FakeApi, data_dir  # noqa: F401 - fixture

from tessera.app import paths
from tessera.app.main_window import MainWindow
from tessera.app.payloads import ModelState
from tessera.app.settings import Settings
from tessera.app.store import ConversationStore
from tessera.app.views.settings_dialog import LOCAL_ONLY
from tessera.app.worker import EngineWorker

REMOTE = ModelState(True, "http://gpu-box:8000/v1", "Qwen3-235B-A22B (remote)", "remote",
                    "an OpenAI-compatible server at http://gpu-box:8000/v1", "remote")
LOCAL = ModelState(True, "/models/a.gguf", "a.gguf", "AVX512", "as asked", "cpu", 2, 2048)


def make_window(qtbot, worker) -> MainWindow:
    window = MainWindow(Settings(paths.settings_path()), ConversationStore(paths.database_path()), worker)
    qtbot.addWidget(window)
    return window


@pytest.fixture
def window(qtbot, data_dir):  # noqa: F811
    worker = EngineWorker(FakeApi())
    worker.start()
    w = make_window(qtbot, worker)
    yield w
    w.close()
    worker.shutdown()


def local_only_enabled(dialog) -> set[bool]:
    return {dialog.editors[k].isEnabled() for k in LOCAL_ONLY}


def test_settings_follow_the_engine_while_the_dialog_is_open(window):
    dialog = window.open_settings()
    assert local_only_enabled(dialog) == {True} and dialog.remote_note.isHidden()
    threads_tip = dialog.editors["model/threads"].toolTip()
    window.on_state(REMOTE)  # what the worker's state_changed delivers after connect_remote
    assert local_only_enabled(dialog) == {False} and not dialog.remote_note.isHidden()
    assert "remote server" in dialog.remote_note.text()
    assert dialog.editors["model/threads"].toolTip() == dialog.remote_note.text()
    assert dialog.editors["sampling/temperature"].isEnabled()  # sent to the server with each request
    window.on_state(LOCAL)
    assert local_only_enabled(dialog) == {True} and dialog.remote_note.isHidden()
    assert dialog.editors["model/threads"].toolTip() == threads_tip
    window.on_state(REMOTE)
    dialog.close()  # built again on the next open, in the mode of that moment
    again = window.open_settings()
    assert local_only_enabled(again) == {False} and "remote server" in again.remote_note.text()
    again.close()


def test_model_panel_greys_out_local_controls_with_the_reason(window):
    panel = window.model_panel
    window.on_state(REMOTE)
    local_controls = (panel.open_file_button, panel.open_dir_button, panel.recent, panel.load_button)
    assert not any(w.isEnabled() for w in local_controls)
    assert "remote server at http://gpu-box:8000/v1" in panel.remote_label.text() and not panel.remote_label.isHidden()
    assert panel.load_button.toolTip() == panel.remote_label.text() == panel.open_file_button.toolTip()
    assert panel.unload_button.isEnabled() and panel.unload_button.text() == "Disconnect"
    window.on_state(ModelState(False))  # disconnected: a local model can be opened again
    assert panel.open_file_button.isEnabled() and panel.recent.isEnabled() and panel.remote_label.isHidden()
    assert panel.unload_button.text() == "Unload" and panel.open_file_button.toolTip() == ""


def test_pack_cache_size_and_clear_through_the_worker(qtbot, data_dir, tmp_path, monkeypatch):  # noqa: F811
    root = tmp_path / "packed"
    monkeypatch.setenv("TESSERA_PACK_CACHE_DIR", str(root))
    monkeypatch.setenv("TESSERA_PACK_CACHE_BUDGET", "10G")  # with no model cached yet the rule's budget is not set
    (root / "layers").mkdir(parents=True)
    (root / "models").mkdir()
    (root / "layers" / "a.pack").write_bytes(b"x" * 1500)
    (root / "layers" / "b.pack").write_bytes(b"y" * 2500)
    (root / "models" / "m.json").write_text("{}")
    (root / "notes.txt").write_text("not the cache's")  # a user's file in the folder stays
    worker = EngineWorker()  # the real engine's PackCache on that folder
    worker.start()
    window = make_window(qtbot, worker)
    try:
        with qtbot.waitSignal(worker.pack_cache, timeout=30000) as sig:
            dialog = window.open_settings()
        assert sig.args[0].held_bytes == 4000 and sig.args[0].folder == str(root)
        budget = sig.args[0].budget_text  # the engine's own budget rule on this disk, with where it comes from
        assert budget == "10.74 GB" and sig.args[0].budget_why == "set by TESSERA_PACK_CACHE_BUDGET"
        qtbot.waitUntil(lambda: dialog.cache_label.text() == f"4.00 kB of a {budget} budget", timeout=5000)
        assert dialog.cache_label.toolTip() == f"{root}\nBudget: {sig.args[0].budget_why}"
        assert dialog.cache_button.isEnabled()
        with qtbot.waitSignal(worker.pack_cache, timeout=30000) as sig:
            dialog.cache_button.click()
        assert sig.args[0].freed_bytes >= 4000 and sig.args[0].held_bytes == 0
        qtbot.waitUntil(lambda: dialog.cache_label.text().startswith("0 bytes of a ") and "(cleared 4." in
                        dialog.cache_label.text(), timeout=5000)
        assert not dialog.cache_button.isEnabled()  # nothing left to clear
        assert not list((root / "layers").iterdir()) and (root / "notes.txt").exists()
        dialog.close()
    finally:
        window.close()
        worker.shutdown()


def test_clearing_the_cache_gives_up_the_packs_a_first_load_has_not_written(tmp_path, monkeypatch):
    """Clear while a first load's packs wait to be written (they pause while a reply is generated): none of them
    lands in the folder afterwards."""
    import torch

    import tessera.engine.native as N
    from tessera.app.worker import EngineApi
    from tessera.engine import pack_cache, pack_store
    from tessera.engine.experts import LayerExperts

    root = tmp_path / "packed"
    monkeypatch.setenv("TESSERA_PACK_CACHE_DIR", str(root))
    monkeypatch.setattr(pack_cache, "_STORE_PIECE", 4096)
    w = lambda *s: torch.randn(*s, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)  # noqa: E731
    layers = {i: LayerExperts(w(4, 32, 64), w(4, 32, 64), w(4, 64, 32)) for i in range(3)}
    with pack_store.generating():
        b = N.make_backend("Reference", layers, threads=1, cache_dir=root, model_id="m", store_in_background=True)
        assert b.stores.pending_bytes() > 0
        folder, held, freed, _, _ = EngineApi().pack_cache(clear=True)
        assert folder == str(root) and held == 0 and freed >= 0 and b.stores.pending_bytes() == 0  # none left to land
    b.stores.wait()
    assert not [p for p in root.rglob("*") if p.suffix == ".pack" or ".tmp" in p.name]
