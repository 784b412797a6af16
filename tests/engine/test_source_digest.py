"""engine.source_digest: an unchanged BF16 GGUF's layer digests (the packed-weight cache keys' content part) are taken
from a record instead of hashing the experts at every load (issue 12 item 3); a file edited, replaced or just written
is hashed again, so the keys still change with the content (item 5) and an edited layer is repacked, never served its
old packed bytes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

import tessera.engine.native as N
from tessera.engine import scale_record, source_digest
from tessera.engine.experts import LayerExperts
from tessera.engine.model import layer_experts
from tessera.engine.pack_cache import PackCache
from tessera.engine.source_digest import DigestRecord, SourceFile, layer_span
from tessera.engine.weights import load_weights

BACKEND = "Reference"
TENSOR = "blk.1.ffn_gate_exps.weight"  # bf16 [E, I, H] in a bf16 tiny GGUF


@pytest.fixture(scope="module")
def bf16_gguf(tmp_path_factory):
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("bf16") / "m.gguf", fmt="gguf", dtype="bf16", seed=3)


@pytest.fixture(autouse=True)
def no_digests_in_process(monkeypatch):
    """Each test starts with no digest computed in this process (source_digest._InProcess): what it finds, it finds
    in the records it wrote."""
    monkeypatch.setattr(source_digest, "_in_process", source_digest._InProcess())


@pytest.fixture
def aged(bf16_gguf, tmp_path, monkeypatch):
    """A copy of the bf16 file whose last change is older than the racy margin (shortened to 0.3 s)."""
    monkeypatch.setattr(scale_record, "RACY_SECONDS", 0.3)
    dst = tmp_path / "model.gguf"
    dst.write_bytes(bf16_gguf.read_bytes())
    time.sleep(0.4)
    return dst


def load(path, root):
    """(backend, layers) of one load of `path` through the packed-weight cache in `root`, as a session loads it."""
    w = load_weights(path)
    layers = layer_experts(w.config, w.tensors)
    backend = N.make_backend(BACKEND, layers, threads=1, cache_dir=root, model_id=str(path), sources=w.sources)
    return backend, layers


def outputs(backend, H):
    g = torch.Generator().manual_seed(0)
    x, ids, w = torch.randn(3, H, generator=g), torch.randint(0, 2, (3, 2), generator=g), torch.rand(3, 2, generator=g)
    return [backend.forward(n, x, ids, w) for n in sorted(backend.layers)]


def fresh(layers):
    """The same layers packed without any cache (copies, so nothing is read through the file's map)."""
    copies = {n: LayerExperts(e.gate_proj.clone(), e.up_proj.clone(), e.down_proj.clone()) for n, e in layers.items()}
    return N.make_backend(BACKEND, copies, threads=1)


def test_an_unchanged_file_reuses_its_digests_and_gets_the_same_keys(aged, tmp_path):
    root = tmp_path / "packed"
    first, layers = load(aged, root)
    n = len(layers)
    assert first.load_stats.digests_reused == 0 and first.load_stats.packed_layers == n
    assert len(list((root / "sources").glob("*.json"))) == 1
    again, _ = load(aged, root)
    assert again.load_stats.digests_reused == n
    assert again.load_stats.cached_layers == n  # same keys as the first load's: its packs are found
    H = layers[min(layers)].gate_proj.shape[-1]
    assert all(torch.equal(a, b) for a, b in zip(outputs(again, H), outputs(fresh(layers), H), strict=True))
    PackCache(root).clear()  # `tessera-cli cache clear` removes the records with the packs
    assert not list((root / "sources").glob("*.json"))


def test_an_edited_expert_is_hashed_again_and_its_layer_repacked(aged, tmp_path):
    root = tmp_path / "packed"
    _, layers = load(aged, root)
    # one bf16 weight of layer 1 changed in place, size and mtime kept (cp -p of another version, an editor)
    st = os.stat(aged)
    t = next(t for t in gguf.GGUFReader(aged).tensors if t.name == TENSOR)
    with open(aged, "r+b") as f:
        f.seek(int(t.data_offset) + 2 * 1000)
        old = np.frombuffer(f.read(2), np.uint16)[0]
        f.seek(int(t.data_offset) + 2 * 1000)
        f.write(np.array([old ^ 0x4000], np.uint16).tobytes())  # an exponent bit: a different value
    os.utime(aged, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(aged).st_size == st.st_size and os.stat(aged).st_mtime_ns == st.st_mtime_ns
    edited, edited_layers = load(aged, root)
    st2 = edited.load_stats
    assert st2.digests_reused == 0  # another identity (ctime): no record applies
    assert st2.per_layer[1] == "packed" and all(v == "cached" for k, v in st2.per_layer.items() if k != 1)
    H = edited_layers[1].gate_proj.shape[-1]
    assert all(torch.equal(a, b) for a, b in zip(outputs(edited, H), outputs(fresh(edited_layers), H), strict=True))


def test_a_file_written_just_before_it_was_opened_is_not_recorded(bf16_gguf, tmp_path, monkeypatch):
    monkeypatch.setattr(scale_record, "RACY_SECONDS", 3600.0)  # every file is "just written"
    dst = tmp_path / "model.gguf"
    dst.write_bytes(bf16_gguf.read_bytes())
    root = tmp_path / "packed"
    load(dst, root)
    assert not list((root / "sources").glob("*.json"))
    again, layers = load(dst, root)
    assert again.load_stats.digests_reused == 0 and again.load_stats.cached_layers == len(layers)


def test_tensors_outside_the_map_are_hashed_every_time(aged, tmp_path):
    w = load_weights(aged)
    layers = layer_experts(w.config, w.tensors)
    copies = {n: LayerExperts(e.gate_proj.clone(), e.up_proj.clone(), e.down_proj.clone()) for n, e in layers.items()}
    assert all(layer_span(e, w.sources) is None for e in copies.values())
    assert all(layer_span(e, w.sources) is not None for e in layers.values())
    root = tmp_path / "packed"
    for _ in range(2):
        b = N.make_backend(BACKEND, copies, threads=1, cache_dir=root, model_id=str(aged), sources=w.sources)
        assert b.load_stats.digests_reused == 0
    assert b.load_stats.cached_layers == len(copies)


def _memmap_source(path: Path, opened_at: float):
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        mapped = np.memmap(f, dtype=np.uint8, mode="c")
    return mapped, SourceFile(scale_record.identity(path, st), opened_at, int(mapped.ctypes.data), int(mapped.nbytes))


def test_a_record_of_another_file_or_version_does_not_count(tmp_path, monkeypatch):
    """A record is found by the identities, checked against them and DIGEST_VERSION; a damaged one is ignored."""
    path = tmp_path / "w.bin"
    path.write_bytes(np.arange(3 * 4 * 8 * 8, dtype=np.uint16).tobytes())
    mapped, src = _memmap_source(path, time.time() + 3600)  # opened "long after" the last change
    v = torch.from_numpy(mapped.view(np.int16)).view(torch.bfloat16).reshape(3, 4, 8, 8)
    experts = LayerExperts(v[0], v[1], v[2].transpose(1, 2).contiguous())  # down: a copy, outside the map
    assert layer_span(experts, [src]) is None
    experts = LayerExperts(v[0], v[1], v[2])
    calls = []

    def compute():
        calls.append(1)
        return bytes(32)

    folder = tmp_path / "sources"
    rec = DigestRecord(folder, [src])
    rec.digest(experts, compute)
    assert rec.save() and len(calls) == 1
    assert DigestRecord(folder, [src]).digest(experts, compute) == bytes(32) and len(calls) == 1
    monkeypatch.setattr(source_digest, "DIGEST_VERSION", 2)
    assert DigestRecord(folder, [src]).digest(experts, compute) == bytes(32) and len(calls) == 2
    monkeypatch.setattr(source_digest, "DIGEST_VERSION", 1)
    rec_path = DigestRecord(folder, [src]).path
    rec_path.write_text("{not json", encoding="utf-8")
    monkeypatch.setattr(source_digest, "_in_process", source_digest._InProcess())  # as the next process finds it
    assert DigestRecord(folder, [src]).digest(experts, compute) == bytes(32) and len(calls) == 3


def test_quantized_experts_are_found_in_the_map_by_their_blocks(tmp_path):
    """A quantized file's experts (QuantizedTensor: raw blocks, views of the map) have spans too, for backends that
    widen and pack them; the span names the type."""
    from tessera.engine.make_model import make_model

    path = make_model(tmp_path / "q.gguf", preset="tiny-kquant", fmt="gguf", dtype="q8_0")
    w = load_weights(path)
    layers = layer_experts(w.config, w.tensors)
    spans = [layer_span(e, w.sources) for e in layers.values()]
    assert all(s is not None and s.count(":Q8_0") == 3 for s in spans), spans
    assert len(set(spans)) == len(spans)


def test_a_digest_computed_in_this_process_is_not_computed_again_before_it_is_recorded(tmp_path):
    """Another load of the same file version (a backend switched while the first load's job hashes) takes the digest
    this process computed, recorded or not; a file changed just before it was opened is hashed at each load."""
    path = tmp_path / "w.bin"
    path.write_bytes(np.arange(3 * 4 * 8 * 8, dtype=np.uint16).tobytes())
    calls = []

    def compute():
        calls.append(1)
        return bytes(range(32))

    for opened_at, hashed in ((time.time() + 3600, 1), (time.time(), 2)):  # settled, then just changed
        calls.clear()
        for _ in range(2):
            mapped, src = _memmap_source(path, opened_at)
            v = torch.from_numpy(mapped.view(np.int16)).view(torch.bfloat16).reshape(3, 4, 8, 8)
            assert DigestRecord(tmp_path / "sources", [src]).digest(LayerExperts(v[0], v[1], v[2]), compute) == \
                bytes(range(32))
        assert len(calls) == hashed and not (tmp_path / "sources").exists()  # nothing saved


def test_two_loads_saving_one_record_at_once_leave_it_whole(tmp_path):
    """The two store-thread jobs of one file version (a backend switched during the first load's hashing) save the same
    record at the same moment: each through a temporary file of its own, so the record is always whole JSON."""
    import threading

    path = tmp_path / "w.bin"
    path.write_bytes(np.arange(3 * 4 * 8 * 8, dtype=np.uint16).tobytes())
    mapped, src = _memmap_source(path, time.time() + 3600)
    folder = tmp_path / "sources"
    for round_ in range(60):
        records = [DigestRecord(folder, [src]) for _ in range(2)]
        for rec in records:
            rec.digests = {f"layer-{i}": bytes([round_ % 256]).hex() * 32 for i in range(2000)}
            rec.added = 1
        start = threading.Barrier(2)
        threads = [threading.Thread(target=lambda r=rec, b=start: (b.wait(), r.save())) for rec in records]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert DigestRecord(folder, [src]).digests, f"round {round_}: the record was torn"
