"""Keyboard and appearance (issue 15 items 18, 19): a focus ring that can be seen in both themes, the arrow keys reach
a control in Settings, the theme can follow the desktop, and the font size is a setting."""

from __future__ import annotations

import pytest
from app_fakes import BACKENDS, data_dir  # noqa: F401 - fixture
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QCheckBox, QComboBox, QHBoxLayout, QLineEdit, QPushButton, QWidget

from tessera.app import theme
from tessera.app.payloads import BackendList


@pytest.fixture
def themed(qapp):
    yield qapp
    theme.apply_theme(qapp, "light", 0)  # what the other tests run with


def _luminance(c: QColor) -> float:
    def lin(v: float) -> float:
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(c.redF()) + 0.7152 * lin(c.greenF()) + 0.0722 * lin(c.blueF())


def _contrast(a: QColor, b: QColor) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _ring_pixels(widget: QWidget, colour: QColor) -> int:
    image = widget.grab().toImage()
    n = 0
    for y in range(image.height()):
        for x in range(image.width()):
            p = image.pixelColor(x, y)
            if abs(p.red() - colour.red()) + abs(p.green() - colour.green()) + abs(p.blue() - colour.blue()) < 60:
                n += 1
    return n


@pytest.mark.parametrize("shade", ["light", "dark"])
def test_the_focus_ring_contrasts_with_its_theme(themed, shade):
    theme.apply_theme(themed, shade)
    ring, palette = QColor(theme.FOCUS_RING[shade]), themed.palette()
    for role in (QPalette.ColorRole.Window, QPalette.ColorRole.Base, QPalette.ColorRole.Button):
        assert _contrast(ring, palette.color(role)) >= 3.0, (shade, role)


@pytest.mark.parametrize("shade", ["light", "dark"])
@pytest.mark.parametrize("kind", [QPushButton, QCheckBox, QComboBox, QLineEdit])
def test_a_control_reached_with_tab_shows_the_ring(themed, qtbot, shade, kind):
    theme.apply_theme(themed, shade)
    window = QWidget()
    row = QHBoxLayout(window)
    first = QLineEdit("start")
    control = kind("Send") if kind in (QPushButton, QCheckBox) else kind()
    if isinstance(control, QComboBox):
        control.addItems(["one", "two"])
    row.addWidget(first)
    row.addWidget(control)
    qtbot.addWidget(window)
    window.show()
    window.activateWindow()
    first.setFocus()
    qtbot.waitUntil(first.hasFocus, timeout=2000)
    ring = QColor(theme.FOCUS_RING[shade])
    without = _ring_pixels(control, ring)
    qtbot.keyClick(first, Qt.Key.Key_Tab)
    assert control.hasFocus()
    with_ring = _ring_pixels(control, ring)
    perimeter = 2 * (control.width() + control.height())
    assert with_ring >= perimeter * 0.8 and without <= perimeter * 0.1, (with_ring, without, perimeter)


def test_settings_open_on_a_control_and_the_arrow_keys_change_it(qtbot, data_dir):  # noqa: F811
    from tessera.app import paths
    from tessera.app.settings import Settings
    from tessera.app.views.settings_dialog import SettingsDialog

    dialog = SettingsDialog(Settings(paths.settings_path()), BackendList(dict(BACKENDS), "AVX512", "best"))
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.activateWindow()
    backend = dialog.editors["model/backend"]
    qtbot.waitUntil(backend.hasFocus, timeout=2000)  # not the tab bar, where Up and Down do nothing
    before = backend.currentText()
    qtbot.keyClick(backend, Qt.Key.Key_Down)
    assert backend.currentText() != before and dialog.backend_enabled(backend.currentText())
    dialog.tabs.tabBar().setFocus()
    qtbot.keyClick(dialog.tabs.tabBar(), Qt.Key.Key_Right)  # Left and Right still switch tabs
    assert dialog.tabs.currentIndex() == 1
    qtbot.keyClick(dialog.tabs.tabBar(), Qt.Key.Key_Down)  # Down enters the page
    focused = QApplication.focusWidget()
    assert focused in dialog.editors.values() and dialog.tabs.currentWidget().isAncestorOf(focused)
    value = focused.value()
    qtbot.keyClick(focused, Qt.Key.Key_Up)
    assert focused.value() > value


def test_the_theme_can_follow_the_desktop_and_the_font_size_is_a_setting(themed, qtbot, data_dir):  # noqa: F811
    from tessera.app import paths
    from tessera.app.settings import Settings

    settings = Settings(paths.settings_path())
    assert settings.get("ui/theme") == "system" and settings.get("ui/font_size") == 0
    scheme = themed.styleHints().colorScheme()
    assert theme.resolved("system") == ("dark" if scheme == Qt.ColorScheme.Dark else "light")
    assert theme.resolved("dark") == "dark" and theme.is_dark("dark") and not theme.is_dark("light")
    theme.apply_theme(themed, "system", 0)
    desktop = themed.font().pointSize()
    theme.apply_theme(themed, "dark", 15)
    assert themed.font().pointSize() == 15 and themed.palette().color(QPalette.ColorRole.Window) == QColor("#2b2b2b")
    theme.set_font_size(themed, 0)
    assert themed.font().pointSize() == desktop


# ---- layout at small and wide window sizes (item 19)


@pytest.fixture
def harness(qtbot, data_dir):  # noqa: F811
    from app_fakes import FakeApi
    from test_window import Harness

    h = Harness(qtbot, FakeApi())
    yield h
    h.close()


def _resize(qtbot, window, w, h):
    window.resize(w, h)
    qtbot.waitUntil(lambda: window.width() == w and window.height() == h, timeout=2000)
    QApplication.processEvents()


def test_a_small_window_hides_the_graphs_so_the_transcript_keeps_its_height(harness, qtbot):
    w = harness.window
    harness.load()
    _resize(qtbot, w, 1280, 820)
    assert w.graphs_dock.isVisible()
    _resize(qtbot, w, 1024, 700)
    assert not w.graphs_dock.isVisible() and not w.graphs_dock.toggleViewAction().isChecked()
    assert w.chat.scroll.height() >= 450  # it was ~270 px here with the graphs dock open
    _resize(qtbot, w, 1280, 820)
    assert w.graphs_dock.isVisible()  # hidden for the size, so back with the size
    _resize(qtbot, w, 1024, 700)
    w.graphs_dock.toggleViewAction().trigger()  # the user asks for the graphs in a small window: they stay
    _resize(qtbot, w, 1000, 690)
    assert w.graphs_dock.isVisible()


def test_the_graphs_hidden_for_a_small_window_are_saved_as_shown(harness, qtbot):
    w = harness.window
    _resize(qtbot, w, 1024, 700)
    assert w.graphs_dock.isHidden()
    w.close()
    from tessera.app.main_window import MainWindow

    again = MainWindow(harness.settings, harness.store, harness.worker)
    qtbot.addWidget(again)
    again.show()
    _resize(qtbot, again, 1280, 820)
    assert again.graphs_dock.isVisible()


def test_messages_keep_a_reading_width_in_a_wide_window(harness, qtbot):
    from tessera.app.views.chat_view import READING_CHARS

    w = harness.window
    harness.load()
    harness.send("Hello")
    _resize(qtbot, w, 1920, 1080)
    viewport, column = w.chat.scroll.viewport(), w.chat.transcript
    cap = w.chat.fontMetrics().averageCharWidth() * READING_CHARS + 40
    assert column.width() <= cap < viewport.width() - 200
    left, right = column.x(), viewport.width() - column.x() - column.width()
    assert abs(left - right) <= 2  # centred
    assert all(m.width() <= column.width() for m in w.chat.widgets)
    _resize(qtbot, w, 1280, 820)
    assert column.width() >= viewport.width() - 2  # at the default size the column still fills the transcript


def test_messages_fit_the_transcript_of_a_narrow_window(harness, qtbot):
    w = harness.window
    harness.load()
    harness.send("Hello")
    _resize(qtbot, w, 1024, 700)
    viewport = w.chat.scroll.viewport()
    assert w.chat.transcript.width() <= viewport.width()  # nothing clipped on the right
    for m in w.chat.widgets:
        assert m.minimumSizeHint().width() <= viewport.width() and m.geometry().right() <= viewport.width()
        assert m.footer.isHidden() or m.footer.geometry().right() <= m.width()


def test_memory_used_is_in_the_unit_of_every_other_ram_figure(harness):
    harness.window.status.set_memory(2_500_000_000)
    assert harness.window.status.memory_label.text() == "2.50 GB used"  # the fit and the hardware report say GB
