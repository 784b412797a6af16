"""Opening the conversation database so that the app always starts (issue 13 item 5):

- a damaged database is moved aside (kept, never deleted: `conversations.sqlite3.damaged-YYYYmmdd-HHMMSS`, with its
  -wal/-shm files) and a fresh one opened; the notice says where the old one is;
- a data folder that cannot be written gives a read-only session: the existing conversations are copied into memory
  (shown and usable, nothing saved), and the notice says so.

`open_store(path) -> OpenedStore(store, notice, read_only)`; the notice is None when all went well.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from tessera.app.store import SCHEMA, ConversationStore


@dataclass
class OpenedStore:
    store: ConversationStore
    notice: str | None = None  # a sentence for a dialog, or None
    read_only: bool = False


class MemoryStore(ConversationStore):
    """A ConversationStore held in memory: a copy of `source` (read-only) or empty. Nothing reaches the disk."""

    def __init__(self, source: Path | None):
        self.path = Path(":memory:")
        self._db = sqlite3.connect(":memory:", isolation_level=None)
        if source is not None and source.is_file():
            # immutable: no -shm/-wal to create (a WAL database on a read-only disk opens only this way)
            disk = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
            try:
                disk.backup(self._db)
            finally:
                disk.close()
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        self.recovered = self._recover()


def _healthy(store: ConversationStore) -> None:
    """Raises sqlite3.DatabaseError unless the file passes SQLite's quick check."""
    row = store._db.execute("PRAGMA quick_check").fetchone()
    if row is None or row[0] != "ok":
        raise sqlite3.DatabaseError(f"quick_check: {row[0] if row else 'no answer'}")


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def move_aside(path: Path) -> Path:
    """Renames the database (and its -wal/-shm) to `<name>.damaged-<time>`; returns the new path of the database."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    for suffix in ("-wal", "-shm", ""):
        part = Path(str(path) + suffix)
        if part.exists():
            part.rename(Path(str(target) + suffix))
    return target


def open_store(path: str | os.PathLike) -> OpenedStore:
    path = Path(path)
    if not _writable(path.parent):
        try:
            store = MemoryStore(path)
            notice = (f"The data folder {path.parent} cannot be written, so this session is read-only: your "
                      "conversations are shown, but nothing new will be saved.")
        except sqlite3.DatabaseError as e:
            store = MemoryStore(None)
            notice = (f"The data folder {path.parent} cannot be written and its database could not be read ({e}): "
                      "this session starts empty and nothing will be saved.")
        return OpenedStore(store, notice, read_only=True)
    store = None
    try:
        store = ConversationStore(path)
        _healthy(store)
        return OpenedStore(store)
    except sqlite3.DatabaseError as e:
        if store is not None:
            try:
                store.close()
            except sqlite3.Error:
                pass
        if isinstance(e, sqlite3.OperationalError) and "readonly" in str(e).lower():
            return OpenedStore(MemoryStore(path), f"The database {path} is read-only, so this session is read-only: "
                                                  "nothing new will be saved.", read_only=True)
        moved = move_aside(path)
        return OpenedStore(ConversationStore(path),
                           f"The conversation database was damaged ({e}). It was moved aside, not deleted: {moved}. "
                           "A new, empty one was started.")
