"""engine.readahead: a model file is asked into the page cache on a thread, only when it fits in available memory, and
a closed session stops it (issue 12 item 3, cold loads)."""

from __future__ import annotations

import os

import pytest
from smaps import mapping_field

from tessera.engine import readahead


def test_reads_every_file_and_ends(tmp_path, monkeypatch):
    asked: list[tuple[int, int]] = []
    real = readahead.read_chunk
    monkeypatch.setattr(readahead, "CHUNK", 1000)
    monkeypatch.setattr(readahead, "read_chunk", lambda fd, off, n: (asked.append((off, n)), real(fd, off, n)))
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * 2500)
    b.write_bytes(b"y" * 10)
    ahead = readahead.start([a, b])
    assert ahead is not None and ahead.join(10)
    assert asked == [(0, 1000), (1000, 1000), (2000, 500), (0, 10)]  # in order, each byte once


def _dropped_file(tmp_path, nbytes: int):
    """A file of `nbytes` random bytes, written, synced and dropped from the page cache (skips where this file system
    keeps it: tmpfs)."""
    f = tmp_path / "cold.bin"
    with open(f, "wb") as fh:
        fh.write(os.urandom(nbytes))
        fh.flush()
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    import numpy as np

    mapped = np.memmap(f, dtype=np.uint8, mode="r")
    if readahead.resident_fraction([mapped]) > 0.1:
        pytest.skip("this file system keeps the file in memory (tmpfs?): nothing to read ahead")
    return f, mapped


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise to drop the file first")
def test_the_whole_file_is_in_the_page_cache_afterwards(tmp_path):
    """The kernel's own answer (mincore), not the calls made: asked with posix_fadvise(WILLNEED) in 64 MB chunks,
    Linux read only the device's read-ahead window of each (128 kB by default, 8 MB on one VM): 0.2-12 % of the file.
    48 MB is under one chunk, so a cap of that kind leaves most of it unread."""
    f, mapped = _dropped_file(tmp_path, 48 << 20)
    ahead = readahead.start([f])
    assert ahead is not None and ahead.join(60)
    assert readahead.resident_fraction([mapped]) == 1.0
    assert _mapping_rss(mapped) == 0  # read through its own maps, gone: nothing mapped twice


def test_not_when_the_files_do_not_fit_in_available_memory(tmp_path, monkeypatch):
    f = tmp_path / "big"
    f.write_bytes(b"x" * 4096)
    monkeypatch.setattr(readahead, "_available_memory", lambda: 4095)
    assert readahead.start([f]) is None
    monkeypatch.setattr(readahead, "_available_memory", lambda: 4096)
    ahead = readahead.start([f])
    assert ahead is not None and ahead.join(10)


def test_a_missing_file_is_no_error(tmp_path):
    assert readahead.start([tmp_path / "gone"]) is None


def test_stop_ends_it_within_a_chunk(tmp_path, monkeypatch):
    import threading

    gate, asked = threading.Event(), []

    def slow(fd, off, n):
        asked.append(off)
        gate.wait(5)

    monkeypatch.setattr(readahead, "CHUNK", 10)
    monkeypatch.setattr(readahead, "read_chunk", slow)
    f = tmp_path / "m"
    f.write_bytes(b"x" * 1000)
    ahead = readahead.start([f])
    ahead.stop()
    gate.set()
    assert ahead.join(10) and len(asked) <= 1


@pytest.mark.parametrize("fails", [True, False])
def test_a_session_stops_its_read_ahead_when_closed(tiny_gguf_model, monkeypatch, fails):
    monkeypatch.setattr(readahead, "resident_fraction", lambda maps, ranges=None: 0.0)  # cold: the thread reads it
    from tessera import engine

    started = []
    real = readahead.start

    def spy(paths, ranges=None):
        ahead = real(paths, ranges)
        started.append(ahead)
        return ahead

    monkeypatch.setattr(readahead, "start", spy)
    if fails:  # a load that fails after the read-ahead began stops it too
        from tessera.engine import weights

        def boom(*a, **k):
            raise RuntimeError("load failed")

        monkeypatch.setattr(weights, "load_weights", boom)
        with pytest.raises(RuntimeError, match="load failed"):
            engine.load(tiny_gguf_model, backend="Torch")
    else:
        s = engine.load(tiny_gguf_model, backend="Torch")
        assert s.readahead is started[0]
        s.close()
    assert started and started[0] is not None and started[0]._stop.is_set() and started[0].join(10)


# ---- the map's pages populated (MADV_POPULATE_READ) ----------------------------------------------------------------

def _mapping_rss(mapped) -> int:
    """Bytes of `mapped`'s pages in this process's page tables: the Rss of its mapping in /proc/self/smaps."""
    return int(mapping_field(mapped.ctypes.data, "Rss")[0]) * 1024


def _populate_supported() -> bool:
    import mmap

    m = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        import ctypes

        address = ctypes.addressof(ctypes.c_char.from_buffer(m))
        ok = readahead.madvise(address, mmap.PAGESIZE, readahead.MADV_POPULATE_READ) == 0
        return ok
    finally:
        import gc

        gc.collect()
        try:
            m.close()
        except BufferError:
            pass


def _mapped_file(tmp_path, nbytes: int):
    import numpy as np

    f = tmp_path / "model.gguf"
    f.write_bytes(os.urandom(nbytes))
    return f, np.memmap(f, dtype=np.uint8, mode="c")  # as gguf_reader maps a model


def test_resident_fraction_is_the_share_of_pages_in_the_page_cache(tmp_path):
    f, mapped = _mapped_file(tmp_path, 64 * 4096)  # just written: in the page cache
    assert readahead.resident_fraction([mapped, None]) == 1.0
    with open(f, "rb") as fh:  # clean pages can be dropped: fsync'd, then DONTNEED (the whole file: the page cache
        os.fsync(fh.fileno())  # drops a large folio whole or not at all)
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    assert readahead.resident_fraction([mapped]) < 0.5
    assert readahead.resident_fraction([None]) == 0.0


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_populate_maps_every_page_on_this_thread_and_stops_when_asked(tmp_path, monkeypatch):
    import threading

    if not _populate_supported():
        pytest.skip("this kernel has no MADV_POPULATE_READ (Linux < 5.14)")
    monkeypatch.setattr(readahead, "CHUNK", 1 << 20)
    nbytes = 3 * (1 << 20) + 100
    _, mapped = _mapped_file(tmp_path, nbytes)
    stop = threading.Event()
    stop.set()
    assert readahead.populate([mapped], stop) is None and _mapping_rss(mapped) < nbytes // 2  # stopped before any
    assert readahead.populate([None, mapped]) is None
    assert _mapping_rss(mapped) >= nbytes - 4096


def test_populate_says_why_it_stopped(tmp_path, monkeypatch):
    import errno

    monkeypatch.setattr(readahead, "madvise", lambda a, n, advice: errno.EINVAL)
    _, mapped = _mapped_file(tmp_path, 4096)
    assert readahead.populate([mapped]) == "EINVAL"


@pytest.mark.parametrize("cached", [1.0, 0.5])
def test_a_cached_model_s_map_is_populated_at_load_a_cold_one_read_ahead(tiny_gguf_model, monkeypatch, cached):
    from tessera import engine

    if not _populate_supported():
        pytest.skip("this kernel has no MADV_POPULATE_READ (Linux < 5.14)")
    monkeypatch.setattr(readahead, "resident_fraction", lambda maps, ranges=None: cached)
    done = []
    real = readahead.populate
    monkeypatch.setattr(readahead, "populate", lambda maps, cancel=None, ranges=None: done.append(
        (real(maps, cancel, ranges), [_mapping_rss(m) for m in maps])))
    s = engine.load(tiny_gguf_model, backend="Torch")
    try:
        if cached == 1.0:
            assert s.readahead is None and done == [(None, [done[0][1][0]])]
            assert done[0][1][0] >= os.path.getsize(tiny_gguf_model) - 4096  # every page of the map mapped
        else:
            assert not done and s.readahead is not None and s.readahead.join(30)
    finally:
        s.close()


def test_reads_only_the_ranges_asked(tmp_path, monkeypatch):
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(readahead, "CHUNK", 8192)
    monkeypatch.setattr(readahead, "read_chunk", lambda fd, off, n: asked.append((off, n)))
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * 40000)
    b.write_bytes(b"y" * 10)
    ahead = readahead.start([a, b], [[(0, 100), (20000, 30000)], []])
    assert ahead is not None and ahead.join(10)
    page = os.sysconf("SC_PAGE_SIZE")
    start = 20000 - 20000 % page  # rounded down to a page
    assert asked == [(0, 100), (start, 8192), (start + 8192, 30000 - start - 8192)]


def test_chunks_cover_the_ranges_from_page_starts_and_stop_at_the_end():
    page = os.sysconf("SC_PAGE_SIZE")
    assert list(readahead.chunks(10, None)) == [(0, 10)]
    assert list(readahead.chunks(5 * page, [(page + 1, 2 * page), (3 * page, 9 * page)])) == [
        (page, page), (3 * page, 2 * page)]


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_populate_maps_only_the_ranges_asked(tmp_path):
    if not _populate_supported():
        pytest.skip("this kernel has no MADV_POPULATE_READ (Linux < 5.14)")
    mb = 1 << 20
    _, mapped = _mapped_file(tmp_path, 32 * mb)
    assert readahead.populate([mapped], ranges=[[(0, 4 * 4096), (30 * mb, 30 * mb + 4096)]]) is None
    # (the kernel maps a large folio whole, up to 2 MB each: a few of them, not the 32 MB file)
    assert 5 * 4096 <= _mapping_rss(mapped) <= 8 * mb
    assert readahead.resident_fraction([mapped], [[(0, 4096)]]) == 1.0


@pytest.fixture(scope="module")
def bf16_gguf(tmp_path_factory):
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("bf16") / "m.gguf", fmt="gguf", dtype="bf16", seed=3)


def test_a_native_load_leaves_out_the_float_experts_it_packs(bf16_gguf, tiny_gguf_model):
    """A bf16 (or f32) file's routed experts are read only to be packed: not populated nor read ahead at load. The Torch
    backend computes with them in place: all of the file."""
    from tessera.engine.readahead import read_in_place as _read_in_place
    from tessera.engine.weights import open_model

    for path in (bf16_gguf, tiny_gguf_model):
        gguf = open_model(path).gguf
        part = gguf.files[0]
        ranges = _read_in_place(gguf, "Reference")[0]
        for t in part.tensors.values():
            inside = any(s <= t.offset and t.offset + t.nbytes <= e for s, e in ranges)
            assert inside == ("_exps." not in t.name), t.name
        assert ranges[-1][1] == part.file_size and ranges[0][0] == 0  # the header and the tail are read
        assert _read_in_place(gguf, "Torch") is None


def test_a_quantized_file_s_experts_are_read_in_place_so_all_of_it_is_populated(tmp_path):
    from tessera.engine.make_model import make_model
    from tessera.engine.readahead import read_in_place as _read_in_place
    from tessera.engine.weights import open_model

    path = make_model(tmp_path / "q.gguf", preset="tiny-kquant", fmt="gguf", dtype="q8_0")
    gguf = open_model(path).gguf
    assert _read_in_place(gguf, "Reference") == [[(0, gguf.files[0].file_size)]]


def test_resident_fraction_samples_a_large_file(tmp_path, monkeypatch):
    """64 pages out of every SAMPLE_STRIDE bytes are asked about (here every 16 pages: 4 of 64 pages), and they say
    what the whole file's state is."""
    monkeypatch.setattr(readahead, "SAMPLE_STRIDE", 16 * 4096)
    monkeypatch.setattr(readahead, "SAMPLE_PAGES", 4)
    asked = []
    real = readahead._libc("mincore", [])
    monkeypatch.setattr(readahead, "_libc", lambda name, argtypes: lambda a, n, v: (asked.append(n.value),
                                                                                   real(a, n, v))[1])
    f, mapped = _mapped_file(tmp_path, 64 * 4096)
    assert readahead.resident_fraction([mapped]) == 1.0 and asked == [4 * 4096] * 4
    with open(f, "rb") as fh:
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    assert readahead.resident_fraction([mapped]) < 0.5
