"""The Remote server dialog: choose or edit a profile (name, base URL, API key, model from /v1/models), test the
connection, and chat through that server instead of a local model.

The dialog reaches the model only through the worker: `test_requested(url, key)` -> `worker.test_remote`, whose
`remote_checked` result comes back to `show_check`; `connect_requested(url, key, model)` -> `worker.connect_remote`.
Profiles and keys are kept by tessera/app/remote_profiles.py (keys in the OS keyring or a 0600 file, never in the chat
database).
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from tessera.app.remote_profiles import ProfileError, ProfileStore, RemoteProfile

NEW = "New profile…"


class RemoteDialog(QDialog):
    test_requested = Signal(str, str)  # base URL, API key
    connect_requested = Signal(str, str, str)  # base URL, API key, model ("" = the first listed)

    def __init__(self, store: ProfileStore, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Remote server")
        self.store = store
        layout = QVBoxLayout(self)
        self.profile = QComboBox()
        self.profile.currentTextChanged.connect(self._choose)
        layout.addWidget(self.profile)
        form = QFormLayout()
        self.name = QLineEdit()
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://gpu-box:8000/v1")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("none")
        self.model = QComboBox()
        self.model.setEditable(True)
        self.model.setToolTip("Filled by Test connection; empty: the first model the server lists")
        form.addRow("Name", self.name)
        form.addRow("Base URL", self.url)
        form.addRow("API key", self.key)
        form.addRow("Model", self.model)
        layout.addLayout(form)
        self.key_note = QLabel(f"Keys are kept in {store.keys.where}, never in the chat history or exports.")
        self.key_note.setWordWrap(True)
        layout.addWidget(self.key_note)
        row = QHBoxLayout()
        self.test_button = QPushButton("Test connection")
        self.test_button.clicked.connect(self._test)
        self.save_button = QPushButton("Save")
        self.save_button.clicked.connect(self.save)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self._delete)
        for b in (self.test_button, self.save_button, self.delete_button):
            row.addWidget(b)
        layout.addLayout(row)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.connect_button = buttons.addButton("Chat through this server", QDialogButtonBox.ButtonRole.AcceptRole)
        buttons.accepted.connect(self._connect)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self._reload()

    def _reload(self, select: str = "") -> None:
        try:
            names = [p.name for p in self.store.profiles()]
        except ProfileError as e:
            names = []
            self.status.setText(f"{e.subject}: {e.message}")
        self.profile.blockSignals(True)
        self.profile.clear()
        self.profile.addItems([*names, NEW])
        self.profile.blockSignals(False)
        self.profile.setCurrentText(select if select in names else (names[0] if names else NEW))
        self._choose(self.profile.currentText())

    def _choose(self, name: str) -> None:
        p = self.store.get(name) if name != NEW else None
        self.name.setText(p.name if p else "")
        self.url.setText(p.base_url if p else "")
        self.key.setText((self.store.api_key(name) or "") if p else "")
        self.model.clear()
        if p and p.model:
            self.model.addItem(p.model)
        self.delete_button.setEnabled(p is not None)

    def _test(self) -> None:
        self.status.setText(f"Testing {self.url.text().strip()} …")
        self.test_button.setEnabled(False)
        self.test_requested.emit(self.url.text().strip(), self.key.text())

    def show_check(self, result: dict) -> None:
        """The worker's remote_checked result."""
        self.test_button.setEnabled(True)
        if not result["ok"]:
            self.status.setText(f"Not reachable: {result['error']}")
            return
        current = self.model.currentText()
        self.model.clear()
        self.model.addItems(result["models"])
        if current in result["models"]:
            self.model.setCurrentText(current)
        self.status.setText(f"Connected in {1000 * result['seconds']:.0f} ms; it serves "
                            f"{', '.join(result['models']) or 'no models'}.")

    def save(self) -> bool:
        profile = RemoteProfile(self.name.text().strip(), self.url.text().strip(), self.model.currentText().strip())
        try:
            self.store.save(profile, self.key.text() or None)
        except ProfileError as e:
            self.status.setText(f"{e.subject}: {e.message}")
            return False
        self._reload(profile.name)
        self.status.setText(f"Saved {profile.name}.")
        return True

    def _delete(self) -> None:
        self.store.delete(self.profile.currentText())
        self._reload()

    def _connect(self) -> None:
        if not self.url.text().strip():
            self.status.setText("Base URL: give the server's address, e.g. http://gpu-box:8000/v1")
            return
        if self.name.text().strip() and not self.save():
            return
        self.connect_requested.emit(self.url.text().strip(), self.key.text(), self.model.currentText().strip())
        self.accept()
