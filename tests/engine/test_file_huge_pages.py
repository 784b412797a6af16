"""Model files on 2 MB pages (engine.readahead): the model's map and the read-ahead's maps ask for them before any
read (MADV_HUGEPAGE), and `huge_page_share` reads back how much of a file's map the kernel gave in 2 MB pages."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from smaps import mapping_field

from tessera.engine import readahead

THP = sys.platform.startswith("linux") and os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(not THP, reason="needs Linux with transparent huge pages (MADV_HUGEPAGE)")


@needs_thp
def test_a_gguf_model_s_map_asks_for_huge_pages(tiny_gguf_model):
    from tessera.engine.weights import open_model

    mapping = open_model(tiny_gguf_model).gguf.files[0].mapping
    assert "hg" in mapping_field(mapping.ctypes.data, "VmFlags")  # VM_HUGEPAGE on the map the kernels read


@needs_thp
@pytest.mark.parametrize("offset", [0, 4096, 3 * 4096])
def test_advice_covers_a_map_that_starts_inside_a_page(tmp_path, offset):
    """np.memmap with an offset (the pack cache's blob after its header) starts at a page plus the offset's rest."""
    f = tmp_path / "blob"
    f.write_bytes(os.urandom(offset + 5 * 4096 + 100))
    blob = np.memmap(f, dtype=np.uint8, mode="c", offset=offset + 100, shape=(5 * 4096,))
    assert readahead.advise_huge_pages(blob) == 0
    for at in (0, blob.nbytes - 1):
        assert "hg" in mapping_field(blob.ctypes.data + at, "VmFlags")
    assert readahead.advise_huge_pages(blob[:0]) == 0  # nothing to advise: no call


def test_each_read_ahead_chunk_is_advised_before_it_is_populated(tmp_path, monkeypatch):
    calls = []
    real = readahead.madvise
    monkeypatch.setattr(readahead, "madvise", lambda a, n, advice: (calls.append(advice), real(a, n, advice))[1])
    f = tmp_path / "m"
    f.write_bytes(os.urandom(3 * 4096))
    with open(f, "rb") as fh:
        readahead.read_chunk(fh.fileno(), 4096, 2 * 4096 - 5)
    assert calls == [readahead.MADV_HUGEPAGE, readahead.MADV_POPULATE_READ]


def test_a_chunk_is_read_by_page_faults_where_the_kernel_has_no_populate(tmp_path, monkeypatch):
    """Linux < 5.14 answers MADV_POPULATE_READ with EINVAL: a byte of each page is read instead. Observed here as the
    chunk's pages in the page cache after a drop."""
    import errno

    real = readahead.madvise
    monkeypatch.setattr(readahead, "madvise", lambda a, n, advice: errno.EINVAL
                        if advice == readahead.MADV_POPULATE_READ else real(a, n, advice))
    f = tmp_path / "cold.bin"
    with open(f, "wb") as fh:
        fh.write(os.urandom(64 * 4096))
        fh.flush()
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    mapped = np.memmap(f, dtype=np.uint8, mode="r")
    if readahead.resident_fraction([mapped]) > 0.1:
        pytest.skip("this file system keeps the file in memory (tmpfs?)")
    with open(f, "rb") as fh:
        readahead.read_chunk(fh.fileno(), 0, 64 * 4096)
    assert readahead.resident_fraction([mapped]) == 1.0


SMAPS = """\
7f0000000000-7f0000400000 r--p 00000000 fe:00 11 /models/a.gguf
Size:               4096 kB
Rss:                3072 kB
FilePmdMapped:      2048 kB
VmFlags: rd mr mw me hg
7f0000400000-7f0000500000 rw-p 00000000 00:00 0
Rss:                1024 kB
FilePmdMapped:         0 kB
7f0000500000-7f0000600000 r--p 00400000 fe:00 11 /models/a.gguf
Rss:                1024 kB
FilePmdMapped:         0 kB
7f0000600000-7f0000800000 r--p 00000000 fe:00 12 /models/with space.gguf
Rss:                2048 kB
FilePmdMapped:      2048 kB
7f0000800000-7f0000900000 r--p 00000000 fe:00 13 /other.bin
Rss:                1024 kB
FilePmdMapped:      1024 kB
"""


def test_huge_page_share_sums_every_map_of_the_files_asked(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    assert readahead.huge_page_share(["/models/a.gguf"], str(smaps)) == 2048 / 4096  # both maps of a.gguf
    assert readahead.huge_page_share(["/models/with space.gguf"], str(smaps)) == 1.0
    assert readahead.huge_page_share(["/models/a.gguf", "/other.bin"], str(smaps)) == 3072 / 5120
    assert readahead.huge_page_share(["/models/none.gguf"], str(smaps)) is None  # not mapped: not known
    assert readahead.huge_page_share([], str(smaps)) is None
    assert readahead.huge_page_share(["/models/a.gguf"], str(tmp_path / "absent")) is None  # no smaps (not Linux)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_huge_page_share_of_a_resident_map_of_this_process(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(os.urandom(8 * 4096))
    mapped = np.memmap(f, dtype=np.uint8, mode="c")
    assert readahead.huge_page_share([f]) is None  # nothing read through it yet: not resident
    assert int(mapped.sum()) >= 0
    share = readahead.huge_page_share([f])
    assert share is not None and 0.0 <= share <= 1.0
