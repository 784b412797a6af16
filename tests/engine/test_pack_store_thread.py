"""make_backend writes the packed-weight cache on a thread beside the packing (engine.pack_store: the disk at its speed
while the cores pack the next layer): by default every pack is on disk and recorded when the load returns; with
store_in_background (a session's load) the load returns first, and closing the backend or the end of the process
finishes them. A load stopped half-way leaves no partial file and no writer running, and an
unexpected error in a write is raised, not lost."""

from __future__ import annotations

import threading

import pytest
import torch

import tessera.engine.native as N
from tessera.engine import pack_store
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
    def broken(self, key, blob):
        raise RuntimeError(f"store of {key} broke")

    monkeypatch.setattr(PackCache, "store", broken)
    with pytest.raises(RuntimeError, match="store of .* broke"):
        N.make_backend(BACKEND, layers(), threads=1, cache_dir=tmp_path / "packed", model_id="m")
    assert not writers()


@pytest.fixture
def gated_store(monkeypatch):
    """PackCache.store held until the returned event is set (a slow disk)."""
    gate, real = threading.Event(), PackCache.store

    def slow(self, key, blob):
        assert gate.wait(30)
        return real(self, key, blob)

    monkeypatch.setattr(PackCache, "store", slow)
    yield gate
    gate.set()


def test_a_background_load_returns_before_its_writes_and_the_process_end_finishes_them(tmp_path, gated_store):
    root = tmp_path / "packed"
    b = N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m", store_in_background=True)
    assert b.load_stats.packed_layers == 3 and not list((root / "layers").glob("*"))  # returned, nothing written yet
    assert b.stores.pending_bytes() == sum(layer.nbytes for layer in b.layers.values())
    gated_store.set()
    pack_store._finish_all()  # what atexit runs, also before the CLI's quick exit
    assert len(list((root / "layers").iterdir())) == 3 and not writers()
    assert N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m").load_stats.cached_layers == 3


def test_closing_a_background_load_finishes_its_writes(tmp_path, gated_store):
    """A session closed (or switched to another backend) right after a first load: the writes end before close returns,
    so the next load finds every pack and the packs' memory is free before anything else loads."""
    root = tmp_path / "packed"
    b = N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m", store_in_background=True)
    threading.Timer(0.3, gated_store.set).start()
    b.close()
    assert not writers() and b.stores.pending_bytes() == 0
    assert len(list((root / "layers").iterdir())) == 3
    assert N.make_backend(BACKEND, layers(), threads=1, cache_dir=root, model_id="m").load_stats.cached_layers == 3
