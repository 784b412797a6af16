"""ChatController: the conversation being shown, its persistence, and its requests to the worker.

It turns view actions (send, stop, regenerate, edit, open/new conversation) into worker requests and store writes, and
worker results into transcript updates. Streamed tokens are written to the store in batches (every `flush_tokens`
tokens or `flush_seconds`, whichever comes first), so a kill loses at most the last batch.
"""

from __future__ import annotations

import sqlite3
import time

from PySide6.QtCore import QObject, Signal, Slot

from tessera.app.payloads import GenerationResult, TokenChunk
from tessera.app.settings import Settings
from tessera.app.store import ConversationStore, Message
from tessera.app.thinking import split_thinking

DEFAULT_TITLE = "New chat"


def sampling_from_settings(settings: Settings) -> dict:
    seed = settings.get("sampling/seed")
    return {
        "temperature": settings.get("sampling/temperature"),
        "top_k": settings.get("sampling/top_k"),
        "top_p": settings.get("sampling/top_p"),
        "min_p": settings.get("sampling/min_p"),
        "repetition_penalty": settings.get("sampling/repetition_penalty"),
        "seed": None if seed < 0 else seed,
        "max_tokens": settings.get("sampling/max_tokens"),
    }


def auto_title(first_message: str) -> str:
    """A new chat's title: the start of its first message, on one line."""
    return " ".join(first_message.split())[:48] or DEFAULT_TITLE


class ChatController(QObject):
    conversation_reset = Signal(object)  # list[Message]: show this transcript from scratch
    message_added = Signal(object)  # Message appended at the end
    message_changed = Signal(int, object)  # index, Message (streaming text, final metrics)
    busy_changed = Signal(bool)
    context_changed = Signal(int, int)  # tokens used, context length
    conversations_changed = Signal()  # titles or order changed: refresh the sidebar
    current_changed = Signal(int)  # id of the conversation shown (0: none yet)
    notice = Signal(str)  # a short inline message for the user

    def __init__(self, store: ConversationStore, worker, settings: Settings, *, flush_tokens: int = 8,
                 flush_seconds: float = 0.25, parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.worker = worker
        self.settings = settings
        self.flush_tokens = flush_tokens
        self.flush_seconds = flush_seconds
        self.conversation_id = 0
        self.messages: list[Message] = []
        self.context_length = 0
        self.model_loaded = False
        self.model_name = ""
        self.thinking = bool(settings.get("chat/thinking"))
        self._active: _Active | None = None
        worker.tokens.connect(self.on_tokens)
        worker.finished.connect(self.on_finished)

    # ---- state
    @property
    def busy(self) -> bool:
        return self._active is not None

    def set_model(self, loaded: bool, name: str = "", context_length: int = 0) -> None:
        changed = loaded and name != self.model_name
        self.model_loaded, self.model_name = loaded, name
        self.context_length = context_length
        self._emit_context()
        if changed:
            self._say_if_another_model()

    def last_model(self) -> str:
        """The model that wrote this conversation's last reply ("" when none is known)."""
        for m in reversed(self.messages):
            if m.role == "assistant" and m.state != "streaming" and m.metrics.get("model"):
                return str(m.metrics["model"])
        conv = self.store.conversation(self.conversation_id) if self.conversation_id else None
        return conv.model if conv is not None and self.messages else ""

    def _say_if_another_model(self) -> None:
        previous = self.last_model()
        if self.model_loaded and previous and previous != self.model_name:
            self.notice.emit(f"This chat was written by {previous}; the next reply comes from {self.model_name}.")

    def set_thinking(self, on: bool) -> None:
        self.thinking = bool(on)

    # ---- conversations
    def new_conversation(self) -> None:
        if self.busy:
            self.stop()
        self.conversation_id = 0
        self.messages = []
        self.conversation_reset.emit([])
        self.current_changed.emit(0)
        self._emit_context()

    def open_conversation(self, conversation_id: int) -> None:
        if conversation_id == self.conversation_id:
            return
        if self.busy:
            self.stop()
        self.conversation_id = conversation_id
        self.messages = self.store.messages(conversation_id)
        self.conversation_reset.emit(list(self.messages))
        self.current_changed.emit(conversation_id)
        self._emit_context()
        self._say_if_another_model()

    def rename(self, conversation_id: int, title: str) -> None:
        self.store.rename(conversation_id, title.strip() or DEFAULT_TITLE)
        self.conversations_changed.emit()

    def delete(self, conversation_id: int) -> None:
        if conversation_id == self.conversation_id:
            self.new_conversation()
        self.store.delete(conversation_id)
        self.conversations_changed.emit()

    # ---- chat actions
    def send(self, text: str) -> bool:
        text = text.strip()
        if not text:
            return False
        if self.busy:
            self.notice.emit("A reply is being generated: stop it first (Esc).")
            return False
        if not self.model_loaded:
            self.notice.emit("No model is loaded: open one from the model panel or the welcome page.")
            return False
        try:
            if not self.conversation_id:
                title = auto_title(text)
                self.conversation_id = self.store.create_conversation(title, self.model_name).id
                self.current_changed.emit(self.conversation_id)
                system = self.settings.get("chat/system_prompt").strip()
                if system:
                    self._append(Message("system", system))
            self._append(Message("user", text))
        except sqlite3.Error as e:  # a full disk, a folder made read-only meanwhile: the typed text stays in the box
            self.notice.emit(f"The message could not be saved ({e}); it is still in the box. Free some disk space "
                             "and send it again.")
            return False
        self._start_reply()
        self.conversations_changed.emit()
        return True

    def stop(self) -> None:
        self.worker.stop()

    def regenerate(self) -> bool:
        """Drop the last reply and ask again."""
        if self.busy or not self.model_loaded:
            return False
        last = len(self.messages) - 1
        if last < 0 or self.messages[last].role != "assistant":
            return False
        self._truncate(last)
        self._start_reply()
        return True

    def edit(self, index: int, text: str) -> bool:
        """Replace user message `index` with `text`, drop every later message, and ask again."""
        if self.busy or not self.model_loaded:
            return False
        if not (0 <= index < len(self.messages)) or self.messages[index].role != "user" or not text.strip():
            return False
        first_user = next(i for i, m in enumerate(self.messages) if m.role == "user")
        conv = self.store.conversation(self.conversation_id)
        if index == first_user and conv is not None and conv.title == auto_title(self.messages[index].content):
            self.store.rename(self.conversation_id, auto_title(text))  # the title was made from this message
            self.conversations_changed.emit()
        self._truncate(index)
        self._append(Message("user", text.strip()))
        self._start_reply()
        return True

    def history(self) -> list[dict]:
        """The messages the model sees: finished turns only, answers without their thinking."""
        out = []
        for m in self.messages:
            if m.role == "assistant" and (m.state == "streaming" or (m.state == "error" and not m.content)):
                continue
            out.append({"role": m.role, "content": m.content})
        return out

    # ---- worker results
    @Slot(object)
    def on_tokens(self, chunk: TokenChunk) -> None:
        a = self._active
        if a is None or chunk.request_id != a.request_id:
            return
        a.raw += chunk.text
        if a.first_t is None:
            a.first_t = chunk.t  # the first chunk holds the first token alone: its time is the TTFT
        a.tokens = chunk.total_tokens
        a.pending += chunk.tokens
        self._apply(a, chunk.t)
        if a.pending >= self.flush_tokens or time.monotonic() - a.last_write >= self.flush_seconds:
            self._write(a)

    @Slot(object)
    def on_finished(self, result: GenerationResult) -> None:
        a = self._active
        if a is None or result.request_id != a.request_id:
            return
        if result.text:
            a.raw = result.text
        m = a.message
        metrics = {k: v for k, v in m.metrics.items() if k in ("model", "continued_from")}
        metrics.update(result.metrics)
        self._apply(a, None)
        stop = metrics.get("stop_reason", "")
        m.state = "error" if result.error else ("stopped" if stop == "cancelled" else "done")
        if result.error:
            metrics["error"] = result.error
        m.metrics = metrics
        self._write(a)
        self._active = None
        if a.conversation_id == self.conversation_id:
            self.message_changed.emit(a.index, m)
        self.busy_changed.emit(False)
        self._emit_context()

    # ---- internals
    def _append(self, message: Message) -> Message:
        self.store.add_message(self.conversation_id, message)
        self.messages.append(message)
        self.message_added.emit(message)
        return message

    def _truncate(self, index: int) -> None:
        self.store.delete_messages_from(self.conversation_id, self.messages[index].seq)
        del self.messages[index:]
        self.conversation_reset.emit(list(self.messages))

    def _start_reply(self) -> None:
        history = self.history()
        attribution = {"model": self.model_name}  # which model wrote this reply (shown in its header)
        previous = self.last_model()
        if previous and previous != self.model_name:
            attribution["continued_from"] = previous
        reply = self._append(Message("assistant", state="streaming", metrics=attribution))
        request_id = self.worker.generate(history, sampling_from_settings(self.settings), self.thinking,
                                          allow_special_tokens=self.settings.get("chat/allow_special_tokens"))
        self._active = _Active(request_id, self.conversation_id, len(self.messages) - 1, reply)
        self.busy_changed.emit(True)

    def _apply(self, a: _Active, t: float | None) -> None:
        split = split_thinking(a.raw)
        m = a.message
        m.thinking, m.content = split.thinking, split.answer
        start = a.first_t or 0.0  # thinking starts with the first generated token
        if split.open and t is not None:
            m.thinking_s = max(0.0, t - start)  # still thinking: time so far
        elif split.thinking and a.think_end is None and t is not None:
            a.think_end = max(0.0, t - start)
            m.thinking_s = a.think_end
        elif split.thinking and a.think_end is not None:
            m.thinking_s = a.think_end
        m.metrics = {**m.metrics, "generated_tokens": a.tokens}
        if a.conversation_id == self.conversation_id:
            self.message_changed.emit(a.index, m)

    def _write(self, a: _Active) -> None:
        self.store.update_message(a.message)
        a.pending = 0
        a.last_write = time.monotonic()

    def _emit_context(self) -> None:
        used = 0
        for m in reversed(self.messages):
            if m.role == "assistant" and m.metrics.get("prompt_tokens") is not None:
                used = int(m.metrics.get("prompt_tokens", 0)) + int(m.metrics.get("generated_tokens", 0))
                break
        self.context_changed.emit(used, self.context_length)


class _Active:
    """The request being streamed."""

    def __init__(self, request_id: int, conversation_id: int, index: int, message: Message):
        self.request_id = request_id
        self.conversation_id = conversation_id
        self.index = index
        self.message = message
        self.raw = ""
        self.tokens = 0
        self.pending = 0
        self.last_write = time.monotonic()
        self.think_end: float | None = None
        self.first_t: float | None = None
