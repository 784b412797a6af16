"""Issue 13 item 5: the app starts with a damaged database (moved aside, kept, named), with a data folder that cannot be
written (a read-only session showing the old conversations), and a full disk keeps the typed message and says why.
Read-only and full disks are real tmpfs mounts where the machine allows (root), as in the reliability probe."""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from tessera.app.store import ConversationStore, Message
from tessera.app.store_open import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from probe import Tmpfs, can_mount  # noqa: E402

MOUNTS = can_mount()


def filled_db(path: Path) -> None:
    store = ConversationStore(path)
    conv = store.create_conversation("kept chat")
    store.add_message(conv.id, Message("user", "hello " * 200))
    store.close()


@pytest.mark.parametrize("damage", ["not_a_database", "damaged_pages"])
def test_a_damaged_database_is_moved_aside_and_a_new_one_opened(tmp_path, damage):
    db = tmp_path / "conversations.sqlite3"
    if damage == "not_a_database":
        db.write_bytes(b"this is not SQLite at all" * 100)
    else:
        filled_db(db)
        raw = bytearray(db.read_bytes())
        raw[4096:8192] = b"\xff" * 4096  # the second page: table contents
        db.write_bytes(bytes(raw))
    before = db.read_bytes()
    opened = open_store(db)
    moved = [p for p in tmp_path.iterdir() if ".damaged-" in p.name and not p.name.endswith(("-wal", "-shm"))]
    assert len(moved) == 1 and moved[0].read_bytes() == before  # kept, byte for byte
    assert str(moved[0]) in opened.notice and not opened.read_only
    conv = opened.store.create_conversation("new")  # the fresh database works
    assert [c.title for c in opened.store.conversations()] == ["new"] and conv.id == 1
    opened.store.close()


def test_a_healthy_database_opens_without_a_notice(tmp_path):
    db = tmp_path / "conversations.sqlite3"
    filled_db(db)
    opened = open_store(db)
    assert opened.notice is None and [c.title for c in opened.store.conversations()] == ["kept chat"]
    opened.store.close()


@pytest.mark.skipif(not MOUNTS, reason="needs root to mount a read-only tmpfs")
def test_a_read_only_data_folder_gives_a_read_only_session(tmp_path):
    folder = tmp_path / "data"
    with Tmpfs(folder, "4m") as fs:
        filled_db(folder / "conversations.sqlite3")
        before = (folder / "conversations.sqlite3").read_bytes()
        fs.readonly()
        opened = open_store(folder / "conversations.sqlite3")
        assert opened.read_only and "read-only" in opened.notice and str(folder) in opened.notice
        store = opened.store
        assert [c.title for c in store.conversations()] == ["kept chat"]
        conv = store.create_conversation("in memory only")  # usable, never saved
        store.add_message(conv.id, Message("user", "x"))
        assert (folder / "conversations.sqlite3").read_bytes() == before
        store.close()


def test_a_read_only_folder_without_a_database_starts_empty(tmp_path, monkeypatch):
    import tessera.app.store_open as so

    monkeypatch.setattr(so, "_writable", lambda folder: False)
    opened = open_store(tmp_path / "none" / "conversations.sqlite3")
    assert opened.read_only and opened.store.conversations() == []


def test_a_full_disk_keeps_the_message_and_says_why(tmp_path):
    from test_controller import make

    c, store, worker = make(tmp_path)
    notices = []
    c.notice.connect(notices.append)
    if MOUNTS:
        folder = tmp_path / "full"
        with Tmpfs(folder, "128k"):
            store = ConversationStore(folder / "c.sqlite3")
            c.store = store
            filler = folder / "filler"
            try:
                with open(filler, "wb") as f:
                    while True:
                        f.write(b"\0" * 4096)
                        f.flush()
            except OSError:
                pass  # the disk is full now
            assert not c.send("my long typed message " * 200)
            store.close()
    else:
        def full(*_a, **_k):
            raise sqlite3.OperationalError("database or disk is full")

        store.add_message = full
        store.create_conversation = full
        assert not c.send("my long typed message")
    assert "could not be saved" in notices[-1] and "still in the box" in notices[-1]
    assert worker.requests == []


def test_a_failure_at_start_still_opens_a_window(monkeypatch, tmp_path, capsys):
    import tessera.app.__main__ as main_mod
    import tessera.app.store_open as so

    monkeypatch.setenv("TESSERA_DATA_DIR", str(tmp_path))

    def broken(path):
        raise RuntimeError("simulated failure while starting")

    monkeypatch.setattr(so, "open_store", broken)
    shown = []
    from PySide6.QtWidgets import QMessageBox

    monkeypatch.setattr(QMessageBox, "exec", lambda self: shown.append((self.windowTitle(), self.text())) or 0)
    assert main_mod.main(["--no-demo"]) == 1
    assert shown == [("Tessera could not start", "RuntimeError: simulated failure while starting")]
    shutil.rmtree(tmp_path, ignore_errors=True)
