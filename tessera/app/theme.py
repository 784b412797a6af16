"""Light and dark palettes in one place (Fusion style, so both look the same on every platform), the "system" theme
that follows the desktop's light or dark setting, the font size, and a focus ring that can be seen in both themes.

Fusion shows keyboard focus faintly or not at all (nothing on a push button or a combo box, a 1 px line in the
palette's highlight on a check box, which in the dark palette is close to the window colour). FocusRingStyle draws a
2 px ring in FOCUS_RING's colour, chosen for at least 3:1 contrast against the window, base and button colours of its
theme (WCAG 2.1's minimum for a focus indicator), around the control that has keyboard focus.
"""

from __future__ import annotations

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPalette, QPen
from PySide6.QtWidgets import QApplication, QPlainTextEdit, QProxyStyle, QStyle, QTextEdit

THEMES = ("system", "light", "dark")  # the Appearance setting's choices; "system" follows the desktop

DARK = {
    QPalette.ColorRole.Window: "#2b2b2b", QPalette.ColorRole.WindowText: "#e6e6e6",
    QPalette.ColorRole.Base: "#1f1f1f", QPalette.ColorRole.AlternateBase: "#33373d",
    QPalette.ColorRole.Text: "#e6e6e6", QPalette.ColorRole.Button: "#3a3a3a",
    QPalette.ColorRole.ButtonText: "#e6e6e6", QPalette.ColorRole.Highlight: "#2f6fb7",
    QPalette.ColorRole.HighlightedText: "#ffffff", QPalette.ColorRole.ToolTipBase: "#3a3a3a",
    QPalette.ColorRole.ToolTipText: "#e6e6e6", QPalette.ColorRole.Link: "#6cb4ff",
    QPalette.ColorRole.PlaceholderText: "#8a8a8a",
}
LIGHT_ALTERNATE = "#eef3fa"
FOCUS_RING = {"light": "#1a5fb4", "dark": "#8ab4f8"}
FOCUS_RING_WIDTH = 2
_DEFAULT_POINT_SIZE = "tessera_default_point_size"  # the desktop's font size, kept on the app for "0: the system's"
_style: QProxyStyle | None = None


class FocusRingStyle(QProxyStyle):
    """Fusion, with a FOCUS_RING-coloured ring on the control that has focus: push and tool buttons, check boxes and
    radio buttons, tabs and the current item of a list (where Fusion calls for a focus rectangle), combo boxes, spin
    boxes, line edits and text boxes. Buttons, check boxes and tabs show it once the keyboard has moved focus in
    their window (a mouse click leaves no ring on a button); fields that take typing show it whenever focused."""

    _RING_AFTER = {
        QStyle.PrimitiveElement.PE_PanelButtonCommand, QStyle.PrimitiveElement.PE_PanelButtonTool,
        QStyle.PrimitiveElement.PE_FrameLineEdit,
    }
    _RING_AFTER_COMPLEX = {QStyle.ComplexControl.CC_ComboBox, QStyle.ComplexControl.CC_SpinBox,
                           QStyle.ComplexControl.CC_ToolButton}
    _TYPING = {QStyle.PrimitiveElement.PE_FrameLineEdit, QStyle.ComplexControl.CC_SpinBox}

    def __init__(self, colour: str):
        super().__init__("Fusion")
        self.colour = QColor(colour)

    def _shows(self, element, option) -> bool:
        state = option.state
        if not state & QStyle.StateFlag.State_HasFocus:
            return False
        return element in self._TYPING or bool(state & QStyle.StateFlag.State_KeyboardFocusChange)

    def ring(self, painter: QPainter, rect: QRect) -> None:
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        painter.setPen(QPen(self.colour, FOCUS_RING_WIDTH))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        half = FOCUS_RING_WIDTH / 2
        painter.drawRoundedRect(rect.toRectF().adjusted(half, half, -half, -half), 3, 3)
        painter.restore()

    def drawPrimitive(self, element, option, painter, widget=None):  # noqa: N802 - Qt override
        if element == QStyle.PrimitiveElement.PE_FrameFocusRect:  # Fusion's own: faint, or nothing
            if option.state & QStyle.StateFlag.State_KeyboardFocusChange or widget is None or widget.hasFocus():
                self.ring(painter, option.rect)
            return
        super().drawPrimitive(element, option, painter, widget)
        if element in self._RING_AFTER and self._shows(element, option):
            self.ring(painter, option.rect)

    def drawComplexControl(self, control, option, painter, widget=None):  # noqa: N802 - Qt override
        super().drawComplexControl(control, option, painter, widget)
        if control in self._RING_AFTER_COMPLEX and self._shows(control, option):
            self.ring(painter, option.rect)

    def drawControl(self, element, option, painter, widget=None):  # noqa: N802 - Qt override
        super().drawControl(element, option, painter, widget)
        # a text box's frame: the message box, the system prompt (typing fields: ring whenever focused)
        if (element == QStyle.ControlElement.CE_ShapedFrame and isinstance(widget, (QPlainTextEdit, QTextEdit))
                and not widget.isReadOnly() and widget.hasFocus()):
            self.ring(painter, option.rect)


def resolved(theme: str) -> str:
    """"light" or "dark": `theme` itself, or for "system" the desktop's colour scheme (light when it says none)."""
    if theme in ("light", "dark"):
        return theme
    hints = QGuiApplication.styleHints() if QGuiApplication.instance() is not None else None
    return "dark" if hints is not None and hints.colorScheme() == Qt.ColorScheme.Dark else "light"


def apply_theme(app: QApplication, theme: str, font_size: int | None = None) -> None:
    """Style, palette and focus ring for `theme` ("system", "light" or "dark"); with `font_size`, the application
    font's point size (0: the desktop's own size)."""
    shade = resolved(theme)
    style = FocusRingStyle(FOCUS_RING[shade])
    app.setStyle(style)  # the app owns it; the module keeps its Python side alive
    global _style
    _style = style
    palette = style.standardPalette()
    if shade == "dark":
        for role, colour in DARK.items():
            palette.setColor(role, QColor(colour))
        palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor("#777777"))
        palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor("#777777"))
    else:
        palette.setColor(QPalette.ColorRole.AlternateBase, QColor(LIGHT_ALTERNATE))
    app.setPalette(palette)
    if font_size is not None:
        set_font_size(app, font_size)


def set_font_size(app: QApplication, points: int) -> None:
    """The application font's point size; 0 restores the desktop's."""
    if app.property(_DEFAULT_POINT_SIZE) is None:
        app.setProperty(_DEFAULT_POINT_SIZE, app.font().pointSize())
    font = app.font()
    font.setPointSize(int(points) if points and points > 0 else int(app.property(_DEFAULT_POINT_SIZE)))
    app.setFont(font)


def is_dark(theme: str) -> bool:
    return resolved(theme) == "dark"
