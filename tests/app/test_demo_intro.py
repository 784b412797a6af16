"""The empty chat on the demo model: what it is, example prompts (a click sends one), "Open a model…"; any other model
gets the plain hint."""

from __future__ import annotations

import pytest
from app_fakes import FakeApi, data_dir  # noqa: F401 - fixture
from PySide6.QtWidgets import QFileDialog
from test_window import Harness

from tessera.app import paths


@pytest.fixture
def harness(qtbot, data_dir):  # noqa: F811
    h = Harness(qtbot, FakeApi())
    yield h
    h.close()


def test_demo_model_empty_state(harness, qtbot, monkeypatch):
    w, chat = harness.window, harness.window.chat
    harness.load(str(paths.demo_model()))
    intro = chat.intro
    assert intro is not None and intro.isVisible() and not chat.empty_label.isVisible()
    assert "counts letters" in intro.summary.text()
    prompts = [b.text() for b in intro.example_buttons]
    assert 4 <= len(prompts) <= 6 and "What is 347 + 589?" in prompts
    asked = []
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: asked.append(a) or ("", "")))
    intro.open_button.click()  # "Open a model…": the model panel's file dialog
    assert len(asked) == 1 and w.controller.messages == []
    with qtbot.waitSignal(harness.worker.finished, timeout=10000):
        intro.example_buttons[0].click()
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=5000)
    assert w.controller.messages[0].content == prompts[0] and not intro.isVisible()
    assert chat.prompt.toPlainText() == ""
    w.new_action.trigger()
    assert chat.intro.isVisible()  # a new chat on the demo model shows it again
    harness.load("/models/good.gguf")
    assert chat.intro is None and chat.empty_label.isVisible()


def test_a_refused_example_keeps_what_was_typed(harness, qtbot):
    chat = harness.window.chat
    chat.set_intro(paths.demo_examples())  # shown, but no model is loaded: the send is refused
    chat.prompt.setPlainText("my own draft")
    chat.intro.example_buttons[0].click()
    assert chat.prompt.toPlainText() == "my own draft" and harness.window.controller.messages == []
