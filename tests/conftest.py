"""Shared pytest fixtures. Keep each fixture small and documented; parts add theirs with surgical edits."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# The suite never reads or writes the user's cache folder (packed copies, scale-check records, tuning records): every
# default folder (platformdirs' user cache dir) is under a throw-away XDG_CACHE_HOME, which child processes inherit,
# and the user's own folder overrides are dropped, so a test that moves XDG_CACHE_HOME moves every folder with it.
# Kernel tuning never calibrates on a load.
_TEST_CACHE = tempfile.mkdtemp(prefix="tessera-cache-tests-")
atexit.register(shutil.rmtree, _TEST_CACHE, ignore_errors=True)
os.environ["XDG_CACHE_HOME"] = _TEST_CACHE
for _override in ("TESSERA_PACK_CACHE_DIR", "TESSERA_TUNE_DIR"):
    os.environ.pop(_override, None)
os.environ.setdefault("TESSERA_TUNE_ON_LOAD", "0")


@pytest.fixture(scope="session")
def tiny_hf_model(tmp_path_factory):
    """Path of a random tiny Qwen3-MoE HF folder (make-model preset tiny, f32, seed 0, sharded into ~3 safetensors files
    with model.safetensors.index.json). Same weights as `tiny_gguf_model`. Treat as read-only."""
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("tiny-hf") / "model", fmt="hf", dtype="f32", seed=0,
                      max_shard_bytes=1_500_000)


@pytest.fixture(scope="session")
def tiny_gguf_model(tmp_path_factory):
    """Path of a random tiny Qwen3-MoE GGUF file (make-model preset tiny, f32, seed 0): the same weights, tokenizer and
    config as `tiny_hf_model`. Treat as read-only."""
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf", fmt="gguf", dtype="f32", seed=0)


@pytest.fixture(autouse=True)
def _wait_signal_quits_on_its_own_thread(request, monkeypatch):
    """qtbot.waitSignal on a signal the app's worker thread emits, made race-free. PySide6 calls pytest-qt's slot (a
    plain bound method) on the emitting thread, where it stops the waiter's QTimer (Qt refuses that across threads but
    forgets the timer's id, so the timer stays registered and fires every `timeout`, ignored) and quits the waiter's
    event loop, which is lost when the loop has not begun to run yet. A reply landing in that gap hangs the wait for
    good: the whole suite hung so once, in test_worker_serving's immediate "no model is loaded" reply, on a machine
    busy with two other jobs (gdb: the main thread in the loop's poll, a 30 s timer re-armed). The slot now runs on
    the waiter's thread, through a queued call, whichever thread emits."""
    if "qtbot" not in request.fixturenames:
        return
    from PySide6.QtCore import QObject, QThread, Signal, Slot
    from pytestqt.wait_signal import SignalBlocker

    class Relay(QObject):
        call = Signal(object)

        def __init__(self):
            super().__init__()
            self.call.connect(self.run)

        @Slot(object)
        def run(self, fn):
            fn()

    relay = Relay()  # made on the test's (main) thread: its slot runs there
    original = SignalBlocker._quit_loop_by_signal

    def quit_on_waiter_thread(self, *args):
        if QThread.currentThread() == self._loop.thread():
            return original(self, *args)
        relay.call.emit(lambda: None if self.signal_triggered else original(self, *args))
        return None

    monkeypatch.setattr(SignalBlocker, "_quit_loop_by_signal", quit_on_waiter_thread)
