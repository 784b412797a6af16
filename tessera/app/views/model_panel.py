"""Model panel: open a GGUF file or a Hugging Face folder (dialog or drag-and-drop), its metadata and fit estimate,
load with progress and cancel, unload, recent models."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QProgressBar,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from tessera.app import paths
from tessera.app.payloads import LoadProgress, ModelState, ModelSummary

# header facts shown first, in this order, with friendlier names; other keys follow as they are
LABELS = {
    "name": "Name",
    "architecture": "Architecture",
    "format": "Format",
    "parameters": "Parameters",
    "num_hidden_layers": "Layers",
    "num_experts": "Experts",
    "num_experts_per_tok": "Active experts per token",
    "hidden_size": "Hidden size",
    "context_length": "Context length",
    "max_position_embeddings": "Context length",
    "type_mix": "Types (share of the file)",
    "total_bytes": "Size on disk",
    "loaded_bytes": "Size in memory",
    "expert_bytes": "Expert weights",
    "active_bytes_per_token": "Weights read per token",
    "expert_type": "Experts stored as",
}
UNLISTED = {"path", "ram_text"}  # the RAM of the load is the fit line's text, under the table
RECENT_TIP = "Double-click (or Enter) loads a recent model"


def format_value(key: str, value) -> str:
    if isinstance(value, (int, float)) and "bytes" in key:  # decimal units, as the RAM estimate's words use
        v = float(value)
        for unit in ("B", "kB", "MB", "GB", "TB"):
            if v < 1000 or unit == "TB":
                return f"{v:.1f} {unit}" if unit != "B" else f"{int(v)} B"
            v /= 1000
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


class ModelPanel(QWidget):
    inspect_requested = Signal(str)
    load_requested = Signal(str)
    cancel_requested = Signal()
    unload_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setAcceptDrops(True)
        self.path = ""
        self.loaded = False
        self.loaded_path = ""  # the model loaded now ("" when none)
        self.unreadable = False  # the chosen model's header could not be read: Load stays disabled
        self.remote = ""  # why the local controls are greyed out while chatting through a remote server ("": local)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)

        row = QHBoxLayout()
        self.open_file_button = QPushButton("Open GGUF…")
        self.open_file_button.setAccessibleName("Open a GGUF model file")
        self.open_file_button.clicked.connect(self.choose_file)
        self.open_dir_button = QPushButton("Open HF folder…")
        self.open_dir_button.setAccessibleName("Open a Hugging Face model folder")
        self.open_dir_button.clicked.connect(self.choose_folder)
        row.addWidget(self.open_file_button)
        row.addWidget(self.open_dir_button)
        layout.addLayout(row)

        self.path_label = QLabel("No model chosen. Drop a .gguf file or a model folder here.")
        self.path_label.setWordWrap(True)
        self.path_label.setAccessibleName("Chosen model")
        layout.addWidget(self.path_label)
        self.remote_label = QLabel()
        self.remote_label.setWordWrap(True)
        self.remote_label.setAccessibleName("Why the local model controls are disabled")
        self.remote_label.setVisible(False)
        layout.addWidget(self.remote_label)
        self.meta = QTreeWidget()
        self.meta.setHeaderLabels(["Property", "Value"])
        self.meta.setRootIsDecorated(False)
        self.meta.setAccessibleName("Model metadata")
        self.meta.setColumnWidth(0, 150)
        layout.addWidget(self.meta, 1)
        self.fit_label = QLabel()
        self.fit_label.setWordWrap(True)
        self.fit_label.setAccessibleName("Fit estimate")
        layout.addWidget(self.fit_label)

        row = QHBoxLayout()
        self.load_button = QPushButton("Load")
        self.load_button.setAccessibleName("Load the chosen model")
        self.load_button.setEnabled(False)
        self.load_button.clicked.connect(lambda: self.load_requested.emit(self.path))
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Cancel loading")
        self.cancel_button.setVisible(False)
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.unload_button = QPushButton("Unload")
        self.unload_button.setAccessibleName("Unload the model")
        self.unload_button.setEnabled(False)
        self.unload_button.clicked.connect(self.unload_requested)
        for b in (self.load_button, self.cancel_button, self.unload_button):
            row.addWidget(b)
        layout.addLayout(row)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Load progress")
        self.progress.setVisible(False)
        layout.addWidget(self.progress)
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #c0392b;")
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error_label.setVisible(False)
        layout.addWidget(self.error_label)

        layout.addWidget(QLabel("Recent models"))
        self.recent = QListWidget()
        self.recent.setAccessibleName("Recent models")
        self.recent.setMaximumHeight(110)
        self.recent.setToolTip(RECENT_TIP)
        self.recent.itemActivated.connect(self._load_recent)  # double-click or Enter: choose and load
        layout.addWidget(self.recent)

    # ---- choosing
    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", self.start_folder(),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.choose(path)

    def choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open a Hugging Face model folder", self.start_folder())
        if path:
            self.choose(path)

    def start_folder(self) -> str:
        """Where the open dialogs start: the folder of the model chosen last (or the most recent one), else home
        (never the working directory, which is the source checkout when started by ./run.sh)."""
        recent = [self.recent.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.recent.count())]
        for candidate in [self.path, *recent]:
            if candidate:
                folder = Path(candidate).parent  # a GGUF's folder, or the folder holding an HF model folder
                if folder.is_dir() and not _inside(folder, paths.resources_dir()):
                    return str(folder)
        return str(Path.home())

    def choose(self, path: str) -> None:
        """Select a model: its header is read in the worker (inspect_requested) and shown by show_summary."""
        self.path = str(path)
        self.path_label.setText(self.path)
        self.meta.clear()
        self.fit_label.setText("Reading the model's header…")
        self.error_label.setVisible(False)
        self.unreadable = False
        self._update_load_button()
        self.inspect_requested.emit(self.path)

    def _load_recent(self, item) -> None:
        path = item.data(Qt.ItemDataRole.UserRole)
        if path != self.path:
            self.choose(path)
        self.load_requested.emit(self.path)

    def _update_load_button(self) -> None:
        """Load for a new choice, Reload for the model loaded now; disabled while nothing readable is chosen."""
        self.load_button.setText("Reload" if self.loaded and self.path == self.loaded_path else "Load")
        self.load_button.setEnabled(bool(self.path) and not self.unreadable and not self.remote)
        self.load_button.setToolTip(self.remote or ("This model's header could not be read: fix the file or choose "
                                                    "another" if self.unreadable else ""))

    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt override
        urls = event.mimeData().urls()
        if urls and urls[0].isLocalFile() and not self.remote:  # a drop opens a local model: not while remote
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802
        urls = event.mimeData().urls()
        if urls and urls[0].isLocalFile():
            self.choose(urls[0].toLocalFile())
            event.acceptProposedAction()

    # ---- results
    def show_summary(self, summary: ModelSummary, fit_text: str) -> None:
        if summary.path != self.path:
            return
        self.meta.clear()
        shown = set()
        for key, label in LABELS.items():
            if key in summary.info and label not in shown and summary.info[key] not in (None, "", {}):
                shown.add(label)
                QTreeWidgetItem(self.meta, [label, format_value(key, summary.info[key])])
        for key, value in summary.info.items():
            if key not in LABELS and key not in UNLISTED and isinstance(value, (int, float, str)) and value != "":
                QTreeWidgetItem(self.meta, [key.replace("_", " "), format_value(key, value)])
        self.fit_label.setText(fit_text)

    def show_progress(self, p: LoadProgress) -> None:
        if getattr(self, "_started", None) is None or p.operation != self._op:
            self._started, self._op = time.monotonic(), p.operation
        self.progress.setVisible(True)
        self.cancel_button.setVisible(p.operation in ("load", "make"))
        self.progress.setRange(0, max(p.total, 1) if p.total > 0 else 0)
        self.progress.setValue(min(p.done, max(p.total, 1)))
        label = {"load": "Loading", "repack": "Repacking experts", "make": "Making a test model"}.get(
            p.operation, p.operation)
        eta = ""
        elapsed = time.monotonic() - self._started
        if 0.05 < p.fraction < 1 and elapsed > 1:
            eta = f" · about {elapsed * (1 - p.fraction) / p.fraction:.0f} s left"
        self.progress.setFormat(f"{label}: {p.stage} %p%" + (f" · {p.detail}" if p.detail else "") + eta)

    def start_loading(self) -> None:
        self.error_label.setVisible(False)
        self.progress.setVisible(True)
        self.progress.setRange(0, 0)
        self.progress.setFormat("Loading…")
        self.cancel_button.setVisible(True)
        self.load_button.setEnabled(False)

    def set_state(self, state: ModelState) -> None:
        self._started = None
        self.loaded = state.loaded
        self.progress.setVisible(False)
        self.cancel_button.setVisible(False)
        self.unload_button.setEnabled(state.loaded)
        self.loaded_path = state.path if state.loaded else ""
        if state.loaded and state.path:
            if state.path != self.path:  # e.g. a failed load of another choice kept this model
                self.path = state.path
                self.unreadable = False
                self.meta.clear()
                self.fit_label.setText("")
            self.path_label.setText(state.path)  # also replaces "Making …" once the test model has loaded
            if state.info and not self.meta.topLevelItemCount():
                self.show_summary(ModelSummary(state.path, state.info), self.fit_label.text())
        self._set_remote(state.path if state.loaded and state.backend == "remote" else "")
        self._update_load_button()

    def _set_remote(self, url: str) -> None:
        """Chatting through the server at `url`: the local model controls are greyed out, with the reason; Unload
        disconnects. url "": a local model (or none), every control as usual."""
        self.remote = (f"Chatting through the remote server at {url}, which chooses and runs the model: unload "
                       "(disconnect) to open a local model here.") if url else ""
        for w in (self.open_file_button, self.open_dir_button, self.recent, self.meta):
            w.setEnabled(not url)
            w.setToolTip(self.remote or (RECENT_TIP if w is self.recent else ""))
        self.remote_label.setText(self.remote)
        self.remote_label.setVisible(bool(url))
        self.unload_button.setText("Disconnect" if url else "Unload")

    def show_inspect_error(self, text: str) -> None:
        """The chosen model cannot be read: say why, and keep Load disabled until another one is chosen."""
        self.unreadable = True
        self.show_error(text)

    def show_error(self, text: str) -> None:
        self._started = None
        self.progress.setVisible(False)
        self.cancel_button.setVisible(False)
        self._update_load_button()
        self.error_label.setText(text)
        self.error_label.setVisible(True)
        if self.fit_label.text().startswith("Reading"):
            self.fit_label.setText("")

    def set_recent(self, paths: list[str]) -> None:
        self.recent.clear()
        for p in paths:
            self.recent.addItem(Path(p).name)
            item = self.recent.item(self.recent.count() - 1)
            item.setData(Qt.ItemDataRole.UserRole, p)
            item.setToolTip(p)


def _inside(folder: Path, parent: Path) -> bool:
    try:
        folder.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False
