"""Conversations in SQLite (WAL): one row per conversation, one per message, written while tokens arrive.

A reply in progress has state 'streaming'; `ConversationStore.open` marks any left over from a crash or kill as
'interrupted', so the partial text is shown after the next start. Thinking text is kept in its own column.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id       INTEGER PRIMARY KEY,
    title    TEXT NOT NULL,
    created  REAL NOT NULL,
    updated  REAL NOT NULL,
    model    TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS messages (
    id              INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    seq             INTEGER NOT NULL,
    role            TEXT NOT NULL,
    content         TEXT NOT NULL DEFAULT '',
    thinking        TEXT NOT NULL DEFAULT '',
    thinking_s      REAL,
    state           TEXT NOT NULL DEFAULT 'done',
    metrics         TEXT NOT NULL DEFAULT '{}',
    created         REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, seq);
"""

STATES = ("done", "streaming", "interrupted", "stopped", "error")


@dataclass
class Message:
    role: str  # "system" | "user" | "assistant"
    content: str = ""
    thinking: str = ""
    thinking_s: float | None = None
    state: str = "done"
    metrics: dict = field(default_factory=dict)
    id: int | None = None
    seq: int = 0


@dataclass
class Conversation:
    id: int
    title: str
    created: float
    updated: float
    model: str = ""


class ConversationStore:
    """All database access. Used from the UI thread only (each write is one small transaction)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), isolation_level=None)  # autocommit; explicit transactions below
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        self.recovered = self._recover()

    def _recover(self) -> int:
        """Mark replies that were streaming when the app died as interrupted; returns how many."""
        cur = self._db.execute("UPDATE messages SET state='interrupted' WHERE state='streaming'")
        return cur.rowcount

    def close(self) -> None:
        self._db.close()

    @property
    def journal_mode(self) -> str:
        return self._db.execute("PRAGMA journal_mode").fetchone()[0]

    # conversations
    def create_conversation(self, title: str = "New chat", model: str = "") -> Conversation:
        now = time.time()
        cur = self._db.execute("INSERT INTO conversations(title, created, updated, model) VALUES (?,?,?,?)",
                               (title, now, now, model))
        return Conversation(cur.lastrowid, title, now, now, model)

    def conversations(self, search: str = "") -> list[Conversation]:
        if search:
            like = f"%{_escape_like(search)}%"
            rows = self._db.execute(
                "SELECT * FROM conversations c WHERE c.title LIKE ? ESCAPE '\\' OR EXISTS ("
                " SELECT 1 FROM messages m WHERE m.conversation_id=c.id AND m.content LIKE ? ESCAPE '\\')"
                " ORDER BY updated DESC, id DESC", (like, like)).fetchall()
        else:
            rows = self._db.execute("SELECT * FROM conversations ORDER BY updated DESC, id DESC").fetchall()
        return [Conversation(r["id"], r["title"], r["created"], r["updated"], r["model"]) for r in rows]

    def snippet(self, conversation_id: int, search: str, around: int = 28) -> str:
        """The first message text of the conversation that contains `search`, cut to `around` characters either side
        of the match ("" when no message contains it, e.g. only the title matched)."""
        row = self._db.execute(
            "SELECT content FROM messages WHERE conversation_id=? AND content LIKE ? ESCAPE '\\' ORDER BY seq LIMIT 1",
            (conversation_id, f"%{_escape_like(search)}%")).fetchone()
        if row is None or not search:
            return ""
        text = " ".join(row["content"].split())
        at = max(0, text.lower().find(" ".join(search.split()).lower()))
        start, end = max(0, at - around), min(len(text), at + len(search) + around)
        return ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")

    def conversation(self, conversation_id: int) -> Conversation | None:
        r = self._db.execute("SELECT * FROM conversations WHERE id=?", (conversation_id,)).fetchone()
        return Conversation(r["id"], r["title"], r["created"], r["updated"], r["model"]) if r else None

    def rename(self, conversation_id: int, title: str) -> None:
        self._db.execute("UPDATE conversations SET title=?, updated=? WHERE id=?",
                         (title, time.time(), conversation_id))

    def delete(self, conversation_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    # messages
    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute("SELECT * FROM messages WHERE conversation_id=? ORDER BY seq, id",
                                (conversation_id,)).fetchall()
        return [Message(r["role"], r["content"], r["thinking"], r["thinking_s"], r["state"],
                        json.loads(r["metrics"] or "{}"), r["id"], r["seq"]) for r in rows]

    def add_message(self, conversation_id: int, message: Message) -> Message:
        now = time.time()
        with self._transaction():
            seq = self._db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE conversation_id=?",
                                   (conversation_id,)).fetchone()[0]
            cur = self._db.execute(
                "INSERT INTO messages(conversation_id, seq, role, content, thinking, thinking_s, state, metrics,"
                " created) VALUES (?,?,?,?,?,?,?,?,?)",
                (conversation_id, seq, message.role, message.content, message.thinking, message.thinking_s,
                 message.state, json.dumps(message.metrics), now))
            self._db.execute("UPDATE conversations SET updated=? WHERE id=?", (now, conversation_id))
        message.id, message.seq = cur.lastrowid, seq
        return message

    def update_message(self, message: Message) -> None:
        """Write the message's current text/state/metrics (called once per batch of streamed tokens)."""
        assert message.id is not None
        if message.state not in STATES:
            raise ValueError(f"message state {message.state!r} is not one of {STATES}")
        self._db.execute(
            "UPDATE messages SET content=?, thinking=?, thinking_s=?, state=?, metrics=? WHERE id=?",
            (message.content, message.thinking, message.thinking_s, message.state, json.dumps(message.metrics),
             message.id))

    def delete_messages_from(self, conversation_id: int, seq: int) -> None:
        """Drop the message at `seq` and every later one (edit and regenerate)."""
        self._db.execute("DELETE FROM messages WHERE conversation_id=? AND seq>=?", (conversation_id, seq))

    def _transaction(self):
        db = self._db

        class _Tx:
            def __enter__(self):
                db.execute("BEGIN")

            def __exit__(self, exc_type, *_):
                db.execute("ROLLBACK" if exc_type else "COMMIT")
                return False

        return _Tx()


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
