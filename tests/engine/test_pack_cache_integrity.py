"""The packed-weight cache's integrity check (engine.pack_cache.fingerprint, format 3): a page sum of every 4 KiB page,
checked at every load on the map the kernels read. A truncated, torn, zeroed or bit-flipped pack is refused with a
notice naming the problem and the layer repacked, never computed with (issue 12 items 3 and 5)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import tessera.engine.native as N
from tessera.engine.experts import LayerExperts
from tessera.engine.pack_cache import HEADER_BYTES, PAGE, PackCache, fingerprint

BACKEND = "Reference"


@pytest.mark.parametrize("n", [1, 7, 8, PAGE - 1, PAGE, PAGE + 3, 3 * PAGE + 100])
def test_any_flipped_bit_or_zeroed_page_changes_the_fingerprint(n):
    rng = np.random.default_rng(n)
    blob = rng.integers(0, 256, n, dtype=np.uint8)
    base = fingerprint(blob)
    assert fingerprint(blob.copy()) == base
    for pos in sorted({0, n // 2, n - 1}):
        for bit in (0, 7):
            bad = blob.copy()
            bad[pos] ^= 1 << bit
            assert fingerprint(bad) != base, (pos, bit)
    zeroed = blob.copy()
    zeroed[: min(n, PAGE)] = 0  # a page that never reached the disk
    assert np.array_equal(zeroed, blob) or fingerprint(zeroed) != base
    assert fingerprint(blob[:-1]) != base  # the length is part of it (a shorter blob padded with zeros)


def test_pages_in_another_order_change_the_fingerprint():
    blob = np.random.default_rng(0).integers(0, 256, 4 * PAGE, dtype=np.uint8)
    swapped = np.concatenate([blob[PAGE : 2 * PAGE], blob[:PAGE], blob[2 * PAGE :]])
    assert fingerprint(swapped) != fingerprint(blob)


def layers():
    g = torch.Generator().manual_seed(5)
    w = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    return {0: LayerExperts(w(4, 32, 64), w(4, 32, 64), w(4, 64, 32)), 1: LayerExperts(w(4, 32, 64), w(4, 32, 64),
                                                                                       w(4, 64, 32))}


def outputs(backend):
    g = torch.Generator().manual_seed(0)
    x, ids, w = torch.randn(3, 64, generator=g), torch.randint(0, 4, (3, 2), generator=g), torch.rand(3, 2, generator=g)
    return [backend.forward(n, x, ids, w) for n in sorted(backend.layers)]


def _flip_middle_bit(data: bytearray) -> bytearray:
    data[HEADER_BYTES + (len(data) - HEADER_BYTES) // 2] ^= 0x10
    return data


def _zero_last_page(data: bytearray) -> bytearray:  # a torn write: the size is right, the end never reached the disk
    data[-PAGE:] = bytes(PAGE)
    return data


def _truncate(data: bytearray) -> bytearray:
    return data[: len(data) - 100]


@pytest.mark.parametrize("damage, said", [(_flip_middle_bit, "does not match its checksum"),
                                          (_zero_last_page, "does not match its checksum"),
                                          (_truncate, "bytes of packed data")])
def test_a_damaged_pack_is_refused_with_a_notice_and_repacked(tmp_path, damage, said):
    model = layers()
    root = tmp_path / "packed"
    first = N.make_backend(BACKEND, model, threads=1, cache_dir=root, model_id="/m.gguf")
    want = outputs(first)
    files = sorted((root / "layers").glob("*.pack"))
    assert len(files) == 2
    files[0].write_bytes(bytes(damage(bytearray(files[0].read_bytes()))))
    again = N.make_backend(BACKEND, model, threads=1, cache_dir=root, model_id="/m.gguf")
    st = again.load_stats
    assert st.packed_layers == 1 and st.cached_layers == 1
    assert any(said in n and files[0].name in n and "repacking" in n for n in st.notices), st.notices
    assert all(torch.equal(a, b) for a, b in zip(outputs(again), want, strict=True))
    assert N.make_backend(BACKEND, model, threads=1, cache_dir=root, model_id="/m.gguf").load_stats.cached_layers == 2


def test_a_format_2_file_is_not_read_as_format_3(tmp_path):
    """A pack of the previous format (SHA-256 in the header) under a key of this format is refused, not trusted."""
    cache = PackCache(tmp_path)
    blob = np.arange(1000, dtype=np.uint8)
    assert cache.store("k" * 40, blob)
    path = cache.layer_path("k" * 40)
    data = bytearray(path.read_bytes())
    data[:8] = b"TESSPC2\0"
    path.write_bytes(bytes(data))
    assert cache.load("k" * 40, blob.nbytes, lambda b: None) is None
    assert "not a packed-weight file of this version" in cache.notices[-1]


def test_store_then_load_gives_the_bytes_back(tmp_path):
    cache = PackCache(tmp_path)
    blob = np.random.default_rng(1).integers(0, 256, 3 * PAGE + 17, dtype=np.uint8)
    assert cache.store("a" * 40, blob)
    got = cache.load("a" * 40, blob.nbytes, lambda b: None)
    assert got is not None and np.array_equal(np.asarray(got), blob) and not cache.notices


def test_the_sweep_reads_the_writer_from_a_temporary_name_of_either_form(tmp_path):
    """Temporary names are NAME.tmpPID-THREAD (one per writing thread; older ones NAME.tmpPID): a live process's
    are kept, a dead one's and this process's leftovers removed."""
    layers = tmp_path / "layers"
    layers.mkdir()
    live = [layers / f"{'a' * 40}.pack.tmp1-7", layers / f"{'b' * 40}.pack.tmp1"]  # pid 1 is always alive
    dead = [layers / f"{'c' * 40}.pack.tmp999999999-7", layers / f"{'d' * 40}.pack.tmp{os.getpid()}-7"]
    for p in live + dead:
        p.write_bytes(b"partial")
    PackCache(tmp_path)
    assert sorted(layers.glob("*.tmp*")) == sorted(live)
