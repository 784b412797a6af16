"""Read a model file into the page cache ahead of use, on a background thread, so a cold load streams from disk.

GGUF tensors are views of a memory map (engine.gguf_reader). Touched for the first time, each page of a map costs a
page fault and a small read (the kernel reads ~128 kB around it), so a cold load that walks the file (the block-scale
check, then the first forward pass) reads it at a fraction of the disk's speed: 0.56-0.8 GB/s for an 18.6 GB file
where llama.cpp, which prefetches its map, reads 1.6 GB/s. `start(paths)` asks the kernel for the files, in order, a
chunk at a time (`posix_fadvise(WILLNEED)`: the kernel queues the reads and returns; the call waits only while the
device's queue is full), so the pages are in memory, or on their way, when the loader gets to them.

The thread runs at nice 19: with the file already cached its work is a page-cache lookup per page (~0.5 s of CPU for
18.6 GB), which on a 2-core machine would otherwise slow the first forward pass. Only when the files fit in the
memory available now: reading ahead more than that would push out the pages read first,
the ones the loader needs first. Pages already cached cost a lookup each. Errors (a file gone, no fadvise on this
system) only cost the speed-up.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

CHUNK = 64 << 20  # bytes asked for at a time: a stop request is seen within one chunk


class ReadAhead:
    """A running read-ahead; `stop()` ends it after the current chunk (a closed model stops its read-ahead)."""

    def __init__(self, paths: list[str]):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(paths,), name="tessera-readahead", daemon=True)
        self._thread.start()

    def _run(self, paths: list[str]) -> None:
        try:  # this thread only (Linux): its page-cache lookups of a warm file must not take a core from the load
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                size = os.fstat(fd).st_size
                for off in range(0, size, CHUNK):
                    if self._stop.is_set():
                        return
                    os.posix_fadvise(fd, off, min(CHUNK, size - off), os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(fd)

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Waits for the end (tests, benchmarks); True when it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


def start(paths: Iterable[str | os.PathLike[str]]) -> ReadAhead | None:
    """Read `paths` ahead in order; None when this system has no posix_fadvise or they do not fit in the memory
    available now."""
    paths = [os.fspath(p) for p in paths]
    if not paths or not hasattr(os, "posix_fadvise"):
        return None
    try:
        total = sum(os.stat(p).st_size for p in paths)
    except OSError:
        return None
    if total > _available_memory():
        return None
    return ReadAhead(paths)


def _available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)
