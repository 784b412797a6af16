"""Read a model file into the page cache ahead of use, on a background thread, so a cold load streams from disk; map
a cached file's pages into the process's memory map at load, so decode does not fault on them; and ask for both in
2 MB pages.

GGUF tensors are views of a memory map (engine.gguf_reader). Touched for the first time, each page of a map costs a
page fault and a small read (the kernel reads ~128 kB around it), so a cold load that walks the file (the block-scale
check, then the first forward pass) reads it at a fraction of the disk's speed: 0.56-0.8 GB/s for an 18.6 GB file
where llama.cpp, which prefetches its map, reads 1.6 GB/s. `start(paths)` reads the files, in order, a chunk at a time,
on a thread of its own, through a map of its own (`MADV_POPULATE_READ` on each chunk; a byte of every page read where
the kernel has no populate), so the pages are in memory when the loader gets to them. (It asked the kernel with
`posix_fadvise(WILLNEED)` before: Linux reads at most the device's read-ahead window per call (`read_ahead_kb`, 128 kB
by default, 8 MB on this VM), so each 64 MB chunk was read only from its first 0.2-12 %, and in 4 kB pages.)

2 MB pages. A file-backed page cache holds "large folios" on file systems that support them (ext4 since Linux 6.16,
XFS since 5.18), and a map of a 2 MB folio at a 2 MB-aligned address takes one page-table entry where 4 kB pages take
512. Decode reads ~1.1 GB of scattered experts per token, and with 4 kB entries every 4 kB is a TLB miss that the
hardware's prefetchers do not cross: the 48-layer Q4_K_M decode step ran 93-97 ms with the file on 2 MB pages and
119-157 ms with the same page cache mapped in 4 kB entries (docs/BENCHMARKS.md, session 19). The kernel reads a fault
of a `MADV_HUGEPAGE` map in 2 MB folios whatever the read-ahead window (without it, a fault reads
`read_ahead_kb`-sized folios: 128 kB by default, too small to map whole), so the model's maps (`advise_huge_pages`:
engine.gguf_reader, engine.pack_cache) and the read-ahead's own map ask for it. Advice only: where the kernel or the
file system has no large folios, or no free 2 MB block is left, pages are 4 kB as before. `huge_page_share(paths)`
says how much of a loaded model ended up on 2 MB pages (`tessera-cli bench`).

The thread runs at nice 19: with the file already cached its work is a page-cache lookup per page (~0.5 s of CPU for
18.6 GB), which on a 2-core machine would otherwise slow the first forward pass. Only when the files fit in the
memory available now: reading ahead more than that would push out the pages read first,
the ones the loader needs first. Pages already cached cost a lookup each. Errors (a file gone, no madvise on this
system) only cost the speed-up.

A page in the page cache is still not in the process's page tables: the first read of it through the map faults, and
decode reads a routed expert's blocks for the first time whenever the router first picks it. On the 48-layer Q4_K_M
file (18.55 GB, all cached, Zen 4, 2 threads) a first read of the whole map ran at 5.4 GB/s, a second at 26-30;
`populate(maps)` (`madvise(MADV_POPULATE_READ)`, Linux >= 5.14; llama.cpp maps with MAP_POPULATE) maps them all in
1.3 s on one thread, after which the first read runs at 30 GB/s. It maps page-cache pages read-only, copying nothing
(the map is copy-on-write and nothing writes to it), so memory stays the file's. engine.session runs it in load when
`resident_fraction(maps)` says the file is (nearly) all cached; on the nice-19 thread, overlapping the first forward
and decode, it slowed decode on 2 cores (docs/BENCHMARKS.md), so a cold file is only read ahead (through the
thread's own map, unmapped after each file: the model's map then faults the cached pages in, one fault per 2 MB page
or per 16 small ones). On a kernel without it (EINVAL) the speed-up is absent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

Ranges = Sequence[list[tuple[int, int]]] | None  # per file or map: the (start, stop) byte ranges to work on; None: all
POPULATE_THREADS = max(1, min(4, os.cpu_count() or 1))
SAMPLE_PAGES, SAMPLE_STRIDE = 64, 16 << 20  # resident_fraction: 64 pages (256 kB) out of every 16 MB
CHUNK = 64 << 20  # bytes asked for (or populated) at a time: a stop request is seen within one chunk
# a file at least this much in the page cache is populated at load (the rest read from disk then, ~1 s for 10 % of
# 18.6 GB); below it the read-ahead thread reads it and first touches map it
POPULATE_WHEN_CACHED = 0.9
MADV_POPULATE_READ = 22  # include/uapi/asm-generic/mman-common.h; Python's mmap module has no name for it before 3.13
MADV_HUGEPAGE = 14  # the same header


class ReadAhead:
    """A running read-ahead; `stop()` ends it after the current chunk (a closed model stops its read-ahead)."""

    def __init__(self, paths: list[str], ranges: Ranges = None):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(paths, ranges), name="tessera-readahead", daemon=True)
        self._thread.start()

    def _run(self, paths: list[str], ranges: Ranges) -> None:
        try:  # this thread only (Linux): its page-cache lookups of a warm file must not take a core from the load
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        for i, path in enumerate(paths):
            if self._stop.is_set():
                return
            try:
                self._read(path, None if ranges is None else ranges[i])
            except (OSError, ValueError):
                pass  # gone, empty or not mappable: only the head start is lost

    def _read(self, path: str, ranges: list[tuple[int, int]] | None) -> None:
        with open(path, "rb") as f:
            for off, n in chunks(os.fstat(f.fileno()).st_size, ranges):
                if self._stop.is_set():
                    return
                read_chunk(f.fileno(), off, n)

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Waits for the end (tests, benchmarks); True when it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


def chunks(nbytes: int, ranges: list[tuple[int, int]] | None) -> Iterator[tuple[int, int]]:
    """(offset, length) pieces of at most CHUNK bytes covering `ranges` ((start, stop) byte ranges in order; None:
    all `nbytes`), each start rounded down to a page (madvise wants aligned addresses; a map starts on a page)."""
    page = os.sysconf("SC_PAGE_SIZE")
    for start, stop in [(0, nbytes)] if ranges is None else ranges:
        start, stop = start - start % page, min(stop, nbytes)
        for off in range(start, stop, CHUNK):
            yield off, min(CHUNK, stop - off)


def read_chunk(fd: int, off: int, n: int) -> None:
    """Bytes [off, off + n) of the open file `fd` into the page cache, through a map of their own that only this call
    uses (no one can unmap it under the read, and the process's RSS counts at most one chunk twice), asked for in 2 MB
    pages (advise_huge_pages: the kernel reads a fault there as 2 MB folios), populated, then unmapped."""
    page = os.sysconf("SC_PAGE_SIZE")
    start = off - off % page  # a map starts on a page
    with mmap.mmap(fd, off + n - start, prot=mmap.PROT_READ, offset=start) as m:
        view = np.frombuffer(m, dtype=np.uint8)
        advise_huge_pages(view)
        if madvise(view.ctypes.data, view.nbytes, MADV_POPULATE_READ):  # Linux < 5.14: page faults
            view[::page].sum()  # numpy releases the GIL for the loop
        del view  # before the map closes: a numpy view keeps it exported


def start(paths: Iterable[str | os.PathLike[str]], ranges: Ranges = None) -> ReadAhead | None:
    """Read `paths` ahead in order (`ranges`: per path, the byte ranges to read; None: all of each); None when they
    do not fit in the memory available now."""
    paths = [os.fspath(p) for p in paths]
    if not paths:
        return None
    try:
        sizes = [os.stat(p).st_size for p in paths]
    except OSError:
        return None
    total = sum(sizes) if ranges is None else sum(min(b, n) - a for n, rs in zip(sizes, ranges) for a, b in rs)
    if total > _available_memory():
        return None
    return ReadAhead(paths, ranges)


def read_in_place(gguf, backend: str) -> list[list[tuple[int, int]]] | None:
    """Per part of an open GGUF model (engine.gguf_reader.GGUFModel), the (start, stop) byte ranges the loaded model
    reads through its map: everything but the routed experts stored as floats (bf16, f16, f32). A native expert
    backend reads those only to pack them, and not at all when their packs come from the packed-weight cache: a BF16
    file's experts are 10.6 of its 11.2 GB, and mapping them at every warm load cost ~0.2-0.5 s (populate) or a disk
    read of 10.6 GB (cold read-ahead) that nothing used. Packing them (the first load) reads them by page faults
    instead. None (all of it) for the Torch backend, which computes with them in place. Needs no torch (engine.preload
    calls it before torch is imported)."""
    from tessera.engine import quants
    from tessera.engine.backends import TORCH, resolve
    from tessera.engine.errors import TesseraError

    try:
        if resolve(backend)[0] == TORCH:
            return None
    except TesseraError:
        return None  # the load says what is wrong with the name
    out = []
    for part in gguf.files:
        skip = sorted((t.offset, t.offset + t.nbytes) for t in part.tensors.values()
                      if "_exps." in t.name and t.ggml_type not in quants.QUANT_TYPES)
        ranges, at = [], 0
        for a, b in skip:
            if a > at:
                ranges.append((at, a))
            at = max(at, b)
        if at < part.file_size:
            ranges.append((at, part.file_size))
        out.append(ranges)
    return out


def resident_fraction(maps: Sequence[np.ndarray | None], ranges: Ranges = None) -> float:
    """The share of `maps`' pages (`ranges`: per map, of those byte ranges only) in the page cache now (mincore(2)),
    estimated from SAMPLE_PAGES pages at the start of every SAMPLE_STRIDE bytes (all of a small file); 0.0 on error.
    Asking for every page took 0.27-0.42 s of a 16.6 GB file's warm load (4 M pages) for a yes/no decision at 90 %;
    the page cache keeps and drops files in runs of pages far longer than the stride, so the sample decides the same."""
    return resident_share(_map_pieces(maps, ranges))


def resident_share(spans: Iterable[tuple[int, int]]) -> float:
    """resident_fraction's sample over (page-aligned address, bytes) spans of mapped memory; 0.0 on error."""
    fn = _libc("mincore", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p])
    page, cached, total = os.sysconf("SC_PAGE_SIZE"), 0, 0
    vec = np.zeros(SAMPLE_PAGES, np.uint8)  # one byte a page
    if fn is None:
        return 0.0
    for address, n in spans:
        for at in range(address, address + n, SAMPLE_STRIDE):
            m = min(SAMPLE_PAGES * page, address + n - at)
            if fn(ctypes.c_void_p(at), ctypes.c_size_t(m), vec.ctypes.data_as(ctypes.c_void_p)):
                return 0.0
            pages = (m + page - 1) // page
            cached, total = cached + int(np.count_nonzero(vec[:pages] & 1)), total + pages
    return cached / total if total else 0.0


def populate(maps: Sequence[np.ndarray | None], cancel: threading.Event | None = None,
             ranges: Ranges = None) -> str | None:
    """Map every page of `maps` (`ranges`: per map, of those byte ranges only) now, before returning, a chunk at a time
    (a set `cancel` stops it between chunks); None, or why it stopped (an errno name). For pages already in the page
    cache CPU work only (0.07-0.08 s a GB per thread here); a page not cached is read from disk first. Chunks go to
    POPULATE_THREADS threads: the page-table work scales with cores (24-layer Q8_0, 16.6 GB cached, Zen 4: 1.33 s on
    one thread, 0.63 s on two), and the load waits for it with nothing else to do."""
    return populate_pieces(_map_pieces(maps, ranges), cancel)


def _map_pieces(maps: Sequence[np.ndarray | None], ranges: Ranges) -> list[tuple[int, int]]:
    """(address, bytes) pieces of at most CHUNK bytes covering `maps` (`ranges`: per map, those byte ranges only)."""
    return [(mapped.ctypes.data + off, n) for i, mapped in enumerate(maps) if mapped is not None
            for off, n in chunks(mapped.nbytes, None if ranges is None else ranges[i])]


def populate_pieces(work: Sequence[tuple[int, int]], cancel: threading.Event | None = None) -> str | None:
    """populate's work: MADV_POPULATE_READ on each (page-aligned address, bytes) piece, on POPULATE_THREADS threads;
    None, or why it stopped (an errno name)."""
    failed: list[int] = []

    def one(piece: tuple[int, int]) -> None:
        if failed or (cancel is not None and cancel.is_set()):
            return
        err = madvise(piece[0], piece[1], MADV_POPULATE_READ)
        if err:
            failed.append(err)

    if len(work) > 1 and POPULATE_THREADS > 1:  # the calls release the GIL: chunks on several cores at once
        with ThreadPoolExecutor(POPULATE_THREADS, thread_name_prefix="tessera-populate") as ex:
            list(ex.map(one, work))
    else:
        for piece in work:
            one(piece)
    return errno.errorcode.get(failed[0], str(failed[0])) if failed else None


class SharedPopulate:
    """A populate that several threads work on together, a piece at a time: engine.preload's thread starts it while
    torch is imported, and the load's thread joins in (`work`, with helpers) when it has nothing else left to do.
    Each piece is one MADV_POPULATE_READ call, which maps the cached pages without reading them. (It read a byte of
    every page instead until session 22, because the madvise holds the process's mmap lock for the whole piece and,
    in 256 MB pieces beside `import torch`, made the import 0.9 s longer on Zen 4 (session 8). But on a VM that read
    is the first CPU access to pages the disk has just filled, which the hypervisor pays for: the first warm load after
    a cold one ran 4.4-5.1 s (user time 7.8-9.2 s) against 1.5 s, on the AMX Xeon VM with the 24-layer Q8_0. In 64 MB
    pieces the madvise cost the import nothing measurable there: warm loads 1.46-1.53 s against 1.57-1.60 reading.)
    `failed`: the errno name that stopped a madvise, or None."""

    def __init__(self, maps: Sequence[np.ndarray | None], ranges: Ranges = None, cancel=None, chunk: int = CHUNK):
        page = os.sysconf("SC_PAGE_SIZE")
        chunk = max(page, chunk - chunk % page)
        self._pieces: list[tuple[np.ndarray, int, int]] = []
        for i, mapped in enumerate(maps):
            if mapped is None:
                continue
            for start, stop in [(0, mapped.nbytes)] if ranges is None else ranges[i]:
                start, stop = start - start % page, min(stop, mapped.nbytes)
                self._pieces += [(mapped, off, min(off + chunk, stop)) for off in range(start, stop, chunk)]
        self._next, self._lock, self._cancel = 0, threading.Lock(), cancel
        self.failed: str | None = None

    def work(self) -> None:
        """Maps pieces until none is left (or one failed, or `cancel` is set); returns when this thread's last
        piece is done (another thread's may still run)."""
        while True:
            with self._lock:
                if self.failed or self._next >= len(self._pieces) or (self._cancel is not None
                                                                      and self._cancel.is_set()):
                    return
                mapped, start, stop = self._pieces[self._next]
                self._next += 1
            err = madvise(mapped.ctypes.data + start, stop - start, MADV_POPULATE_READ)
            if err:
                with self._lock:
                    self.failed = self.failed or errno.errorcode.get(err, str(err))


def madvise(address: int, length: int, advice: int) -> int:
    """libc madvise(2) on a page-aligned address; 0, or the errno (ENOSYS where this system's libc has none).
    ctypes releases the GIL for the call, so a populate that waits for the disk holds nobody up."""
    fn = _libc("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])
    if fn is None:
        return errno.ENOSYS
    if fn(ctypes.c_void_p(address), ctypes.c_size_t(length), ctypes.c_int(advice)) == 0:
        return 0
    return ctypes.get_errno() or errno.EINVAL


def advise_huge_pages(mapped: np.ndarray) -> int:
    """Asks the kernel for 2 MB pages on the map behind `mapped` (MADV_HUGEPAGE, from the page holding its first
    byte: np.memmap with an offset starts inside a page): the page cache is read into 2 MB folios on faults there and
    mapped whole (module docstring). Call it before the map is touched. 0, or the errno (advice: nothing fails)."""
    if mapped.nbytes == 0:
        return 0
    page = os.sysconf("SC_PAGE_SIZE")
    address = mapped.ctypes.data
    start = address - address % page
    return madvise(start, address + mapped.nbytes - start, MADV_HUGEPAGE)


def huge_page_share(paths: Iterable[str | os.PathLike[str]], smaps: str = "/proc/self/smaps") -> float | None:
    """The share of this process's resident maps of the files `paths` that is mapped in 2 MB pages (smaps'
    FilePmdMapped over Rss); None when none of them is mapped and resident, or where there is no smaps (not Linux)."""
    names = {os.path.realpath(os.fspath(p)) for p in paths}
    rss = pmd = 0
    inside = False
    try:
        with open(smaps) as f:
            for line in f:
                head = line.split(maxsplit=5)
                if head and "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line
                    inside = len(head) == 6 and head[5].strip() in names  # the kernel's path: resolved
                elif inside and head[0] == "Rss:":
                    rss += int(head[1])
                elif inside and head[0] == "FilePmdMapped:":
                    pmd += int(head[1])
    except OSError:
        return None
    return pmd / rss if rss else None


_libc_fns: dict[str, object] = {}  # name -> the libc function, or None where this libc has none; looked up once


def _libc(name: str, argtypes: list):
    if name not in _libc_fns:
        fn = None
        try:
            fn = getattr(ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True), name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _libc_fns[name] = fn
    return _libc_fns[name]


def _available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)
