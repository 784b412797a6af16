"""engine.expert_pages: a packed layer's expert pages leave the process's map (issue 12 item 3: a first load's peak
within the steady state plus one layer), without ever changing what the tensors read: only whole pages of a file map
that were never written, checked in /proc/self/pagemap."""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import pytest
import torch

import tessera.engine.native as N
from tessera.engine import expert_pages
from tessera.engine.model import layer_experts
from tessera.engine.weights import load_weights

pytestmark = pytest.mark.skipif(sys.platform != "linux" or not os.path.exists(expert_pages.PAGEMAP),
                                reason="needs Linux's /proc/self/pagemap")
PAGE = mmap.PAGESIZE


def present_pages(address: int, nbytes: int) -> int:
    """How many pages of [address, address + nbytes) are in this process's page tables now."""
    first, last = address // PAGE, (address + nbytes - 1) // PAGE
    with open(expert_pages.PAGEMAP, "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((last - first + 1) * 8), dtype="<u8")
    return int(np.count_nonzero(entries & np.uint64(1 << 63)))


@pytest.fixture
def mapped_file(tmp_path):
    """A 64-page file of known bytes, mapped copy-on-write as engine.gguf_reader maps a model."""
    path = tmp_path / "w.bin"
    data = np.arange(64 * PAGE // 4, dtype=np.uint32)
    path.write_bytes(data.tobytes())
    with open(path, "rb") as f:
        mapped = np.memmap(f, dtype=np.uint8, mode="c")
    return mapped, data


def test_read_pages_of_a_file_map_are_released_and_read_back_the_same(mapped_file):
    mapped, data = mapped_file
    assert int(mapped.view(np.uint32).sum(dtype=np.uint64)) == int(data.sum(dtype=np.uint64))  # every page read
    address = mapped.ctypes.data
    assert present_pages(address, mapped.nbytes) == 64
    assert expert_pages.release(address + 100, 10 * PAGE) == 9 * PAGE  # whole pages inside the run only
    assert present_pages(address, mapped.nbytes) == 55
    assert present_pages(address, PAGE) == 1  # the page the run starts inside stays
    assert np.array_equal(mapped.view(np.uint32), data)  # faulted in again from the file: the same bytes


def test_a_written_page_keeps_its_copy(mapped_file):
    """A copy-on-write page that was written is anonymous memory: MADV_DONTNEED would bring the file's bytes back, so
    the whole run is left alone."""
    mapped, data = mapped_file
    view = mapped.view(np.uint32)
    assert int(view.sum(dtype=np.uint64)) == int(data.sum(dtype=np.uint64))
    view[5 * PAGE // 4] = 7  # page 5 written: its private copy
    assert expert_pages.release(mapped.ctypes.data, mapped.nbytes) == 0
    assert view[5 * PAGE // 4] == 7
    assert present_pages(mapped.ctypes.data, mapped.nbytes) == 64


def test_anonymous_memory_is_never_released():
    a = np.arange(16 * PAGE // 8, dtype=np.int64)  # heap memory, every page touched
    assert expert_pages.release(a.ctypes.data, a.nbytes) == 0
    assert np.array_equal(a, np.arange(16 * PAGE // 8, dtype=np.int64))


def test_no_pagemap_no_release(mapped_file, tmp_path):
    mapped, _ = mapped_file
    int(mapped.sum())
    assert expert_pages.release(mapped.ctypes.data, mapped.nbytes, pagemap=str(tmp_path / "absent")) == 0
    assert present_pages(mapped.ctypes.data, mapped.nbytes) == 64


@pytest.mark.parametrize("cache", [False, True], ids=["no-cache", "pack-cache"])
def test_each_packed_layer_leaves_the_map_once_read_and_computes_the_same(tmp_path, cache, monkeypatch):
    """make_backend on a BF16 file's layers (views of its map): each layer's pages are given back (bytes released > 0)
    after its digest and after its pack, and the backend's outputs equal those of the same layers packed from copies.
    (What is mapped after the whole load is not asserted: a later fault maps the cached pages around it, up to a
    whole large folio, which on this tiny file spans tensors; on a real model that is a few MB at each boundary.)"""
    from tessera.engine.experts import LayerExperts
    from tessera.engine.make_model import make_model

    path = make_model(tmp_path / "m.gguf", fmt="gguf", dtype="bf16", seed=3)
    w = load_weights(path)
    layers = layer_experts(w.config, w.tensors)
    assert all(m.untyped_storage().nbytes() > 4 * PAGE for e in layers.values()
               for m in (e.gate_proj, e.up_proj, e.down_proj))
    released, packed = [], []
    real_release, real_pack = N.release_experts, N.pack_layer

    def release_spy(experts, files):
        n = real_release(experts, files)
        released.append((next(i for i, e in layers.items() if e is experts), n))
        return n

    def pack_spy(backend, experts, pool):
        packed.append(next(i for i, e in layers.items() if e is experts))
        return real_pack(backend, experts, pool)

    monkeypatch.setattr(N, "release_experts", release_spy)
    monkeypatch.setattr(N, "pack_layer", pack_spy)
    kw = {"cache_dir": tmp_path / "packed", "model_id": str(path)} if cache else {}
    backend = N.make_backend("Reference", layers, threads=1, sources=w.sources, **kw)
    monkeypatch.undo()
    assert packed == sorted(layers)
    after_pack = released[len(layers):] if cache else released  # with the cache: first one per digest
    assert [i for i, _ in after_pack] == sorted(layers) and all(n > 0 for _, n in released)
    assert len(released) == (2 if cache else 1) * len(layers)
    copies = {n: LayerExperts(e.gate_proj.clone(), e.up_proj.clone(), e.down_proj.clone()) for n, e in layers.items()}
    fresh = N.make_backend("Reference", copies, threads=1)
    H = w.config.hidden_size
    g = torch.Generator().manual_seed(0)
    x, ids = torch.randn(3, H, generator=g), torch.randint(0, 2, (3, 2), generator=g)
    wts = torch.rand(3, 2, generator=g)
    for n in sorted(layers):
        assert torch.equal(backend.forward(n, x, ids, wts), fresh.forward(n, x, ids, wts))
    assert all(torch.equal(a.gate_proj, b.gate_proj) for a, b in zip(layers.values(), copies.values(), strict=True))


def test_populate_maps_a_released_layer_back_in(tmp_path):
    """Before a pack: the layer's pages, released after its digest, come back in one call (no 4 kB faults)."""
    from tessera.engine.make_model import make_model

    path = make_model(tmp_path / "m.gguf", fmt="gguf", dtype="bf16", seed=4)
    w = load_weights(path)
    experts = layer_experts(w.config, w.tensors)[0]
    mats = (experts.gate_proj, experts.up_proj, experts.down_proj)
    inner = [(m.data_ptr() + PAGE, m.untyped_storage().nbytes() - 2 * PAGE) for m in mats]
    for m in mats:
        m.float().sum()
    assert expert_pages.release_experts(experts, w.sources) > 0
    assert all(present_pages(a, n) == 0 for a, n in inner)
    expert_pages.populate_experts(experts, w.sources)
    assert all(present_pages(a, n) == (a + n - 1) // PAGE - a // PAGE + 1 for a, n in inner)
    expert_pages.populate_experts(experts, ())  # tensors outside any map given: nothing to do


def test_a_cold_files_experts_are_read_ahead_into_the_page_cache_not_into_the_map(tmp_path):
    """A first load's read-ahead of the layers to pack: the bytes reach the page cache (mincore), the process's map
    gains no page (pagemap), and a file already cached is not read again."""
    from tessera.engine import readahead
    from tessera.engine.make_model import make_model

    path = make_model(tmp_path / "m.gguf", fmt="gguf", dtype="bf16", seed=4)
    w = load_weights(path)
    layers = list(layer_experts(w.config, w.tensors).values())
    runs = [run for e in layers for run in expert_pages._mapped_runs(e, w.sources)]
    inner = [(a - a % PAGE + PAGE, (n - PAGE) // PAGE * PAGE) for a, n in runs]  # whole pages of each run
    with open(path, "rb") as f:
        os.fsync(f.fileno())  # written back, so the kernel may drop the pages
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if readahead.resident_share(inner) > 0.5:
        pytest.skip("the page cache kept the file (cannot make it cold here)")
    ahead = expert_pages.read_ahead_experts(layers, w.sources)
    assert ahead is not None and ahead.join(60)
    assert readahead.resident_share(inner) == 1.0
    assert all(present_pages(a, n) == 0 for a, n in inner)  # nothing mapped into the model's map
    assert expert_pages.read_ahead_experts(layers, w.sources) is None  # cached now: nothing to read
