"""First run / no model: open a model, the demo model, a random test-drive model, and the wizards."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import QLabel, QPushButton, QVBoxLayout, QWidget


class WelcomePage(QWidget):
    open_requested = Signal()
    demo_requested = Signal()
    test_drive_requested = Signal()
    hardware_wizard_requested = Signal()
    convert_wizard_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.logo = QLabel()
        self.logo.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.logo.setVisible(False)
        layout.addWidget(self.logo)
        title = QLabel("<h1>Tessera</h1>")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(title)
        intro = QLabel("Chat with Qwen3-MoE models on this computer: the routed experts run on the CPU in kernels "
                       "made for it, the rest on the GPU when there is one.\nNo model is loaded yet.")
        intro.setWordWrap(True)
        intro.setAlignment(Qt.AlignmentFlag.AlignCenter)
        intro.setMinimumWidth(300)
        intro.setMaximumWidth(560)
        layout.addWidget(intro, 0, Qt.AlignmentFlag.AlignHCenter)
        self.buttons: dict[str, QPushButton] = {}
        for key, text, signal in (
                ("open", "Open a model (GGUF file or Hugging Face folder)…", self.open_requested),
                ("demo", "Chat with the built-in demo model", self.demo_requested),
                ("test_drive", "Make a small random-weight model for a test drive", self.test_drive_requested),
                ("hardware", "Check this computer (hardware wizard)…", self.hardware_wizard_requested),
                ("convert", "Convert a Hugging Face model to GGUF (conversion wizard)…",
                 self.convert_wizard_requested)):
            b = QPushButton(text)
            b.setAccessibleName(text.rstrip("…"))
            b.setMinimumWidth(340)
            b.setMinimumHeight(34)
            b.clicked.connect(signal)
            layout.addWidget(b, 0, Qt.AlignmentFlag.AlignHCenter)
            self.buttons[key] = b
        self.hint = QLabel()
        self.hint.setStyleSheet("color: gray;")
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.hint.setWordWrap(True)
        layout.addWidget(self.hint)

    def set_logo(self, path: str) -> None:
        pixmap = QPixmap(path)
        if not pixmap.isNull():
            self.logo.setPixmap(pixmap.scaledToHeight(96, Qt.TransformationMode.SmoothTransformation))
            self.logo.setVisible(True)

    def set_available(self, key: str, available: bool, reason: str = "") -> None:
        b = self.buttons[key]
        b.setEnabled(available)
        b.setToolTip("" if available else reason)
        if not available and reason:
            b.setText(b.accessibleName() + "  (not available)")
