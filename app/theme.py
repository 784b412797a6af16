"""Light and dark palettes in one place (Fusion style, so both look the same on every platform)."""

from __future__ import annotations

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

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


def apply_theme(app: QApplication, theme: str) -> None:
    app.setStyle("Fusion")
    palette = app.style().standardPalette()
    if theme == "dark":
        for role, colour in DARK.items():
            palette.setColor(role, QColor(colour))
        palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor("#777777"))
        palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor("#777777"))
    else:
        palette.setColor(QPalette.ColorRole.AlternateBase, QColor(LIGHT_ALTERNATE))
    app.setPalette(palette)


def is_dark(theme: str) -> bool:
    return theme == "dark"
