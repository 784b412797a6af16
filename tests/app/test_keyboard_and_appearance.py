"""Keyboard and appearance (issue 15 items 18, 19): a focus ring that can be seen in both themes, the arrow keys reach
a control in Settings, the theme can follow the desktop, and the font size is a setting."""

from __future__ import annotations

import pytest
from app_fakes import BACKENDS, data_dir  # noqa: F401 - fixture
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QCheckBox, QComboBox, QHBoxLayout, QLineEdit, QPushButton, QWidget

from app import theme
from app.payloads import BackendList


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
    from app import paths
    from app.settings import Settings
    from app.views.settings_dialog import SettingsDialog

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
    from app import paths
    from app.settings import Settings

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
