"""make_backend writes the packed-weight cache on a thread beside the packing (engine.pack_store: the disk at its speed
while the cores pack the next layer): by default every pack is on disk and recorded when the load returns; with
store_in_background (a session's load) the load returns first, and closing the backend or the end of the process
finishes them. A load stopped half-way leaves no partial file and no writer running, and an
unexpected error in a write is raised, not lost."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import torch

import tessera.engine.native as N
from tessera.engine import pack_cache, pack_store
from tessera.engine.experts import LayerExperts
from tessera.engine.pack_cache import PackCache

BACKEND = "Reference"


def layers(n=3):
    g = torch.Generator().manual_seed(5)
    w = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    return {i: LayerExperts(w(4, 32, 64), w(4, 32, 64), w(4, 64, 32)) for i in range(n)}


def writers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tessera-pack-store")]


def test_every_pack_is_stored_and_recorded_when_the_load_returns(tmp_path):
    root = tmp_path / "packed"
    first = N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m")
    assert first.load_stats.packed_layers == 3 and not writers()
    assert len(list((root / "layers").iterdir())) == 3
    again = N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m")
    assert again.load_stats.cached_layers == 3
    (entry,) = PackCache(root).models()
    assert len(entry.keys) == 3 and entry.bytes > sum(layer.nbytes for layer in first.layers.values())


def test_a_load_stopped_half_way_leaves_whole_files_only(tmp_path):
    root = tmp_path / "packed"

    def stop_after_two(event):
        if event.done == 2:
            raise KeyboardInterrupt  # what a cancelled load raises through its progress callback

    with pytest.raises(KeyboardInterrupt):
        N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m", progress=stop_after_two)
    assert not writers()
    assert not [p for p in root.rglob("*") if ".tmp" in p.name]  # no half-written pack
    kept = len(list((root / "layers").iterdir()))
    assert 0 <= kept <= 2
    again = N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m")
    assert again.load_stats.cached_layers == kept and again.load_stats.packed_layers == 3 - kept


def test_an_unexpected_error_in_a_write_is_raised(tmp_path, monkeypatch):
    def broken(self, key, blob, **_):
        raise RuntimeError(f"store of {key} broke")

    monkeypatch.setattr(PackCache, "store", broken)
    with pytest.raises(RuntimeError, match="store of .* broke"):
        N.make_backend(BACKEND, layers(), threads=1, cache_dir=tmp_path / "packed", model_id="m")
    assert not writers()


@pytest.fixture
def gated_store(monkeypatch):
    """PackCache.store held until the returned event is set (a slow disk)."""
    gate, real = threading.Event(), PackCache.store

    def slow(self, key, blob, **kw):
        assert gate.wait(30)
        return real(self, key, blob, **kw)

    monkeypatch.setattr(PackCache, "store", slow)
    yield gate
    gate.set()


def test_a_background_load_returns_before_its_writes_and_the_process_end_finishes_them(tmp_path, gated_store):
    root = tmp_path / "packed"
    b = N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m", store_in_background=True)
    assert b.load_stats.packed_layers == 3 and not list((root / "layers").glob("*"))  # returned, nothing written yet
    assert b.stores.pending_bytes() == sum(layer.nbytes for layer in b.layers.values())
    gated_store.set()
    pack_store.finish_all()  # what atexit runs, also before the CLI's quick exit
    assert len(list((root / "layers").iterdir())) == 3 and not writers()
    assert N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m").load_stats.cached_layers == 3


def test_closing_a_background_load_finishes_its_writes(tmp_path, gated_store):
    """A session closed (or another model chosen) right after a first load: the writes end before close returns,
    so the next load finds every pack and the packs' memory is free before anything else loads."""
    root = tmp_path / "packed"
    b = N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m", store_in_background=True)
    threading.Timer(0.3, gated_store.set).start()
    b.close()
    assert not writers() and b.stores.pending_bytes() == 0
    assert len(list((root / "layers").iterdir())) == 3
    assert N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m").load_stats.cached_layers == 3


def test_a_backend_closed_for_a_switch_leaves_its_writes_running_until_done(tmp_path, gated_store):
    """A backend switched away from (Session.set_backend, the new one loaded already) does not wait for its writes:
    they go on, counted and held by the process, and end on disk."""
    import gc

    root = tmp_path / "packed"
    b = N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m", store_in_background=True)
    total = sum(layer.nbytes for layer in b.layers.values())
    b.close(finish_writes=False)  # returns although no write can start yet
    del b
    gc.collect()
    assert pack_store.pending_bytes() == total and writers()  # still known (the close dialog counts them)
    gated_store.set()
    deadline = time.monotonic() + 30
    while pack_store._detached and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pack_store._detached and pack_store.pending_bytes() == 0
    assert len(list((root / "layers").glob("*.pack"))) == 3
    assert N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m").load_stats.cached_layers == 3


def test_a_session_switches_backend_without_waiting_for_the_old_ones_writes(tmp_path, monkeypatch, gated_store):
    from tessera import engine
    from tessera.engine.make_model import make_model

    monkeypatch.setenv("TESSERA_PACK_CACHE_DIR", str(tmp_path / "packed"))
    model = make_model(tmp_path / "bf16.gguf", fmt="gguf", dtype="bf16", seed=2)
    session = engine.load(model, backend=BACKEND, threads=1)
    try:
        assert pack_store.pending_bytes() > 0  # its first load's packs wait for the (held) disk
        switch = threading.Thread(target=session.set_backend, args=(BACKEND,))
        switch.start()
        switch.join(20)
        done_while_held = not switch.is_alive()
        gated_store.set()
        switch.join()
        assert done_while_held  # before: the switch waited for every write of the old backend
        assert session.backend_name == BACKEND
    finally:
        session.close()
        pack_store.finish_all()
    assert pack_store.pending_bytes() == 0


@pytest.fixture
def small_pieces(monkeypatch):
    """Packs written in pieces of 4 KiB, so the tiny layers here take several pieces each."""
    monkeypatch.setattr(pack_cache, "_STORE_PIECE", 4096)


def test_a_store_in_pieces_asks_before_each_and_may_be_abandoned(tmp_path, small_pieces):
    cache = PackCache(tmp_path / "packed")
    blob = np.arange(10_000, dtype=np.uint8)
    asked: list[int] = []
    assert cache.store("a" * 40, blob, between=lambda n: asked.append(n) or True)
    assert asked == [0, 4096, 8192]
    assert cache.load("a" * 40, blob.nbytes, lambda b: None).tobytes() == blob.tobytes()
    assert not cache.store("b" * 40, blob, between=lambda n: n < 8192)  # given up before the third piece
    assert not cache.layer_path("b" * 40).exists() and not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]
    assert cache.store_enabled  # an abandoned write is not a disk failure: later ones go on


def test_a_cache_opened_while_a_pack_is_written_leaves_that_write_alone(tmp_path, small_pieces):
    """A PackCache opened while this process writes a pack behind a load (a backend switch, the next load, the
    settings' size line) sweeps temporary files of dead writers only: it removed the one being written, whose rename
    then failed and turned storing off for the rest of that load (seen as a flaky app test)."""
    root = tmp_path / "packed"
    cache = PackCache(root)
    blob = np.arange(10_000, dtype=np.uint8)
    inside, go = threading.Event(), threading.Event()

    def between(written: int) -> bool:
        if written:  # the first piece is on disk in the temporary file
            inside.set()
            assert go.wait(10)
        return True

    stored: list[bool] = []
    writer = threading.Thread(target=lambda: stored.append(cache.store("a" * 40, blob, between=between)))
    writer.start()
    assert inside.wait(10)
    (root / "layers" / f"{'b' * 40}.pack.tmp{os.getpid()}").write_bytes(b"left by an aborted write")
    PackCache(root)  # opened meanwhile: its sweep runs
    go.set()
    writer.join()
    assert stored == [True] and cache.store_enabled and cache.layer_path("a" * 40).is_file()
    assert not list((root / "layers").glob("*.tmp*"))  # this process's leftover, not being written, was swept


def test_the_writes_wait_while_a_request_generates(tmp_path, small_pieces):
    """A first load's writes behind it pause between pieces while any request generates (the first reply keeps the
    cores and the disk's writeback to itself), and go on once it is done."""
    root = tmp_path / "packed"
    with pack_store.generating():
        b = N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m", store_in_background=True)
        total = sum(layer.nbytes for layer in b.layers.values())
        time.sleep(0.6)  # the writer had time for many pieces; it must have written none
        assert b.stores.pending_bytes() == total and pack_store.pending_bytes() >= total
        assert not list((root / "layers").glob("*.pack"))
    b.stores.wait()
    assert b.stores.pending_bytes() == 0 and len(list((root / "layers").glob("*.pack"))) == 3


def test_skipped_writes_leave_no_file_and_the_next_load_packs_again(tmp_path, small_pieces):
    root = tmp_path / "packed"
    with pack_store.generating():  # the writer waits in the first piece of the first pack
        b = N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m", store_in_background=True)
        pack_store.skip_all()
        b.stores.wait()  # returns: the write in progress gave up, the others were never started
    assert b.stores.pending_bytes() == 0 and not writers()
    assert not [p for p in root.rglob("*") if p.is_file() and (p.suffix == ".pack" or ".tmp" in p.name)]
    again = N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m")
    assert again.load_stats.packed_layers == 3 and len(list((root / "layers").glob("*.pack"))) == 3


def test_a_session_holds_the_writes_back_while_it_generates_and_only_then(tiny_gguf_model):
    from tessera import engine
    from tessera.engine.sampling import SamplingParams

    session = engine.load(tiny_gguf_model, backend="Torch", threads=1)
    try:
        ids, params = session.tokenizer.encode("hello there"), SamplingParams(temperature=0, max_tokens=3)
        seen = [pack_store._generating._running for _ in session.generate(ids, params)]
        assert seen and set(seen) == {1} and pack_store._generating._running == 0
        stream = session.generate(ids, params)
        next(stream)
        stream.close()  # a request given up half-way (the app's Stop) lets the writes go on at once
        assert pack_store._generating._running == 0
    finally:
        session.close()


def test_the_cli_says_what_it_writes_before_it_ends_and_ctrl_c_skips_it(monkeypatch, capsys):
    from tessera.engine.cli import run_options

    calls: list[str] = []
    left = [3_210_000_000]
    monkeypatch.setattr(pack_store, "pending_bytes", lambda: left[0])
    monkeypatch.setattr(pack_store, "pending_hash_bytes", lambda: hashing[0])
    hashing = [0]
    monkeypatch.setattr(pack_store, "skip_all", lambda: calls.append("skip"))

    def finish_all():
        calls.append("finish")
        if calls == ["finish"] and interrupt:
            raise KeyboardInterrupt

    monkeypatch.setattr(pack_store, "finish_all", finish_all)
    interrupt = False
    run_options.finish_pack_writes()
    assert calls == ["finish"]
    assert "so that the next load is quick: 3.21 GB left to write (Ctrl+C skips)" in capsys.readouterr().err
    calls.clear()
    hashing[0] = 1_000_000_000
    run_options.finish_pack_writes()
    assert "2.21 GB left to write, after hashing 1.00 GB of the model file (Ctrl+C skips)" in capsys.readouterr().err
    hashing[0] = 0
    calls.clear()
    interrupt = True
    run_options.finish_pack_writes()
    assert calls == ["finish", "skip", "finish"] and "skipped" in capsys.readouterr().err
    calls.clear()
    left[0] = 0
    run_options.finish_pack_writes()
    assert calls == [] and capsys.readouterr().err == ""


def test_skipping_while_the_load_still_packs_lets_it_finish_without_storing(tmp_path):
    """The close dialog's Skip may come while a load is still packing: that load completes, storing nothing more."""
    root = tmp_path / "packed"

    def skip_after_first(event):
        if event.done == 1:
            pack_store.skip_all()

    b = N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m", progress=skip_after_first,
                       store_in_background=True)
    assert b.load_stats.packed_layers == 3
    b.stores.wait()
    assert len(list((root / "layers").glob("*.pack"))) <= 1 and not writers()

