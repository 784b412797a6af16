"""One turn of the transcript: role, collapsible thinking block, Markdown body, metrics footer, action buttons."""

from __future__ import annotations

import html

from PySide6.QtCore import QSize, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QPalette
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QTextBrowser, QToolButton, QVBoxLayout, QWidget

from tessera.app.store import Message
from tessera.app.views.markdown_html import render

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System prompt"}
STATE_NOTES = {"interrupted": "interrupted: the app stopped while this reply was being written",
               "stopped": "stopped", "error": "failed", "streaming": ""}


def footer_text(metrics: dict) -> str:
    """`12.3 tok/s · 145 tokens · 420 ms to first token · prefill 530 tok/s · 60% prefix reused · stop: eos · AVX512`
    (time to first token in ms, as on the graph)"""
    if not metrics:
        return ""
    parts = []
    if metrics.get("decode_tok_s"):
        parts.append(f"{metrics['decode_tok_s']:.1f} tok/s")
    if metrics.get("generated_tokens") is not None:
        parts.append(f"{int(metrics['generated_tokens'])} tokens")
    if metrics.get("ttft_s"):
        parts.append(f"{1000 * metrics['ttft_s']:.0f} ms to first token")
    if metrics.get("prefill_tok_s"):
        parts.append(f"prefill {metrics['prefill_tok_s']:.0f} tok/s")
    if metrics.get("prefix_hit_rate"):
        parts.append(f"{100 * metrics['prefix_hit_rate']:.0f}% prefix reused")
    if metrics.get("stop_reason"):
        parts.append(f"stop: {metrics['stop_reason']}")
    if metrics.get("backend"):
        parts.append(str(metrics["backend"]))
    return " · ".join(parts)


def role_header(message: Message) -> str:
    """`<b>Assistant</b> · model.gguf`, and which model wrote the chat before when this reply continues it on
    another."""
    head = f"<b>{html.escape(ROLE_NAMES.get(message.role, message.role))}</b>"
    model = message.metrics.get("model") if message.role == "assistant" else None
    if model:
        head += f" <span style='color: gray;'>· {html.escape(str(model))}</span>"
        before = message.metrics.get("continued_from")
        if before:
            head += f" <span style='color: #b36b00;'>(continues a chat written by {html.escape(str(before))})</span>"
    return head


class MarkdownBrowser(QTextBrowser):
    """A read-only rich-text view whose height follows its content (the transcript scrolls, not each message)."""

    copy_code = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.viewport().setAutoFillBackground(False)
        self.setStyleSheet("QTextBrowser { background: transparent; }")
        self.document().setDocumentMargin(2)
        self.document().contentsChanged.connect(self._fit)
        self.anchorClicked.connect(self._anchor)
        self._codes: list[str] = []
        self._source = None

    def set_markdown(self, text: str, dark: bool) -> None:
        if (text, dark) == self._source:
            return
        self._source = (text, dark)
        html, self._codes = render(text, dark)
        self.setHtml(html)

    def code_blocks(self) -> list[str]:
        return list(self._codes)

    def _anchor(self, url: QUrl) -> None:
        s = url.toString()
        if s.startswith("copy-code:"):
            n = int(s.split(":", 1)[1])
            if 0 <= n < len(self._codes):
                QGuiApplication.clipboard().setText(self._codes[n])
                self.copy_code.emit(self._codes[n])
        elif url.scheme() in ("http", "https"):
            QDesktopServices.openUrl(url)  # the user's browser, on the user's click

    def _fit(self) -> None:
        self.document().setTextWidth(self.viewport().width())
        extra = self.horizontalScrollBar().sizeHint().height() if self.horizontalScrollBar().isVisible() else 0
        self.setFixedHeight(int(self.document().size().height()) + 2 * self.frameWidth() + extra + 2)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit()

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(400, self.height())


class MessageWidget(QFrame):
    action = Signal(str, int)  # "copy" | "edit" | "regenerate", message index

    def __init__(self, index: int, message: Message, dark: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.index = index
        self.message = message
        self.dark = dark
        self.setObjectName(f"message-{message.role}")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAutoFillBackground(True)
        pal = self.palette()
        base = pal.color(QPalette.ColorRole.Base)
        if message.role == "user":
            pal.setColor(QPalette.ColorRole.Window, pal.color(QPalette.ColorRole.AlternateBase))
        else:
            pal.setColor(QPalette.ColorRole.Window, base)
        self.setPalette(pal)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(3)
        head = QHBoxLayout()
        self.role_label = QLabel(f"<b>{ROLE_NAMES.get(message.role, message.role)}</b>")
        head.addWidget(self.role_label)
        self.state_label = QLabel()
        self.state_label.setStyleSheet("color: #b36b00;")
        head.addWidget(self.state_label)
        head.addStretch(1)
        self.copy_button = self._tool("Copy", "Copy this message", "copy")
        self.edit_button = self._tool("Edit", "Edit this message and ask again", "edit")
        self.regen_button = self._tool("Regenerate", "Drop this reply and generate a new one", "regenerate")
        for b in (self.copy_button, self.edit_button, self.regen_button):
            head.addWidget(b)
        self.edit_button.setVisible(message.role == "user")
        self.regen_button.setVisible(False)
        layout.addLayout(head)

        self.think_toggle = QToolButton()
        self.think_toggle.setCheckable(True)
        self.think_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.think_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.think_toggle.setAutoRaise(True)
        self.think_toggle.setAccessibleName("Show or hide the model's thinking")
        self.think_toggle.toggled.connect(self._toggle_thinking)
        layout.addWidget(self.think_toggle)
        self.think_body = QLabel()
        self.think_body.setWordWrap(True)
        self.think_body.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.think_body.setStyleSheet("color: gray; padding-left: 14px; font-style: italic;")
        self.think_body.setVisible(False)
        layout.addWidget(self.think_body)

        self.body = MarkdownBrowser()
        self.body.setAccessibleName(f"{ROLE_NAMES.get(message.role, message.role)} message")
        layout.addWidget(self.body)
        self.footer = QLabel()
        self.footer.setStyleSheet("color: gray; font-size: 11px;")
        self.footer.setWordWrap(True)  # one long line would set the card's minimum width: clipped in a narrow window
        self.footer.setAccessibleName("Message statistics")
        layout.addWidget(self.footer)
        self.update_message(message)

    def _tool(self, text: str, tip: str, name: str) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.setAccessibleName(tip)
        b.setAutoRaise(True)
        b.clicked.connect(lambda: self.action.emit(name, self.index))
        return b

    def update_message(self, message: Message) -> None:
        self.message = message
        thinking = bool(message.thinking) or (message.state == "streaming" and message.thinking_s is not None
                                               and not message.content)
        self.think_toggle.setVisible(thinking)
        if thinking:
            secs = f"{message.thinking_s:.1f} s" if message.thinking_s is not None else ""
            still = message.state == "streaming" and not message.content
            self.think_toggle.setText(f"Thinking… {secs}" if still else f"Thought for {secs}")
            self.think_body.setText(message.thinking)
        text = message.content
        if message.role == "assistant" and message.state == "streaming" and not text and not thinking:
            text = "_…_"
        self.body.set_markdown(text, self.dark)
        self.footer.setText(footer_text(message.metrics) if message.state != "streaming" else
                            f"{message.metrics.get('generated_tokens', 0)} tokens…")
        self.footer.setVisible(message.role == "assistant")
        self.role_label.setText(role_header(message))
        note = STATE_NOTES.get(message.state, message.state)
        if message.state == "error" and message.metrics.get("error"):
            note = f"failed: {message.metrics['error']}"
        self.state_label.setText(note if message.state != "done" else "")

    def set_actions(self, busy: bool, last: bool) -> None:
        why = "Cannot change the chat while a reply is being generated" if busy else ""
        self.regen_button.setVisible(self.message.role == "assistant" and last)
        for b, tip in ((self.edit_button, "Edit this message and ask again"),
                       (self.regen_button, "Drop this reply and generate a new one")):
            b.setEnabled(not busy)
            b.setToolTip(why or tip)

    def _toggle_thinking(self, on: bool) -> None:
        self.think_toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.think_body.setVisible(on)

    def plain_text(self) -> str:
        return self.message.content
