"""The transcript (one MessageWidget per turn, in a scroll area) and the prompt box.

Streaming updates are coalesced: `update_message` only records the newest state, and a 50 ms timer repaints, so a fast
token stream costs at most ~20 Markdown renders per second.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from tessera.app.store import Message
from tessera.app.views.demo_intro import DemoIntro
from tessera.app.views.message_widget import MessageWidget

REPAINT_MS = 50
READING_CHARS = 120  # the messages' column is at most this many average characters wide, centred in a wide window


class ChatView(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    regenerate_requested = Signal()
    edit_requested = Signal(int, str)
    thinking_toggled = Signal(bool)
    open_model_requested = Signal()  # "Open a model…" in the demo model's empty state

    def __init__(self, dark: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.dark = dark
        self.busy = False
        self.widgets: list[MessageWidget] = []
        self._dirty: dict[int, Message] = {}
        self._follow = True
        self.intro: DemoIntro | None = None  # the demo model's empty state, while the demo model is loaded

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setAccessibleName("Conversation transcript")
        self.transcript = QWidget()
        self.column = QVBoxLayout(self.transcript)
        self.column.setSpacing(8)
        self.empty_label = QLabel("Type a message below and press Ctrl+Enter.")
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_label.setStyleSheet("color: gray;")
        self.column.addWidget(self.empty_label)
        self.column.addStretch(1)
        self.scroll.setWidget(self.transcript)
        self.scroll.setAlignment(Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop)
        self._cap_reading_width()
        layout.addWidget(self.scroll, 1)
        self.scroll.verticalScrollBar().rangeChanged.connect(self._keep_bottom)
        self.scroll.verticalScrollBar().valueChanged.connect(self._track_follow)

        self.notice_label = QLabel()
        self.notice_label.setWordWrap(True)
        self.notice_label.setStyleSheet("color: #b36b00;")
        self.notice_label.setVisible(False)
        layout.addWidget(self.notice_label)

        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Message (Ctrl+Enter to send, Esc to stop)")
        self.prompt.setAccessibleName("Message input")
        self.prompt.setMaximumHeight(84)
        self.prompt.setTabChangesFocus(True)  # Tab moves on to the next control; Ctrl+Tab types a tab
        self.prompt.installEventFilter(self)
        layout.addWidget(self.prompt)

        row = QHBoxLayout()
        self.thinking_box = QCheckBox("Thinking")
        self.thinking_box.setToolTip("Let the model think before it answers (Qwen3 <think> blocks)")
        self.thinking_box.setAccessibleName("Thinking mode")
        self.thinking_box.toggled.connect(self.thinking_toggled)
        row.addWidget(self.thinking_box)
        self.context_meter = QProgressBar()
        self.context_meter.setAccessibleName("Context used")
        self.context_meter.setMinimumWidth(150)  # narrow enough that the side docks can be widened
        self.context_meter.setMaximumWidth(300)
        self.context_meter.setTextVisible(True)
        self.set_context(0, 0)
        row.addWidget(self.context_meter)
        row.addStretch(1)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setAccessibleName("Stop generating")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop_requested)
        row.addWidget(self.stop_button)
        self.send_button = QPushButton("Send")
        self.send_button.setAccessibleName("Send message")
        self.send_button.setToolTip("Send (Ctrl+Enter)")
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._send)
        row.addWidget(self.send_button)
        layout.addLayout(row)

        for keys in ("Ctrl+Return", "Ctrl+Enter"):
            QShortcut(QKeySequence(keys), self, self._send, context=Qt.ShortcutContext.WindowShortcut)
        QShortcut(QKeySequence("Esc"), self, self.stop_requested.emit, context=Qt.ShortcutContext.WindowShortcut)

        self._timer = QTimer(self)
        self._timer.setInterval(REPAINT_MS)
        self._timer.timeout.connect(self._repaint)

    # ---- transcript
    def set_messages(self, messages: list[Message]) -> None:
        self._dirty.clear()
        for w in self.widgets:
            self.column.removeWidget(w)
            w.deleteLater()
        self.widgets = []
        for m in messages:
            self.append_message(m)
        self._update_empty()
        self._follow = True

    def set_intro(self, intro: dict | None) -> None:
        """Show the demo model's introduction (title, summary, examples) in an empty chat, or not (None)."""
        if self.intro is not None:
            self.column.removeWidget(self.intro)
            self.intro.deleteLater()
            self.intro = None
        if intro:
            self.intro = DemoIntro(intro)
            self.intro.example_chosen.connect(self.send_example)
            self.intro.open_requested.connect(self.open_model_requested)
            self.column.insertWidget(0, self.intro)
        self._update_empty()

    def send_example(self, prompt: str) -> None:
        """An example prompt, sent as if typed (whatever is in the box stays there if the send is refused)."""
        if self.busy:
            return
        typed = self.prompt.toPlainText()
        self.prompt.setPlainText(prompt)
        self._send()
        if self.prompt.toPlainText() == prompt:  # refused: give the box back its own text
            self.prompt.setPlainText(typed)

    def _update_empty(self) -> None:
        empty = not self.widgets
        self.empty_label.setVisible(empty and self.intro is None)
        if self.intro is not None:
            self.intro.setVisible(empty)

    def append_message(self, message: Message) -> None:
        w = MessageWidget(len(self.widgets), message, self.dark)
        w.action.connect(self._action)
        self.column.insertWidget(self.column.count() - 1, w)
        self.widgets.append(w)
        self._update_empty()
        self._refresh_actions()

    def update_message(self, index: int, message: Message) -> None:
        self._dirty[index] = message
        if not self._timer.isActive():
            self._timer.start()

    def flush(self) -> None:
        """Apply pending updates now (also called by the timer)."""
        self._repaint()

    def _repaint(self) -> None:
        dirty, self._dirty = self._dirty, {}
        for index, message in dirty.items():
            if 0 <= index < len(self.widgets):
                self.widgets[index].update_message(message)
        if not self._dirty:
            self._timer.stop()
        self._refresh_actions()

    def _keep_bottom(self, _min: int, maximum: int) -> None:
        if self._follow:
            self.scroll.verticalScrollBar().setValue(maximum)

    def _track_follow(self, value: int) -> None:
        self._follow = value >= self.scroll.verticalScrollBar().maximum() - 4

    # ---- state
    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.stop_button.setEnabled(busy)
        self.send_button.setEnabled(not busy)
        if not busy:
            self.flush()
        self._refresh_actions()

    def set_context(self, used: int, total: int) -> None:
        self.context_meter.setRange(0, max(total, 1))
        self.context_meter.setValue(min(used, max(total, 1)))
        self.context_meter.setFormat(f"context {used} / {total} tokens" if total else "context: no model")

    def set_thinking(self, on: bool) -> None:
        self.thinking_box.setChecked(on)

    def show_notice(self, text: str) -> None:
        self.notice_label.setText(text)
        self.notice_label.setVisible(bool(text))

    def _refresh_actions(self) -> None:
        last = len(self.widgets) - 1
        for i, w in enumerate(self.widgets):
            w.set_actions(self.busy, i == last)

    def _cap_reading_width(self) -> None:
        """Lines of READING_CHARS at most: at 1920 px wide a message ran 1,300 px across, too long to read."""
        margins = self.column.contentsMargins()
        self.transcript.setMaximumWidth(self.fontMetrics().averageCharWidth() * READING_CHARS + margins.left()
                                        + margins.right())

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt override
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:  # Appearance > Font size
            self._cap_reading_width()

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        """Ctrl+Enter and Esc typed in the prompt box, also when the window-level shortcuts do not see them."""
        if obj is self.prompt and event.type() == QEvent.Type.ShortcutOverride:
            if event.key() == Qt.Key.Key_Tab and event.modifiers() & Qt.KeyboardModifier.ControlModifier:
                event.accept()  # Ctrl+Tab is ours here (a tab character), not a window shortcut
                return True
        if obj is self.prompt and event.type() == QEvent.Type.KeyPress:
            ctrl = event.modifiers() & Qt.KeyboardModifier.ControlModifier
            if ctrl and event.key() == Qt.Key.Key_Tab:
                self.prompt.insertPlainText("\t")
                return True
            if ctrl and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
                self._send()
                return True
            if event.key() == Qt.Key.Key_Escape and self.busy:
                self.stop_requested.emit()
                return True
        return super().eventFilter(obj, event)

    # ---- actions
    def _send(self) -> None:
        text = self.prompt.toPlainText().strip()
        if not text or self.busy:
            return
        self.show_notice("")
        shown = len(self.widgets)
        self.send_requested.emit(text)  # the controller appends the message at once (direct connection) or refuses
        if len(self.widgets) > shown:  # accepted: it is in the transcript now, so the box may be emptied
            self.prompt.clear()

    def _action(self, name: str, index: int) -> None:
        w = self.widgets[index]
        if name == "copy":
            QGuiApplication.clipboard().setText(w.plain_text())
        elif name == "regenerate" and not self.busy:
            self.regenerate_requested.emit()
        elif name == "edit" and not self.busy:
            text = self.ask_edit(w.plain_text())
            if text is None or not text.strip():
                return
            later = len(self.widgets) - index - 1
            after = "the message after it" if later == 1 else f"the {later} messages after it"
            if later and not self.confirm(f"Editing this message removes {after}. Continue?"):
                return
            self.edit_requested.emit(index, text)

    # dialogs are methods so tests can answer them
    def ask_edit(self, text: str) -> str | None:
        """The message in a wide, wrapping editor; None when cancelled."""
        dialog = EditDialog(text, self)
        return dialog.text() if dialog.exec() == QDialog.DialogCode.Accepted else None

    def confirm(self, question: str) -> bool:
        return QMessageBox.question(self, "Edit message", question) == QMessageBox.StandardButton.Yes


class EditDialog(QDialog):
    """Edit a message: a wrapping editor wide enough for a paragraph (Ctrl+Enter saves, Esc cancels)."""

    def __init__(self, text: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Edit message")
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Edit the message; the reply is generated again (later turns are removed)."))
        self.editor = QPlainTextEdit(text)
        self.editor.setAccessibleName("Message text")
        self.editor.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.editor.setTabChangesFocus(True)
        layout.addWidget(self.editor, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Save).setText("Save and ask again")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        for keys in ("Ctrl+Return", "Ctrl+Enter"):
            QShortcut(QKeySequence(keys), self, self.accept)
        self.resize(640, 300)
        self.editor.setFocus()

    def text(self) -> str:
        return self.editor.toPlainText()
