"""A `python -m tessera.app` process killed with SIGKILL while it streams a reply leaves the conversation and the
partial reply in the database; the next start marks it interrupted and shows it."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest


def app_env(data):
    return dict(os.environ, QT_QPA_PLATFORM="offscreen", TESSERA_DATA_DIR=str(data))


def streaming_reply(db) -> tuple[int, str] | None:
    if not db.exists():
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.1)
        try:
            row = con.execute("SELECT id, content || thinking FROM messages WHERE role='assistant' AND "
                              "state='streaming' AND length(content || thinking) > 0").fetchone()
        finally:
            con.close()
    except sqlite3.OperationalError:  # schema not created yet, or busy
        return None
    return row


def finished_reply(db) -> bool:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.1)
        try:
            return con.execute("SELECT 1 FROM messages WHERE role='assistant' AND state!='streaming'").fetchone() \
                is not None
        finally:
            con.close()
    except sqlite3.OperationalError:
        return False


def run_and_kill(tmp_path, model, seed):
    """Start the app on `model` with one prompt, SIGKILL it once a partial reply is in the database.
    Returns (data dir, the partial reply seen) or None when the reply ended (an early end-of-sequence) first."""
    from tessera.app.settings import Settings

    data = tmp_path / f"data-{seed}"
    data.mkdir()
    s = Settings(data / "settings.ini")
    s.set("sampling/max_tokens", 100000)  # bounded by the model's context (1024)
    s.set("sampling/temperature", 1.0)
    s.set("sampling/seed", seed)
    s.sync()
    db = data / "conversations.sqlite3"
    proc = subprocess.Popen([sys.executable, "-m", "tessera.app", "--model", str(model), "--prompt",
                             "Tell me a long story"],
                            cwd=tmp_path, env=app_env(data), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen = None
    try:
        deadline = time.monotonic() + 120
        while seen is None and time.monotonic() < deadline and proc.poll() is None:
            seen = streaming_reply(db)
            if seen is None and finished_reply(db):
                break
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err
    return (data, seen) if seen is not None else None


@pytest.mark.slow
def test_sigkill_during_generation_keeps_the_partial_reply(tmp_path, tiny_gguf_model):
    from tessera.app.store import ConversationStore

    # a random model may end its reply after a few tokens; then try another seed
    for seed in (3, 11, 29, 47):
        got = run_and_kill(tmp_path, tiny_gguf_model, seed)
        if got is not None:
            break
    assert got is not None, "every reply ended before a partial one reached the database"
    data, seen = got
    store = ConversationStore(data / "conversations.sqlite3")  # what the next start does first
    assert store.recovered == 1
    (conv,) = store.conversations()
    user, reply = store.messages(conv.id)
    assert user.content == "Tell me a long story"
    assert reply.state == "interrupted" and len(reply.content + reply.thinking) > 0 and seen[1]
    store.close()
    # and the app starts again on that database without a traceback
    again = subprocess.run([sys.executable, "-m", "tessera.app", "--no-demo", "--quit-after", "300"], cwd=tmp_path,
                           env=app_env(data), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
