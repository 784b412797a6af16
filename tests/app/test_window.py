"""The main window wired to a worker running the engine test double: load errors, streaming chat, stop, edit,
regenerate, backend switch mid-conversation, graphs fed by a generation, history across a restart."""

from __future__ import annotations

import pytest
from app_fakes import FakeApi, data_dir  # noqa: F401 - fixture

from tessera.app import paths
from tessera.app.main_window import MainWindow
from tessera.app.settings import Settings
from tessera.app.store import ConversationStore
from tessera.app.worker import EngineWorker


class Harness:
    def __init__(self, qtbot, api: FakeApi):
        self.qtbot = qtbot
        self.api = api
        self.settings = Settings(paths.settings_path())
        self.settings.set("sampling/max_tokens", 64)
        self.store = ConversationStore(paths.database_path())
        self.worker = EngineWorker(api)
        self.worker.start()
        self.window = MainWindow(self.settings, self.store, self.worker)
        qtbot.addWidget(self.window)
        self.window.show()

    def load(self, path="/models/good.gguf", ok=True):
        with self.qtbot.waitSignal(self.window.model_ready, timeout=5000) as sig:
            self.window.load_model(path)
        assert sig.args[0] is ok
        return sig.args[0]

    def send(self, text: str):
        chat = self.window.chat
        with self.qtbot.waitSignal(self.worker.finished, timeout=10000):
            chat.prompt.setPlainText(text)
            chat.send_button.click()
        self.qtbot.waitUntil(lambda: not self.window.controller.busy, timeout=5000)
        chat.flush()

    def close(self):
        self.window.close()
        self.worker.shutdown()
        self.store.close()


@pytest.fixture
def harness(qtbot, data_dir):  # noqa: F811
    h = Harness(qtbot, FakeApi())
    yield h
    h.close()


def test_welcome_page_without_a_model(harness):
    w = harness.window
    assert w.pages.currentWidget() is w.welcome
    assert w.welcome.buttons["open"].isEnabled() and w.welcome.buttons["test_drive"].isEnabled()
    assert w.welcome.buttons["open"].accessibleName()


def test_failing_load_shows_the_error_and_the_window_stays_usable(harness):
    w = harness.window
    harness.load("/models/bad.gguf", ok=False)
    assert w.error_box is not None and w.error_box.isVisible()
    assert "/models/bad.gguf: not a GGUF file (bad magic)" in w.error_box.text()
    assert w.model_panel.error_label.isVisible() and "bad magic" in w.model_panel.error_label.text()
    w.error_box.accept()
    harness.load("/models/good.gguf")
    assert w.pages.currentWidget() is w.chat and w.status.backend_label.text().startswith("backend AVX512")
    harness.send("Hello?")
    assert w.controller.messages[-1].content == "Hello there!"


def test_streaming_reply_thinking_footer_and_graphs(harness):
    w = harness.window
    harness.load()
    chunks = []
    harness.worker.tokens.connect(chunks.append)
    harness.send("Say hello")
    msgs = w.controller.messages
    assert [m.role for m in msgs] == ["user", "assistant"]
    reply = msgs[1]
    assert (reply.thinking, reply.content, reply.state) == ("let me think", "Hello there!", "done")
    assert reply.thinking_s is not None
    widget = w.chat.widgets[1]
    assert widget.think_toggle.isVisible() and widget.think_toggle.text().startswith("Thought for")
    assert not widget.think_body.isVisible()
    widget.think_toggle.click()
    assert widget.think_body.isVisible() and widget.think_body.text() == "let me think"
    assert "25.0 tok/s" in widget.footer.text() and "stop: eos" in widget.footer.text()
    assert "20 ms to first token" in widget.footer.text()
    assert "Hello there!" in widget.body.toPlainText()
    g = w.graphs
    assert g.requests == 1 and g.ttft == [pytest.approx(20.0)] and len(g.prefix_hit) == 1  # ms
    assert g.decode_y and g.prefill_y == [pytest.approx(c.steps[0].tokens / 0.01) for c in chunks[:1]]
    assert len(g.decode_curve.getData()[1]) == len(g.decode_y)
    assert g.expert_label.text() == "Expert cache: no GPU expert cache" and g.expert_curve.getData()[0] is None
    assert "GB/s" in g.bandwidth_label.text()
    assert "25.0 tok/s" in w.status.speed_label.text()
    assert "context" in w.chat.context_meter.text() and w.chat.context_meter.value() > 0
    stored = harness.store.messages(w.controller.conversation_id)
    assert stored[1].content == "Hello there!" and stored[1].metrics["stop_reason"] == "eos"


def test_stop_mid_stream_keeps_the_partial_reply(harness, qtbot):
    w = harness.window
    harness.load()
    session = harness.api.sessions[-1]
    session.reply_words = ["word "] * 1000
    session.token_delay = 0.01
    harness.settings.set("sampling/max_tokens", 1000)
    w.chat.prompt.setPlainText("Talk")
    w.chat.send_button.click()
    qtbot.waitUntil(lambda: w.controller.messages and w.controller.messages[-1].content.count("word") >= 3,
                    timeout=5000)
    assert w.chat.stop_button.isEnabled() and not w.chat.send_button.isEnabled()
    w.chat.stop_button.click()
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=5000)
    reply = w.controller.messages[-1]
    assert reply.state == "stopped" and 3 <= reply.content.count("word") < 1000
    assert harness.store.messages(w.controller.conversation_id)[-1].state == "stopped"


def test_edit_and_regenerate(harness, monkeypatch):
    w = harness.window
    harness.load()
    harness.send("first question")
    harness.send("second question")
    assert len(w.controller.messages) == 4
    # regenerate: the last reply is replaced, the history sent is unchanged
    with harness.qtbot.waitSignal(harness.worker.finished, timeout=5000):
        w.chat.widgets[3].regen_button.click()
    harness.qtbot.waitUntil(lambda: not w.controller.busy)
    calls = harness.api.sessions[-1].calls
    assert calls[-1]["messages"] == calls[-2]["messages"] and len(w.controller.messages) == 4
    # edit the first question: asks, confirms, drops later turns
    monkeypatch.setattr(w.chat, "ask_edit", lambda text: "edited question")
    asked = []
    monkeypatch.setattr(w.chat, "confirm", lambda q: asked.append(q) or True)
    with harness.qtbot.waitSignal(harness.worker.finished, timeout=5000):
        w.chat.widgets[0].edit_button.click()
    harness.qtbot.waitUntil(lambda: not w.controller.busy)
    assert "removes the 3 messages after it" in asked[0]
    assert [m.content for m in w.controller.messages] == ["edited question", "Hello there!"]
    assert calls[-1]["messages"] == [{"role": "user", "content": "edited question"}]
    assert [m.content for m in harness.store.messages(w.controller.conversation_id)] == ["edited question",
                                                                                          "Hello there!"]


def test_backend_switch_mid_conversation_keeps_it(harness, qtbot):
    w = harness.window
    harness.load()
    harness.send("remember the number 7")
    session = harness.api.sessions[-1]
    with qtbot.waitSignal(harness.worker.state_changed, timeout=5000) as sig:
        harness.settings.set("model/backend", "Reference")
    assert sig.args[0].backend == "Reference"
    qtbot.waitUntil(lambda: w.state.backend == "Reference", timeout=3000)
    assert w.status.backend_label.text() == "backend Reference" and "as asked" in w.status.backend_label.toolTip()
    assert len(w.chat.widgets) == 2 and harness.api.sessions[-1] is session  # same session, same transcript
    harness.send("which number?")
    last = session.calls[-1]
    assert last["backend"] == "Reference"
    assert [m["content"] for m in last["messages"]] == ["remember the number 7", "Hello there!", "which number?"]
    assert w.controller.messages[-1].metrics["backend"] == "Reference"


def test_unavailable_backend_switch_is_reported(harness, qtbot):
    w = harness.window
    harness.load()
    with qtbot.waitSignal(harness.worker.failed, timeout=5000):
        harness.settings.set("model/backend", "AMXInt8")
    qtbot.waitUntil(lambda: w.error_box is not None and w.error_box.isVisible())
    assert "amx_int8" in w.error_box.text() and w.state.backend == "AVX512"


def test_thinking_toggle_is_sent(harness):
    w = harness.window
    harness.load()
    w.chat.thinking_box.setChecked(False)
    harness.send("no thinking please")
    assert harness.api.sessions[-1].calls[-1]["enable_thinking"] is False
    assert w.controller.messages[-1].thinking == "" and w.controller.messages[-1].content == "Hello there!"


def test_history_survives_a_restart(qtbot, data_dir):  # noqa: F811
    h = Harness(qtbot, FakeApi())
    h.settings.set("chat/system_prompt", "Be brief.")
    h.load()
    h.send("What is MoE?")
    cid = h.window.controller.conversation_id
    h.close()
    h2 = Harness(qtbot, FakeApi())
    try:
        w = h2.window
        assert w.sidebar.ids() == [cid]
        w.sidebar.open_requested.emit(cid)
        assert [m.role for m in w.controller.messages] == ["system", "user", "assistant"]
        assert w.controller.messages[2].content == "Hello there!" and len(w.chat.widgets) == 3
        assert w.pages.currentWidget() is w.chat
        h2.load()
        h2.send("And then?")  # continues the restored conversation
        sent = h2.api.sessions[-1].calls[-1]["messages"]
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    finally:
        h2.close()


def test_sidebar_search_rename_delete(harness):
    w = harness.window
    harness.load()
    harness.send("alpha topic")
    w.controller.new_conversation()
    harness.send("beta topic")
    assert len(w.sidebar.ids()) == 2
    w.sidebar.search.setText("alpha")
    harness.qtbot.waitUntil(lambda: len(w.sidebar.ids()) == 1, timeout=3000)
    cid = w.sidebar.ids()[0]
    w.sidebar.rename_requested.emit(cid, "Renamed")
    assert harness.store.conversation(cid).title == "Renamed"
    w.sidebar.search.setText("")
    harness.qtbot.waitUntil(lambda: len(w.sidebar.ids()) == 2, timeout=3000)
    w.sidebar.delete_requested.emit(cid)
    assert len(w.sidebar.ids()) == 1


def test_shortcuts_and_accessible_names(harness):
    w = harness.window
    assert w.new_action.shortcut().toString() == "Ctrl+N"
    assert w.settings_action.shortcut().toString() == "Ctrl+,"
    for widget in (w.chat.prompt, w.chat.send_button, w.chat.stop_button, w.chat.thinking_box, w.chat.context_meter,
                   w.sidebar.search, w.model_panel.load_button, w.model_panel.meta):
        assert widget.accessibleName()


def test_wizards_open_from_the_window_and_report_back(harness):
    w = harness.window
    assert w.welcome.buttons["hardware"].isEnabled() and w.wizard_actions["hardware"].isEnabled()
    wizard = w.open_wizard("hardware")
    try:
        wizard.report_ready.emit({"memory": {"read_bandwidth_gbs": 42.517}})
        assert harness.settings.get("hardware/bandwidth_gbs") == 42.52
        assert "42.5 GB/s" in w.graphs.bandwidth_label.text()
    finally:
        wizard.reject()


def test_ctrl_enter_sends_and_esc_stops(harness, qtbot):
    from PySide6.QtCore import Qt

    w = harness.window
    harness.load()
    session = harness.api.sessions[-1]
    session.reply_words = ["word "] * 1000
    session.token_delay = 0.01
    harness.settings.set("sampling/max_tokens", 1000)
    w.chat.prompt.setFocus()
    w.chat.prompt.setPlainText("keyboard only")
    qtbot.keyClick(w.chat.prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: w.controller.busy and "word" in w.controller.messages[-1].content, timeout=5000)
    assert w.controller.messages[0].content == "keyboard only" and w.chat.prompt.toPlainText() == ""
    qtbot.keyClick(w.chat.prompt, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=5000)
    assert w.controller.messages[-1].state == "stopped"
    w.new_action.trigger()  # Ctrl+N (the key binding itself is checked in test_shortcuts_and_accessible_names)
    assert w.controller.conversation_id == 0 and w.chat.widgets == []


def test_drop_a_model_file_inspects_it_and_shows_the_fit(harness, qtbot, tmp_path):
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent

    w = harness.window
    model = tmp_path / "dropped.gguf"
    model.write_bytes(b"GGUF")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(model))])
    event = QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(harness.worker.inspected, timeout=5000):
        w.model_panel.dropEvent(event)
    qtbot.waitUntil(lambda: w.model_panel.meta.topLevelItemCount() > 0, timeout=3000)
    rows = {w.model_panel.meta.topLevelItem(i).text(0): w.model_panel.meta.topLevelItem(i).text(1)
            for i in range(w.model_panel.meta.topLevelItemCount())}
    assert rows["Architecture"] == "qwen3moe" and rows["Experts"] == "8" and rows["Size on disk"] == "5.0 MB"
    assert rows["Types (share of the file)"] == "F32 100 %" and "ram" not in rows and "type bytes" not in rows
    assert w.model_panel.fit_label.text().startswith("Fits: this load needs about 8.00 MB: weights 5.00 MB + packed")
    assert "GB RAM free" in w.model_panel.fit_label.text()
    settings = (w.settings.get("model/context_length"), w.settings.get("model/backend"))
    assert harness.api.inspected_for == settings  # sized for the load the settings ask for
    assert w.model_panel.load_button.isEnabled()


def test_the_fit_follows_the_backend_and_context_settings(harness, qtbot, tmp_path):
    """Changing the backend or the context length sizes the chosen model's load again (its packed copy, its KV)."""
    w = harness.window
    model = tmp_path / "chosen.gguf"
    model.write_bytes(b"GGUF")
    with qtbot.waitSignal(harness.worker.inspected, timeout=5000):
        w.model_panel.choose(str(model))
    with qtbot.waitSignal(harness.worker.inspected, timeout=5000):
        harness.settings.set("model/context_length", 8192)
    assert harness.api.inspected_for == (8192, harness.settings.get("model/backend"))
    with qtbot.waitSignal(harness.worker.inspected, timeout=5000):
        harness.settings.set("model/backend", "Reference")
    assert harness.api.inspected_for == (8192, "Reference")


def test_a_model_that_will_not_fit_asks_before_loading(harness, qtbot, monkeypatch):
    from tessera.app.fit import estimate

    w = harness.window
    huge = {"ram": {"total_bytes": 10**15}, "ram_text": "about 1000000 GB: weights 1000000 GB", "fit_share": 0.9}
    w.fits["/models/huge.gguf"] = estimate(huge, 16 * 10**9)
    asked = []
    monkeypatch.setattr(w, "confirm_load", lambda text: asked.append(text) or False)
    w.load_model("/models/huge.gguf")
    assert asked and asked[0].startswith("Won't fit") and not harness.api.sessions
    monkeypatch.setattr(w, "confirm_load", lambda text: True)
    with qtbot.waitSignal(w.model_ready, timeout=5000):
        w.load_model("/models/huge.gguf")
    assert w.state.loaded


def test_export_from_the_window(harness, monkeypatch, tmp_path):
    import json

    from PySide6.QtWidgets import QFileDialog

    w = harness.window
    harness.load()
    harness.send("export me")
    out = tmp_path / "out.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(out), "")))
    w.export(w.controller.conversation_id, "json")
    doc = json.loads(out.read_text())
    assert [m["content"] for m in doc["messages"]] == ["export me", "Hello there!"]
    assert doc["messages"][1]["thinking"] == "let me think"
    md = tmp_path / "out.md"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(md), "")))
    w.export(w.controller.conversation_id, "markdown")
    assert "## Assistant" in md.read_text()


def test_cancel_a_load_from_the_model_panel(harness, qtbot):
    w = harness.window
    harness.api.load_delay = 3.0
    w.load_model("/models/slow.gguf")
    assert w.model_panel.cancel_button.isVisibleTo(w.model_panel)
    with qtbot.waitSignal(w.model_ready, timeout=10000) as sig:
        w.model_panel.cancel_button.click()
    assert sig.args[0] is False and not w.state.loaded
    assert w.error_box is None  # a cancel is not an error dialog
    assert "cancelled" in w.model_panel.error_label.text() and w.model_panel.load_button.isEnabled()
    assert w.pages.currentWidget() is w.welcome
