"""The "Serve this model" panel: serve the loaded model over the OpenAI API, with the URL and key to copy.

Emits `serve_requested(on, network)`; the window passes it to the worker, whose `serving` signal comes back to
`show_state(ServeState)`. The key is fresh each time serving starts and lives only in this widget and the server.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QCheckBox, QGridLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget


class ServePanel(QWidget):
    serve_requested = Signal(bool, bool, int)  # on, reachable from other computers, port

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.toggle = QCheckBox("Serve this model (OpenAI API)")
        self.toggle.setToolTip("Other programs (editors, agents, the openai package) can use the loaded model; "
                               "they share it with this chat, one request at a time")
        self.toggle.toggled.connect(self._toggled)
        layout.addWidget(self.toggle)
        self.network = QCheckBox("Reachable from other computers")
        self.network.setToolTip("Listen on every address instead of this computer only (the key is always required)")
        layout.addWidget(self.network)
        self.port = QSpinBox()
        self.port.setRange(1024, 65535)
        self.port.setValue(8080)
        self.port.setPrefix("port ")
        layout.addWidget(self.port)

        grid = QGridLayout()
        self.url = self._copyable(grid, 0, "URL")
        self.key = self._copyable(grid, 1, "API key")
        self.model = self._copyable(grid, 2, "Model")
        layout.addLayout(grid)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        layout.addStretch(1)
        self._loaded = False
        self._update()

    def _copyable(self, grid: QGridLayout, row: int, label: str) -> QLineEdit:
        field = QLineEdit()
        field.setReadOnly(True)
        button = QPushButton("Copy")
        button.setToolTip(f"Copy the {label.lower()} to the clipboard")
        button.clicked.connect(lambda: QGuiApplication.clipboard().setText(field.text()))
        grid.addWidget(QLabel(label), row, 0)
        grid.addWidget(field, row, 1)
        grid.addWidget(button, row, 2)
        field.copy_button = button  # type: ignore[attr-defined]
        return field

    def _toggled(self, on: bool) -> None:
        self.status.setText("Starting…" if on else "Stopping…")
        self.serve_requested.emit(on, self.network.isChecked(), self.port.value())

    def set_state(self, model_state) -> None:
        """The worker's ModelState: serving needs a loaded model."""
        self._loaded = bool(model_state.loaded)
        self._update()

    def show_state(self, state) -> None:
        """The worker's ServeState."""
        self.toggle.blockSignals(True)
        self.toggle.setChecked(state.running)
        self.toggle.blockSignals(False)
        self.url.setText(state.url)
        self.key.setText(state.api_key)
        self.model.setText(state.model)
        if state.error:
            self.status.setText(f"Not serving: {state.error}")
        elif state.running:
            self.status.setText("Serving. Clients send the key as 'Authorization: Bearer KEY' and the model name "
                                "above; see docs/REMOTE.md.")
        else:
            self.status.setText("")
        self._update()

    def _update(self) -> None:
        running = self.toggle.isChecked()
        self.toggle.setEnabled(self._loaded or running)
        if not self._loaded and not running:
            self.toggle.setToolTip("Load a model first")
        self.network.setEnabled(not running)
        self.port.setEnabled(not running)
        for field in (self.url, self.key, self.model):
            field.copy_button.setEnabled(running and bool(field.text()))
