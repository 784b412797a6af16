"""Status bar: model · backend (reason on hover) · device · threads · memory · last tok/s."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from app.payloads import ModelState


class TesseraStatusBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model_label = QLabel("No model")
        self.backend_label = QLabel("")
        self.device_label = QLabel("")
        self.threads_label = QLabel("")
        self.memory_label = QLabel("")
        self.speed_label = QLabel("")
        for name, w in (("Model", self.model_label), ("Backend", self.backend_label), ("Device", self.device_label),
                        ("Threads", self.threads_label), ("Memory used", self.memory_label),
                        ("Last speed", self.speed_label)):
            w.setAccessibleName(name)
            self.addPermanentWidget(w)

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
        reason = f" — {state.backend_reason}" if state.backend_reason else ""
        self.backend_label.setText(f"backend {state.backend}{reason}")
        self.backend_label.setToolTip(f"Expert backend {state.backend}: {state.backend_reason or 'no reason given'}")
        self.device_label.setText(f"device {state.device}")
        self.threads_label.setText(f"{state.threads} threads" if state.threads else "")

    def set_memory(self, rss_bytes: int) -> None:
        self.memory_label.setText(f"{rss_bytes / 1024**3:.2f} GiB used")

    def set_speed(self, decode_tok_s: float, prefill_tok_s: float = 0.0) -> None:
        text = f"{decode_tok_s:.1f} tok/s"
        if prefill_tok_s:
            text += f" (prefill {prefill_tok_s:.0f})"
        self.speed_label.setText(text)
