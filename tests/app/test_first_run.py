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
