"""The settings dialog, generated from app.settings.TABLE (one widget per visible key, grouped by tab).

Backends that cannot run here are listed but disabled, with the reason as their tooltip. Values are written to the
Settings object on OK/Apply; the window reacts to Settings.changed (a backend change repacks in the worker).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from tessera.app.payloads import BackendList, PackCacheInfo
from tessera.app.settings import TABLE, Setting, Settings

BACKEND_KEY = "model/backend"
GPU_KEY = "gpu/use"
# settings that shape only a model run here: disabled, with the reason, while chatting through a remote server
LOCAL_ONLY = ("model/backend", "model/threads", "model/context_length", "gpu/use", "gpu/expert_cache",
              "chat/allow_special_tokens")


class SettingsDialog(QDialog):
    clear_cache_requested = Signal()  # the window passes it to the worker, which answers with show_pack_cache

    def __init__(self, settings: Settings, backends: BackendList | None = None, model_loaded: bool = False,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setAccessibleName("Settings")
        self.settings = settings
        self.editors: dict[str, QWidget] = {}
        self.tips: dict[str, str] = {}  # each editor's own tooltip (a remote server's reason replaces it meanwhile)
        layout = QVBoxLayout(self)
        self.remote_note = QLabel()
        self.remote_note.setWordWrap(True)
        self.remote_note.setAccessibleName("Why some settings are disabled")
        self.remote_note.setVisible(False)
        layout.addWidget(self.remote_note)
        self.tabs = QTabWidget()
        layout.addWidget(self.tabs)
        forms: dict[str, QFormLayout] = {}
        for spec in TABLE:
            if spec.hidden:
                continue
            if spec.group not in forms:
                page = QWidget()
                forms[spec.group] = QFormLayout(page)
                self.tabs.addTab(page, spec.group)
            editor = self._editor(spec)
            editor.setAccessibleName(spec.label)
            tip = spec.help + (" Takes effect at the next model load." if spec.reload else "")
            editor.setToolTip(tip.strip())
            self.tips[spec.key] = tip.strip()
            self.editors[spec.key] = editor
            label = QLabel(spec.label + ("  ⟳" if spec.reload and model_loaded else ""))
            label.setBuddy(editor)
            forms[spec.group].addRow(label, editor)
            self._show(spec.key, settings.get(spec.key))
        self.backend_note = QLabel()
        self.backend_note.setWordWrap(True)
        self.backend_note.setStyleSheet("color: gray;")
        forms["Model"].addRow(self.backend_note)
        self.gpu_note = QLabel()
        self.gpu_note.setWordWrap(True)
        self.gpu_note.setStyleSheet("color: gray;")
        self.gpu_note.setAccessibleName("CUDA availability")
        forms["Model"].addRow(self.gpu_note)
        self.backend_table = QTreeWidget()
        self.backend_table.setHeaderLabels(["Backend", "On this computer"])
        self.backend_table.setRootIsDecorated(False)
        self.backend_table.setColumnWidth(0, 110)
        self.backend_table.setAccessibleName("Backends available on this computer")
        forms["Model"].addRow(self.backend_table)
        forms["Model"].addRow("Packed-weight cache", self._pack_cache_row())
        if model_loaded:
            legend = QLabel("⟳ takes effect at the next model load; a backend change repacks the loaded model now.")
            legend.setWordWrap(True)
            legend.setStyleSheet("color: gray;")
            forms["Model"].addRow(legend)
        self._note(backends)
        if backends is not None:
            self.set_backends(backends)
            self.set_gpu_status(backends)
        self.setMinimumWidth(620)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
                                   | QDialogButtonBox.StandardButton.Apply
                                   | QDialogButtonBox.StandardButton.RestoreDefaults)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.Apply).clicked.connect(self.apply)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(self.restore_defaults)
        layout.addWidget(buttons)
        self.buttons = buttons

    def _pack_cache_row(self) -> QWidget:
        row = QWidget()
        box = QHBoxLayout(row)
        box.setContentsMargins(0, 0, 0, 0)
        self.cache_label = QLabel("Measuring…")
        self.cache_label.setAccessibleName("Packed-weight cache size")
        self.cache_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.cache_button = QPushButton("Clear")
        self.cache_button.setAccessibleName("Clear the packed-weight cache")
        self.cache_button.setToolTip("Delete the packed expert copies kept between loads; each model packs again at "
                                     "its next load. A loaded model keeps running.")
        self.cache_button.setEnabled(False)  # until the size is known
        self.cache_button.clicked.connect(self._clear_cache)
        box.addWidget(self.cache_label, 1)
        box.addWidget(self.cache_button)
        return row

    def _clear_cache(self) -> None:
        self.cache_button.setEnabled(False)
        self.cache_label.setText("Clearing…")
        self.clear_cache_requested.emit()

    def show_pack_cache(self, info: PackCacheInfo) -> None:
        """The worker's answer: the cache's size and folder (after a Clear, what it freed), or why it is unknown."""
        if info.error:
            self.cache_label.setText(f"{info.text}: {info.error}")
            self.cache_button.setEnabled(False)
            return
        freed = f" (cleared {info.freed_text})" if info.freed_bytes >= 0 else ""
        budget = f" of a {info.budget_text} budget" if info.budget_text else ""
        self.cache_label.setText(f"{info.text}{budget}{freed}")
        self.cache_label.setToolTip(info.folder + (f"\nBudget: {info.budget_why}" if info.budget_why else ""))
        self.cache_button.setEnabled(info.held_bytes > 0)

    def set_remote(self, reason: str) -> None:
        """reason: a remote server is in use, and the settings that only shape a local model are disabled with it as
        their tooltip and in a note at the top; "": a local model (or none), and they are enabled again. The window
        calls this each time the dialog is shown and whenever a model loads or a server connects while it is open."""
        for key in LOCAL_ONLY:
            editor = self.editors.get(key)
            if editor is not None:
                editor.setEnabled(not reason)
                editor.setToolTip(reason or self.tips.get(key, ""))
        self.remote_note.setText(reason)
        self.remote_note.setVisible(bool(reason))

    def _editor(self, spec: Setting) -> QWidget:
        if spec.choices or spec.runtime_choices:
            w = QComboBox()
            w.addItems([str(c) for c in spec.choices])
            return w
        if isinstance(spec.default, bool):
            return QCheckBox()
        if isinstance(spec.default, int):
            w = QSpinBox()
            w.setRange(int(spec.minimum if spec.minimum is not None else -2**31),
                       int(spec.maximum if spec.maximum is not None else 2**31 - 1))
            return w
        if isinstance(spec.default, float):
            w = QDoubleSpinBox()
            w.setDecimals(2)
            w.setSingleStep(0.05)
            w.setRange(spec.minimum if spec.minimum is not None else -1e9,
                       spec.maximum if spec.maximum is not None else 1e9)
            return w
        w = QPlainTextEdit()
        w.setMaximumHeight(90)
        return w

    def _show(self, key: str, value: Any) -> None:
        w = self.editors[key]
        if isinstance(w, QComboBox):
            if w.findText(str(value)) < 0:  # a run-time choice (backend) before the worker listed them
                w.addItem(str(value))
            w.setCurrentIndex(w.findText(str(value)))
        elif isinstance(w, QCheckBox):
            w.setChecked(bool(value))
        elif isinstance(w, (QSpinBox, QDoubleSpinBox)):
            w.setValue(value)
        else:
            w.setPlainText(str(value))

    def value(self, key: str) -> Any:
        w = self.editors[key]
        if isinstance(w, QComboBox):
            return w.currentText()
        if isinstance(w, QCheckBox):
            return w.isChecked()
        if isinstance(w, (QSpinBox, QDoubleSpinBox)):
            return w.value()
        return w.toPlainText()

    def set_value(self, key: str, value: Any) -> None:
        self._show(key, value)

    def set_backends(self, backends: BackendList) -> None:
        """The backend choices as the worker lists them (the one backend list), unavailable ones disabled."""
        combo: QComboBox = self.editors[BACKEND_KEY]
        current = combo.currentText()
        combo.clear()
        combo.addItems(list(backends.status))
        self._show(BACKEND_KEY, current or self.settings.get(BACKEND_KEY))  # kept even when this build lacks it
        model = combo.model()
        for i in range(combo.count()):
            name = combo.itemText(i)
            ok, reason = backends.status.get(name, (name == "Auto", "not reported by the kernels"))
            item = model.item(i) if isinstance(model, QStandardItemModel) else None
            if item is not None:
                item.setEnabled(bool(ok))
            tip = reason or ("available" if ok else "unavailable")
            if name == "Auto" and backends.auto_choice:
                tip = f"picks {backends.auto_choice}: {backends.auto_reason}".rstrip(": ")
            combo.setItemData(i, tip, Qt.ItemDataRole.ToolTipRole)
        self._note(backends)
        self.backend_table.clear()
        for i in range(combo.count()):
            name = combo.itemText(i)
            if name == "Auto":
                continue
            ok, reason = backends.status.get(name, (False, "not reported by the kernels"))
            item = QTreeWidgetItem(self.backend_table, [name, ("available" if ok else "unavailable")
                                                        + (f": {reason}" if reason else "")])
            item.setToolTip(1, reason)
            if not ok:
                item.setDisabled(True)

    def set_gpu_status(self, backends: BackendList) -> None:
        """GPU use "cuda" is offered only where torch sees a CUDA device; otherwise it is disabled, with the reason."""
        combo: QComboBox = self.editors[GPU_KEY]
        index = combo.findText("cuda")
        item = combo.model().item(index) if isinstance(combo.model(), QStandardItemModel) else None
        ok = backends.device.startswith("cuda")
        reason = backends.device if ok else (backends.cuda_reason or "no CUDA device is available")
        if item is not None:
            item.setEnabled(ok)
        combo.setItemData(index, ("available: " if ok else "unavailable: ") + reason, Qt.ItemDataRole.ToolTipRole)
        self.gpu_note.setText(f"GPU use cuda: {reason}" if ok else f"GPU use cuda is unavailable here: {reason}")

    def backend_enabled(self, name: str) -> bool:
        combo: QComboBox = self.editors[BACKEND_KEY]
        item = combo.model().item(combo.findText(name))
        return bool(item.isEnabled())

    def _note(self, backends: BackendList | None) -> None:
        if backends is None:
            self.backend_note.setText("Checking which kernels this CPU can run…")
        elif backends.auto_choice:
            self.backend_note.setText(f"Auto picks {backends.auto_choice}: {backends.auto_reason}")

    # ---- keyboard: the arrow keys act on a control, never on nothing
    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        """Open with the first control of the page focused, not the tab bar (where Up and Down do nothing)."""
        super().showEvent(event)
        self.focus_first_control()

    def keyPressEvent(self, event) -> None:  # noqa: N802 - Qt override
        """Down on the tab bar enters the page (Left and Right still switch tabs, as Ctrl+Tab does anywhere)."""
        if event.key() == Qt.Key.Key_Down and self.focusWidget() is self.tabs.tabBar():
            self.focus_first_control()
            event.accept()
            return
        super().keyPressEvent(event)

    def focus_first_control(self) -> None:
        page = self.tabs.currentWidget()
        for editor in self.editors.values():
            if page is not None and page.isAncestorOf(editor) and editor.isEnabled():
                editor.setFocus(Qt.FocusReason.TabFocusReason)
                return

    def apply(self) -> None:
        for key in self.editors:
            self.settings.set(key, self.value(key))
        self.settings.sync()

    def accept(self) -> None:
        self.apply()
        super().accept()

    def restore_defaults(self) -> None:
        for key in self.editors:
            self._show(key, self.settings.default(key))

