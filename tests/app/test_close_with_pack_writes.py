"""Closing the window while a first load's packs are still being written to the packed-weight cache: the window says
what is left and waits (the dialog counts it down), closes by itself once they are written, and Skip gives them up.
Before, the window vanished and the process waited for the disk without a word."""

from __future__ import annotations

import pytest
from app_fakes import FakeApi, data_dir  # noqa: F401 - fixture
from PySide6.QtWidgets import QPushButton
from test_window import Harness

from tessera.app.views.pack_writes_dialog import PackWritesDialog


@pytest.fixture
def harness(qtbot, data_dir):  # noqa: F811
    h = Harness(qtbot, FakeApi())
    yield h
    h.api.pack_writes = 0
    h.close()


def test_close_waits_for_the_writes_and_says_how_much_is_left(harness, qtbot):
    w, api = harness.window, harness.api
    api.pack_writes = 3_000_000_000
    w.close()
    dialog = w.pack_writes_dialog
    assert w.isVisible() and isinstance(dialog, PackWritesDialog)
    qtbot.waitUntil(dialog.isVisible, timeout=2000)
    assert "3.00 GB left to write." in dialog.labelText()
    api.pack_hashing = 1_000_000_000  # a new file version: its keys are hashed before the writes
    qtbot.waitUntil(lambda: "2.00 GB left to write, after hashing 1.00 GB of the model file" in dialog.labelText(),
                    timeout=2000)
    api.pack_writes, api.pack_hashing = 1_250_000_000, 0  # hashed, and the writer got on
    qtbot.waitUntil(lambda: "1.25 GB left to write." in dialog.labelText(), timeout=2000)
    w.close()  # a second close while it waits changes nothing: one dialog, the window stays
    assert w.isVisible() and w.pack_writes_dialog is dialog
    api.pack_writes = 0
    qtbot.waitUntil(lambda: not w.isVisible(), timeout=2000)
    assert not api.writes_skipped


def test_skip_gives_the_writes_up_and_closes(harness, qtbot):
    w, api = harness.window, harness.api
    api.pack_writes = 2_000_000_000
    w.close()
    qtbot.waitUntil(w.pack_writes_dialog.isVisible, timeout=2000)
    (skip,) = [b for b in w.pack_writes_dialog.findChildren(QPushButton) if b.text() == "Skip"]
    skip.click()
    assert api.writes_skipped
    qtbot.waitUntil(lambda: not w.isVisible(), timeout=2000)


def test_nothing_left_to_write_closes_at_once(harness):
    harness.window.close()
    assert not harness.window.isVisible() and harness.window.pack_writes_dialog is None


def test_the_status_bar_shows_the_packs_being_saved(harness):
    w, api = harness.window, harness.api
    api.pack_writes = 1_500_000_000
    w._update_memory()  # what the status bar's 2-second timer runs
    assert w.status.saving_label.text() == "saving packs 1.50 GB" and w.status.saving_label.isVisibleTo(w.status)
    assert "pause while the model answers" in w.status.saving_label.toolTip()
    api.pack_hashing = 1_000_000_000
    w._update_memory()
    assert w.status.saving_label.text() == "saving packs 0.50 GB (hashing first)"
    api.pack_writes = api.pack_hashing = 0
    w._update_memory()
    assert w.status.saving_label.text() == "" and not w.status.saving_label.isVisibleTo(w.status)
