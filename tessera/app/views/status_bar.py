"""Status bar: model · backend (reason on hover) · device · threads · memory · packs being saved · last tok/s.

The permanent labels sit on the right, each with a separator; temporary messages on the left are elided to the room
left beside them (the whole text on hover), so they never run into the labels."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from tessera.app.payloads import ModelState


class _Field(QLabel):
    """A permanent label that takes no room (and shows no separator) while it is empty."""

    def setText(self, text: str) -> None:  # noqa: N802 - Qt override
        super().setText(text)
        self.setVisible(bool(text))


class TesseraStatusBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model_label = _Field("No model")
        self.backend_label = _Field("")
        self.device_label = _Field("")
        self.threads_label = _Field("")
        self.memory_label = _Field("")
        self.saving_label = _Field("")  # a first load's packed weights on their way to the cache
        self.speed_label = _Field("")
        for name, w in (("Model", self.model_label), ("Backend", self.backend_label), ("Device", self.device_label),
                        ("Threads", self.threads_label), ("Memory used", self.memory_label),
                        ("Saving packed weights", self.saving_label), ("Last speed", self.speed_label)):
            w.setAccessibleName(name)
            w.setStyleSheet("QLabel { padding: 0 6px; border-left: 1px solid palette(mid); }")
            self.addPermanentWidget(w)
            w.setVisible(bool(w.text()))
        self.message_text = ""  # the whole temporary message (what is shown may be elided)
        self.messageChanged.connect(self._message_changed)

    def set_state(self, state: ModelState) -> None:
        if not state.loaded:
            self.model_label.setText("No model")
            self.backend_label.setText("")
            self.backend_label.setToolTip("")
            self.device_label.setText("")
            self.threads_label.setText("")
            return
        self.model_label.setText(state.name)
        self.model_label.setToolTip(state.path)
        self.backend_label.setText(f"backend {state.backend}")  # why: on hover (a switch says it once, as a message)
        self.backend_label.setToolTip(f"Expert backend {state.backend}: {state.backend_reason or 'no reason given'}")
        self.device_label.setText(f"device {state.device}")
        self.threads_label.setText(f"{state.threads} threads" if state.threads else "")

    def showMessage(self, text: str, timeout: int = 0) -> None:  # noqa: N802 - Qt override
        self.message_text = text
        room = self.width() - sum(w.width() for w in self._permanent() if w.isVisible()) - 24
        shown = self.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, max(room, 80))
        self.setToolTip(text if shown != text else "")
        super().showMessage(shown, timeout)

    def _message_changed(self, text: str) -> None:
        if not text:
            self.message_text = ""
            self.setToolTip("")

    def _permanent(self) -> list[QLabel]:
        return [self.model_label, self.backend_label, self.device_label, self.threads_label, self.memory_label,
                self.saving_label, self.speed_label]

    def set_memory(self, rss_bytes: int) -> None:
        self.memory_label.setText(f"{rss_bytes / 1e9:.2f} GB used")  # GB, as every RAM figure the app shows

    def set_pack_writes(self, left_bytes: int, hashing_bytes: int = 0) -> None:
        """Bytes of work left to save a first load's packed weights in the cache (0 hides the field), of which
        `hashing_bytes` hashing the model file first (a new file version's keys)."""
        if left_bytes <= 0:
            self.saving_label.setText("")
            self.saving_label.setToolTip("")
            return
        hashing = " (hashing first)" if hashing_bytes > 0 else ""
        self.saving_label.setText(f"saving packs {max(left_bytes - hashing_bytes, 0) / 1e9:.2f} GB{hashing}")
        self.saving_label.setToolTip("The model's experts, packed for this CPU at its first load, are being written to "
                                     "the packed-weight cache so that the next load takes seconds. The writes pause "
                                     "while the model answers; closing the app waits for them or skips them.")

    def set_speed(self, decode_tok_s: float, prefill_tok_s: float = 0.0) -> None:
        text = f"{decode_tok_s:.1f} tok/s"
        if prefill_tok_s:
            text += f" (prefill {prefill_tok_s:.0f})"
        self.speed_label.setText(text)
