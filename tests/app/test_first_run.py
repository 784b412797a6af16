"""First run and everyday use (issue 15): typed text is never lost, a failed load keeps the working model, the last
model comes back after a restart and every reply names its model, the demo model's empty state."""

from __future__ import annotations

import pytest
from app_fakes import FakeApi, data_dir  # noqa: F401 - fixture
from test_window import Harness


@pytest.fixture
def harness(qtbot, data_dir):  # noqa: F811
    h = Harness(qtbot, FakeApi())
    yield h
    h.close()


def test_refused_send_keeps_the_typed_text(harness):
    chat = harness.window.chat
    chat.prompt.setPlainText("A long question I typed carefully")
    chat.send_button.click()  # no model loaded: refused
    assert chat.prompt.toPlainText() == "A long question I typed carefully"
    assert not chat.notice_label.isHidden() and "No model is loaded" in chat.notice_label.text()
    assert harness.window.controller.messages == []
    harness.load()
    harness.send(chat.prompt.toPlainText())  # accepted: now the box empties
    assert chat.prompt.toPlainText() == ""
    assert harness.window.controller.messages[0].content == "A long question I typed carefully"


def test_an_unreadable_choice_cannot_unload_the_working_model(harness, qtbot):
    w, panel = harness.window, harness.window.model_panel
    harness.load("/models/good.gguf")
    kept = harness.api.sessions[-1]
    assert panel.load_button.text() == "Reload"
    with qtbot.waitSignal(harness.worker.failed, timeout=5000):
        panel.choose("/models/bad.gguf")  # its header cannot be read
    qtbot.waitUntil(lambda: panel.unreadable, timeout=3000)
    assert not panel.load_button.isEnabled() and "could not be read" in panel.load_button.toolTip()
    assert panel.load_button.text() == "Load"  # not "Reload": the choice is another model
    assert "bad magic" in panel.error_label.text()
    with qtbot.waitSignal(w.model_ready, timeout=3000) as sig:
        w.load_model("/models/bad.gguf")  # e.g. from a menu: refused before the worker unloads anything
    assert sig.args[0] is False and w.state.loaded and w.state.path == "/models/good.gguf" and not kept.closed
    assert "the loaded model stays" in w.status.message_text
    harness.send("still there?")
    assert w.controller.messages[-1].content == "Hello there!"
    panel.choose("/models/other.gguf")  # a readable choice enables Load again
    assert panel.load_button.isEnabled()


@pytest.mark.parametrize("accept", [False, True])
def test_cuda_without_cuda_asks_before_unloading(harness, qtbot, accept):
    from PySide6.QtWidgets import QMessageBox

    w = harness.window
    harness.load("/models/good.gguf")
    qtbot.waitUntil(lambda: w.backend_list is not None, timeout=3000)  # the fake reports device "cpu"
    harness.settings.set("gpu/use", "cuda")
    w.load_model("/models/second.gguf")
    box = w.error_box
    assert box is not None and box.isVisible() and "no CUDA device is available" in box.text()
    assert len(harness.api.sessions) == 1 and not harness.api.sessions[0].closed  # nothing unloaded yet
    with qtbot.waitSignal(w.model_ready, timeout=5000) as sig:
        box.button(QMessageBox.StandardButton.Yes if accept else QMessageBox.StandardButton.No).click()
    if accept:
        assert sig.args[0] is True and w.state.path == "/models/second.gguf"
        assert harness.settings.get("gpu/use") == "off"
    else:
        assert sig.args[0] is False and w.state.path == "/models/good.gguf" and not harness.api.sessions[0].closed


def test_settings_marks_cuda_unavailable_with_the_reason(harness, qtbot):
    from dataclasses import replace

    w = harness.window
    qtbot.waitUntil(lambda: w.backend_list is not None, timeout=3000)
    w.on_backends(replace(w.backend_list, cuda_reason="no CUDA device is available: torch 2.13.0+cpu is a CPU build"))
    dialog = w.open_settings()
    combo = dialog.editors["gpu/use"]
    cuda = combo.findText("cuda")
    assert not combo.model().item(cuda).isEnabled() and combo.model().item(combo.findText("twin")).isEnabled()
    from PySide6.QtCore import Qt

    assert "torch 2.13.0+cpu is a CPU build" in combo.itemData(cuda, Qt.ItemDataRole.ToolTipRole)
    assert dialog.gpu_note.text() == ("GPU use cuda is unavailable here: no CUDA device is available: "
                                      "torch 2.13.0+cpu is a CPU build")
    gpu = replace(w.backend_list, device="cuda:0 (NVIDIA RTX 4090)", cuda_reason="")
    dialog.set_gpu_status(gpu)
    assert combo.model().item(cuda).isEnabled() and "RTX 4090" in dialog.gpu_note.text()
    dialog.reject()


def test_model_panel_states(harness, qtbot):
    """Load vs Reload follows what is loaded; a made test model shows its path once loaded; double-click on a recent
    model loads it."""
    w, panel = harness.window, harness.window.model_panel
    harness.load("/models/first.gguf")
    harness.load("/models/second.gguf")
    panel.choose("/models/converted.gguf")  # e.g. what the conversion wizard just wrote
    assert panel.load_button.text() == "Load" and panel.load_button.isEnabled()
    recent = [panel.recent.item(i).data(0x0100) for i in range(panel.recent.count())]
    assert recent[:2] == ["/models/second.gguf", "/models/first.gguf"]
    with qtbot.waitSignal(w.model_ready, timeout=5000) as sig:
        panel.recent.itemActivated.emit(panel.recent.item(1))  # what a double-click or Enter sends
    assert sig.args[0] is True and w.state.path == "/models/first.gguf" and panel.load_button.text() == "Reload"
    with qtbot.waitSignal(w.model_ready, timeout=5000):
        w.make_test_drive()
    assert not panel.path_label.text().startswith("Making") and panel.path_label.text() == w.state.path


def test_startup_reopens_the_last_model_by_default(harness, tmp_path):
    from tessera.app import paths

    last = tmp_path / "last.gguf"
    last.write_bytes(b"GGUF")
    settings = harness.settings
    assert settings.get("model/reopen_last") is True  # on by default
    assert paths.startup_model([str(last), "/gone/older.gguf"], True) == last
    assert paths.startup_model([str(last)], False) == paths.demo_model()  # setting off: the demo model
    assert paths.startup_model(["/gone/deleted.gguf"], True) == paths.demo_model()  # file gone: the demo model
    assert paths.startup_model([], True) == paths.demo_model()


def test_each_reply_names_its_model_and_a_switch_is_said(harness, qtbot):
    w = harness.window
    harness.load("/models/good.gguf")
    harness.send("first")
    first = w.chat.widgets[1]
    assert "good.gguf" in first.role_label.text() and "continues" not in first.role_label.text()
    harness.load("/models/other.gguf")  # the same chat stays open
    assert "written by good.gguf; the next reply comes from other.gguf" in w.chat.notice_label.text()
    harness.send("second")
    second = w.chat.widgets[3]
    assert "other.gguf" in second.role_label.text()
    assert "continues a chat written by good.gguf" in second.role_label.text()
    harness.send("third")  # same model as the reply before: no note
    assert "continues" not in w.chat.widgets[5].role_label.text()
    stored = harness.store.messages(w.controller.conversation_id)
    assert [m.metrics.get("model") for m in stored if m.role == "assistant"] == ["good.gguf", "other.gguf",
                                                                                 "other.gguf"]
    assert stored[3].metrics["continued_from"] == "good.gguf" and stored[3].metrics["stop_reason"] == "eos"
    conv = w.controller.conversation_id
    w.controller.new_conversation()
    harness.load("/models/good.gguf")
    w.controller.open_conversation(conv)  # an old chat opened on another model says so
    assert "written by other.gguf; the next reply comes from good.gguf" in w.chat.notice_label.text()


def test_status_bar_messages_do_not_run_into_the_labels(harness):
    w = harness.window
    harness.load("/models/good.gguf")
    bar = w.status
    assert bar.backend_label.text() == "backend AVX512"  # the reason once, on hover, not twice in the bar
    assert "best available" in bar.backend_label.toolTip()
    assert not bar.threads_label.isHidden() and bar.speed_label.isHidden()  # empty labels take no room
    long = "Loaded a model whose name is very long " * 12
    w.resize(900, 600)
    bar.showMessage(long, 5000)
    shown = bar.currentMessage()
    assert shown.endswith("…") and len(shown) < len(long) and bar.message_text == long and bar.toolTip() == long
    room = bar.width() - sum(lab.width() for lab in bar._permanent() if lab.isVisible())
    assert bar.fontMetrics().horizontalAdvance(shown) <= room
    bar.showMessage("short", 5000)
    assert bar.currentMessage() == "short" and bar.toolTip() == ""


def test_interrupted_replies_notice_stays_in_the_chat(qtbot, data_dir):  # noqa: F811
    from tessera.app import paths
    from tessera.app.store import ConversationStore, Message

    store = ConversationStore(paths.database_path())
    conv = store.create_conversation("killed", "good.gguf")
    store.add_message(conv.id, Message("user", "hi"))
    store.add_message(conv.id, Message("assistant", "par", state="streaming"))
    store.close()
    h = Harness(qtbot, FakeApi())  # opens the store again: the streaming reply is recovered as interrupted
    try:
        w = h.window
        assert "1 reply was interrupted when the app last stopped" in w.chat.notice_label.text()
        h.load("/models/good.gguf")  # loading shows its own status message; the notice stays
        assert "1 reply was interrupted" in w.chat.notice_label.text() and not w.chat.notice_label.isHidden()
    finally:
        h.close()


def test_edit_dialog_plural_and_tab(harness, qtbot, monkeypatch):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QPlainTextEdit

    from tessera.app.views.chat_view import EditDialog

    w, chat = harness.window, harness.window.chat
    harness.load()
    harness.send("first question")
    asked = []
    monkeypatch.setattr(chat, "ask_edit", lambda text: "edited")
    monkeypatch.setattr(chat, "confirm", lambda q: asked.append(q) or False)
    chat._action("edit", 0)
    assert asked == ["Editing this message removes the message after it. Continue?"]
    # Tab leaves the message box; Ctrl+Tab types a tab
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow, timeout=2000)
    chat.prompt.setFocus()
    qtbot.waitUntil(chat.prompt.hasFocus, timeout=2000)
    qtbot.keyClick(chat.prompt, Qt.Key.Key_Tab, Qt.KeyboardModifier.ControlModifier)
    assert chat.prompt.toPlainText() == "\t" and chat.prompt.hasFocus()
    qtbot.keyClick(chat.prompt, Qt.Key.Key_Tab)
    assert not chat.prompt.hasFocus() and chat.prompt.toPlainText() == "\t"
    dialog = EditDialog("a long message " * 40, chat)
    qtbot.addWidget(dialog)
    assert dialog.width() >= 600 and dialog.editor.lineWrapMode() == QPlainTextEdit.LineWrapMode.WidgetWidth
    assert dialog.text().startswith("a long message")


def test_dialogs_start_at_home_and_exports_are_readable(harness, qtbot, monkeypatch, tmp_path):
    import os
    import stat
    from pathlib import Path

    from PySide6.QtWidgets import QFileDialog

    from tessera.app import paths

    w, panel = harness.window, harness.window.model_panel
    seen = []
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a: seen.append(a[2]) or ("", "")))
    panel.choose_file()
    assert seen == [str(Path.home())]  # not the source checkout ./run.sh runs in
    harness.load(str(paths.demo_model()))  # the demo lives in the checkout: still home
    panel.choose_file()
    models = tmp_path / "models"
    models.mkdir()
    harness.load(str(models / "mine.gguf"))
    panel.choose_file()
    assert seen[1:] == [str(Path.home()), str(models)]
    harness.send("export me")
    out = tmp_path / "exports" / "chat.md"
    out.parent.mkdir()
    starts = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a: starts.append(a[2]) or (str(out), "")))
    w.export(w.controller.conversation_id, "markdown")
    w.export(w.controller.conversation_id, "markdown")
    assert Path(starts[0]).parent == Path.home() and Path(starts[1]).parent == out.parent  # then the last folder
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask  # 0644 with the usual umask, not mkstemp's 0600


def test_sidebar_elides_searches_with_snippets_and_retitles_after_an_edit(harness, qtbot, monkeypatch):
    from PySide6.QtCore import Qt

    w, side = harness.window, harness.window.sidebar
    harness.load()
    long = "Please explain in great detail how the routed experts of a mixture of experts model are chosen"
    harness.send(long)
    assert side.list.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff
    assert side.list.textElideMode() == Qt.TextElideMode.ElideRight
    title = harness.store.conversation(w.controller.conversation_id).title
    assert title == long[:48]
    side.search.setText("routed experts")
    qtbot.waitUntil(lambda: any("\n" in side.list.item(i).text() for i in range(side.list.count())), timeout=3000)
    item = next(side.list.item(i) for i in range(side.list.count()) if side.list.item(i).data(Qt.ItemDataRole.UserRole))
    assert item.text().startswith(title + "\n") and "routed experts of a mixture" in item.text()
    assert item.text().rstrip().endswith("…")  # cut around the match
    side.search.setText("")
    qtbot.waitUntil(lambda: all("\n" not in side.list.item(i).text() for i in range(side.list.count())), timeout=3000)
    # editing the first message renames a title that was made from it (a title the user chose stays)
    monkeypatch.setattr(w.chat, "ask_edit", lambda text: "How are experts chosen?")
    monkeypatch.setattr(w.chat, "confirm", lambda q: True)
    with qtbot.waitSignal(harness.worker.finished, timeout=10000):
        w.chat._action("edit", 0)
    assert harness.store.conversation(w.controller.conversation_id).title == "How are experts chosen?"
    w.controller.rename(w.controller.conversation_id, "My experts chat")
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=5000)
    monkeypatch.setattr(w.chat, "ask_edit", lambda text: "Something else")
    with qtbot.waitSignal(harness.worker.finished, timeout=10000):
        w.chat._action("edit", 0)
    assert harness.store.conversation(w.controller.conversation_id).title == "My experts chat"


def test_side_docks_can_be_widened(harness):
    w = harness.window
    assert w.centralWidget().minimumSizeHint().width() <= 450  # leaves room to widen a dock in a 1280 px window


@pytest.mark.parametrize("case", ["unreadable", "no cuda"])
def test_the_worker_keeps_the_loaded_model_when_the_new_one_cannot_load(harness, qtbot, case):
    """Below the window's own checks: a load the worker can tell will fail leaves the loaded model loaded."""
    worker = harness.worker
    harness.load("/models/good.gguf")
    kept = harness.api.sessions[-1]
    states = []
    worker.state_changed.connect(states.append)
    with qtbot.waitSignal(worker.failed, timeout=5000) as sig:
        if case == "unreadable":
            worker.load("/models/bad.gguf")
        else:
            worker.load("/models/second.gguf", gpu_use="cuda")
    error = sig.args[0]
    if case == "unreadable":
        assert "bad magic" in error.text
    else:
        assert error.subject == "placement" and "torch 0.0+fake is a CPU build" in error.text
    qtbot.wait(100)
    assert not kept.closed and len(harness.api.sessions) == 1 and states == []  # still loaded, nothing changed
    harness.send("still there?")
    assert harness.window.controller.messages[-1].content == "Hello there!"


def test_convert_wizard_names_the_bf16_loss_and_opens_the_result(harness, qtbot):
    from tessera.app.wizards.convert_wizard import bf16_label

    assert bf16_label(["BF16"]) == "BF16 — an exact copy of the BF16 checkpoint"
    assert "half the size, rounds the F32 weights to 8 significant bits" in bf16_label(["BF16", "F32"])
    assert "rounds the F16 weights" in bf16_label(["F16"]) and "half the size" not in bf16_label(["F16"])
    w = harness.window
    wizard = w.open_wizard("convert")
    wizard.run_page.result = {"path": "/models/converted.gguf"}
    closed = []
    wizard.finished.connect(closed.append)
    with qtbot.waitSignal(w.model_ready, timeout=5000) as sig:
        wizard.done_page.open_button.click()  # "Open it now" on the Done page
    assert sig.args[0] is True and w.state.path == "/models/converted.gguf" and closed  # loaded; the wizard closed

