"""engine.deferred_keys: a session's first load of a file version packs every layer at once and hashes it behind the
load (the pack-cache keys only name what is stored). The job hashes, records the digests, stores the packs and the
model's keys; it waits while a request generates and stops when skipped; the next load finds everything by the
record, as before. Loads that may find packs in the cache (a recorded version, a file changed just before it was
opened, tensors that are not views of the file) still hash first."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
import torch

import tessera.engine.native as N
from tessera.engine import pack_cache, pack_store, scale_record
from tessera.engine.model import layer_experts
from tessera.engine.source_digest import FOLDER, DigestRecord
from tessera.engine.weights import load_weights

BACKEND = "Reference"


@pytest.fixture(scope="module")
def bf16_gguf(tmp_path_factory):
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("bf16") / "m.gguf", fmt="gguf", dtype="bf16", seed=4)


@pytest.fixture(autouse=True)
def settled(monkeypatch):
    """The files here were written a moment ago: count them as settled (scale_record.RACY_SECONDS), as a downloaded
    model is."""
    monkeypatch.setattr(scale_record, "RACY_SECONDS", -1e9)


@pytest.fixture
def hashes(monkeypatch):
    """The threads that hashed a layer (a pack_cache.layer_digest call each, wherever made)."""
    calls = []
    real = pack_cache.layer_digest

    def counted(*a, **k):
        calls.append(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(N, "layer_digest", counted)
    import tessera.engine.deferred_keys as D

    monkeypatch.setattr(D, "layer_digest", counted)
    return calls


def open_model(path):
    w = load_weights(path)
    return w, layer_experts(w.config, w.tensors)


def backend(path, root, **kw):
    w, layers = open_model(path)
    b = N.make_backend(BACKEND, layers, threads=1, cache_dir=root, model_id=str(path), sources=w.sources, **kw)
    return b, layers


def outputs(b, layers):
    g = torch.Generator().manual_seed(0)
    H = layers[0].gate_proj.shape[2]
    x = torch.randn(5, H, generator=g)
    ids = torch.randint(0, layers[0].gate_proj.shape[0], (5, 2), generator=g)
    w = torch.rand(5, 2, generator=g)
    return [b.forward(layer, x, ids, w) for layer in sorted(layers)]


def test_a_new_file_version_is_packed_first_and_hashed_behind_the_load(bf16_gguf, tmp_path, hashes):
    root = tmp_path / "packed"
    b, layers = backend(bf16_gguf, root, store_in_background=True)
    assert b.load_stats.packed_layers == len(layers)
    b.stores.wait()
    assert len(hashes) == len(layers) and all(t.startswith("tessera-pack-store") for t in hashes)  # behind the load
    w, again_layers = open_model(bf16_gguf)
    record = DigestRecord(root / FOLDER, w.sources)
    assert all(record.known(e) is not None for e in again_layers.values())  # digests recorded by the job
    (entry,) = pack_cache.PackCache(root).models()
    assert len(entry.keys) == len(layers) and all(pack_cache.PackCache(root).layer_path(k).is_file()
                                                  for k in entry.keys)
    hashes.clear()
    again, _ = backend(bf16_gguf, root, store_in_background=True)
    assert again.load_stats.cached_layers == len(layers) and again.load_stats.digests_reused == len(layers)
    assert not hashes  # the record answered
    for ours, cached in zip(outputs(b, layers), outputs(again, layers)):
        assert torch.equal(ours, cached)


def test_the_hashing_waits_while_a_request_generates(bf16_gguf, tmp_path, hashes):
    root = tmp_path / "packed"
    with pack_store.generating():
        b, layers = backend(bf16_gguf, root, store_in_background=True)
        time.sleep(0.5)
        assert not hashes and not list((root / "layers").glob("*.pack")) and not (root / FOLDER).exists()
        assert b.stores.pending_bytes() > 0
    b.stores.wait()
    assert len(list((root / "layers").glob("*.pack"))) == len(layers)


def test_skipped_hashing_leaves_nothing_and_the_next_load_defers_again(bf16_gguf, tmp_path, hashes):
    root = tmp_path / "packed"
    with pack_store.generating():
        b, layers = backend(bf16_gguf, root, store_in_background=True)
        b.stores.skip()
        b.stores.wait()
    assert not list(root.rglob("*.pack")) and not (root / FOLDER).exists() and b.stores.pending_bytes() == 0
    again, _ = backend(bf16_gguf, root, store_in_background=True)
    assert again.load_stats.packed_layers == len(layers)
    again.stores.wait()
    assert len(list((root / "layers").glob("*.pack"))) == len(layers)


def test_a_copied_file_packs_again_and_finds_its_packs_stored(bf16_gguf, tmp_path, monkeypatch):
    root = tmp_path / "packed"
    first, layers = backend(bf16_gguf, root)  # a direct caller: hashes first, as before
    assert first.load_stats.packed_layers == len(layers)
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(bf16_gguf, copy)
    stored = []
    real = pack_cache.PackCache.store
    monkeypatch.setattr(pack_cache.PackCache, "store", lambda self, *a, **k: stored.append(1) or real(self, *a, **k))
    b, _ = backend(copy, root, store_in_background=True)
    assert b.load_stats.packed_layers == len(layers)  # a new version: packed, not looked up
    b.stores.wait()
    assert not stored  # the same content's packs were there already
    again, _ = backend(copy, root, store_in_background=True)
    assert again.load_stats.cached_layers == len(layers)


def test_a_file_changed_just_before_it_was_opened_still_hashes_first(bf16_gguf, tmp_path, monkeypatch, hashes):
    monkeypatch.setattr(scale_record, "RACY_SECONDS", 1e12)  # every file counts as just changed
    root = tmp_path / "packed"
    b, layers = backend(bf16_gguf, root, store_in_background=True)
    assert hashes == ["MainThread"] * len(layers)  # hashed at the load, so its cached packs would have been found
    b.stores.wait()
    again, _ = backend(bf16_gguf, root, store_in_background=True)
    assert again.load_stats.cached_layers == len(layers)


def test_the_work_left_counts_the_hashing_first_then_the_writes(bf16_gguf, tmp_path):
    root = tmp_path / "packed"
    with pack_store.generating():
        b, layers = backend(bf16_gguf, root, store_in_background=True)
        source = sum(e.gate_proj.nbytes + e.up_proj.nbytes + e.down_proj.nbytes for e in layers.values())
        packs = sum(layer.nbytes for layer in b.layers.values())
        assert b.stores.pending_hash_bytes() == source and b.stores.pending_bytes() == source + packs
        assert pack_store.pending_hash_bytes() >= source
    b.stores.wait()
    assert b.stores.pending_hash_bytes() == 0 and b.stores.pending_bytes() == 0


def test_a_backend_switched_while_the_first_load_hashes_hashes_nothing_twice(bf16_gguf, tmp_path, hashes):
    """Session.set_backend builds the new backend before it closes the old: both loads of the new file version defer
    their hashing, and the two jobs (one per backend's writer) share each layer's digest instead of hashing the file
    twice."""
    root = tmp_path / "packed"
    with pack_store.generating():  # both jobs wait at their gates, then start together
        first, layers = backend(bf16_gguf, root, store_in_background=True)
        second = opened(bf16_gguf, root, model_id="second")
        assert second.load_stats.packed_layers == len(layers)
    first.stores.wait()
    second.stores.wait()
    assert len(hashes) == len(layers)  # not 2 x
    for model_id in (str(bf16_gguf), "second"):
        assert opened(bf16_gguf, root, model_id=model_id).load_stats.cached_layers == len(layers)


def opened(path, root, model_id):
    """A session's load of `path` recorded under `model_id` (another backend's load of the same file)."""
    w, layers = open_model(path)
    return N.make_backend(BACKEND, layers, threads=1, cache_dir=root, model_id=model_id, sources=w.sources,
                          store_in_background=True)


def test_a_job_waiting_for_another_loads_digest_is_skipped_at_its_gate(bf16_gguf, tmp_path, monkeypatch):
    """A job waiting for the digest another load's job computes still obeys its own skip."""
    root = tmp_path / "packed"
    started, release = threading.Event(), threading.Event()
    real = pack_cache.layer_digest
    import tessera.engine.deferred_keys as D

    def slow(*a, **k):
        started.set()
        release.wait(10)
        return real(*a, **k)

    monkeypatch.setattr(D, "layer_digest", slow)
    first, layers = backend(bf16_gguf, root, store_in_background=True)
    assert started.wait(10)  # the first job is hashing layer 0
    second = opened(bf16_gguf, root, model_id="second")
    time.sleep(0.3)  # the second job waits for layer 0's digest
    second.stores.skip()
    t0 = time.monotonic()
    second.stores.wait()
    assert time.monotonic() - t0 < 2  # given up while the first still hashes
    release.set()
    first.stores.wait()
    assert [e.model for e in pack_cache.PackCache(root).models()] == [str(bf16_gguf)]
