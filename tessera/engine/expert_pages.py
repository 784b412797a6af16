"""A packed layer's expert pages in the model file's map: mapped in one call before a native backend packs them, and
given back once packed, so a first load's memory is the packs plus one layer, not the packs plus the whole file.

A native expert backend that packs a layer (a BF16 file's experts to int8 for AMXInt8, or to its bf16 panels for
AVX2/AVX512; a quantized layer widened for a bf16 backend) reads the layer's expert tensors through the model's map
twice on a first load: once for the packed-weight cache's key (engine.pack_cache.layer_digest) and once to pack it.
Every page read stayed mapped, so the first load of the 8-layer BF16 file (11.22 GB) on AMXInt8 peaked at 16.65 GB
RSS: 11.05 GB of mapped file pages that nothing reads again, beside the 5.1 GB of int8 packs; on AVX2 (bf16 packs as
large as the experts) 21-24 GB on this 24 GB machine (docs/BENCHMARKS.md, session 22). A later load with the packs
cached maps none of it (engine.readahead.read_in_place) and ran at 6.4-7 GB: issue 12 item 3 asks for a load's peak
to stay within the steady state plus one layer.

`release_experts(experts, files)` gives the pages of a layer's expert tensors that lie in the maps `files` back to the
kernel with madvise(MADV_DONTNEED) once they are read. For a file map that drops only this process's page-table
entries: the page cache keeps the data, and a later read (a backend switched to Torch, the GPU cache uploading an
expert) faults the same bytes in again from the file. Only where no page of the run was ever written: the model's map
is copy-on-write (engine.gguf_reader: torch wants writable arrays), and on a private map MADV_DONTNEED would throw a
written page's copy away and show the file's bytes again. Nothing writes into it, but that is a promise of the rest of
the code, so each run is checked first in /proc/self/pagemap: a run holding a page that is not the file's (an
anonymous copy, or swapped) is left as it is, and so is everything where pagemap cannot be read (not Linux).
Whole pages inside a run only: the page a tensor shares with its neighbour stays.

`populate_experts(experts, files)` maps a layer's pages back in before it is packed (MADV_POPULATE_READ, a chunk per
thread, engine.readahead): released after the digest, they were faulted in again by the packing kernel one 4 kB page
at a time, which made a layer's pack 1.3-1.45 s where the kernel alone takes 0.2-0.25 s (8-layer BF16, AMXInt8,
2 threads, file cached).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence

import numpy as np

from tessera.engine import readahead

MADV_DONTNEED = 4  # include/uapi/asm-generic/mman-common.h
PAGEMAP = "/proc/self/pagemap"
_PRESENT, _SWAPPED, _FILE = 1 << 63, 1 << 62, 1 << 61  # Documentation/admin-guide/mm/pagemap.rst
_SCAN_PAGES = 1 << 15  # pagemap entries read at a time (256 kB of entries for 128 MB of map)


def _mapped_runs(experts, files: Sequence) -> list[tuple[int, int]]:
    """(address, bytes) of each of `experts`' gate/up/down that is one contiguous run inside one of the maps `files`
    (engine.source_digest.SourceFile)."""
    from tessera.engine.source_digest import mapped_run

    runs = [mapped_run(t, files) for t in (experts.gate_proj, experts.up_proj, experts.down_proj)]
    return [run for run in runs if run is not None]


def _page_runs(experts, files: Sequence) -> list[tuple[int, int]]:
    """_mapped_runs with each start rounded down to its page: (page-aligned address, bytes)."""
    return [(address - address % mmap.PAGESIZE, n + address % mmap.PAGESIZE)
            for address, n in _mapped_runs(experts, files)]


def release_experts(experts, files: Sequence) -> int:
    """Releases the whole pages of `experts`' gate/up/down (engine.experts.LayerExperts) that lie in one of the maps
    `files` and were never written; returns the bytes released."""
    return sum(release(*run) for run in _mapped_runs(experts, files))


def populate_experts(experts, files: Sequence) -> None:
    """Maps the pages of `experts`' gate/up/down that lie in the maps `files` now, a chunk at a time on
    readahead.POPULATE_THREADS threads (readahead.populate_pieces; pages not in the page cache are read from disk
    first). Errors (no MADV_POPULATE_READ before Linux 5.14) only cost the speed-up: the kernel's reads fault them in
    instead."""
    readahead.populate_pieces([(start + off, size) for start, n in _page_runs(experts, files)
                               for off, size in readahead.chunks(n, None)])


def read_ahead_experts(layers: Sequence, files: Sequence) -> readahead.ReadAhead | None:
    """Reads the expert bytes of `layers` (engine.experts.LayerExperts, in the order they will be packed) into the
    page cache on readahead's thread, through maps of its own (the process's RSS does not grow), so that a cold file's
    first load reads the next layer from disk while the cores pack this one; None when they are (nearly) all in the
    page cache already (readahead.POPULATE_WHEN_CACHED), or do not fit in the memory available. The caller stops it."""
    from tessera.engine.source_digest import part_of

    spans = []  # (part, file offset, bytes)
    for experts in layers:
        for start, n in _page_runs(experts, files):
            part = part_of(start, n, files)  # maps start on a page: the rounded run is still inside its map
            spans.append((part, start - files[part].start, n))
    if not spans or readahead.resident_share(
            (files[part].start + off, n) for part, off, n in spans) >= readahead.POPULATE_WHEN_CACHED:
        return None
    paths = [f.identity["path"] for f in files]
    return readahead.start(paths, [[(off, off + n) for p, off, n in spans if p == i] for i in range(len(files))])


def release(address: int, nbytes: int, pagemap: str = PAGEMAP) -> int:
    """MADV_DONTNEED on the whole pages of [address, address + nbytes) of a file map when each of them is either not
    mapped or mapped from the file (pagemap); 0 (nothing done) otherwise or on any error, else the bytes released."""
    page = mmap.PAGESIZE
    start = -(-address // page) * page
    stop = (address + nbytes) // page * page
    if stop <= start or not _file_pages_only(start, stop, page, pagemap):
        return 0
    return stop - start if readahead.madvise(start, stop - start, MADV_DONTNEED) == 0 else 0


def _file_pages_only(start: int, stop: int, page: int, pagemap: str) -> bool:
    """Whether every page of [start, stop) is absent or a present page of a file (not an anonymous copy, not
    swapped out); False when pagemap cannot be read."""
    try:
        fd = os.open(pagemap, os.O_RDONLY)
    except OSError:
        return False
    try:
        for first in range(start // page, stop // page, _SCAN_PAGES):
            count = min(_SCAN_PAGES, stop // page - first)
            raw = os.pread(fd, count * 8, first * 8)
            if len(raw) != count * 8:
                return False
            entries = np.frombuffer(raw, dtype="<u8")
            present = (entries & np.uint64(_PRESENT)) != 0
            if np.any((entries & np.uint64(_SWAPPED)) != 0) or np.any(present & ((entries & np.uint64(_FILE)) == 0)):
                return False
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
