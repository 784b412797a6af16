"""A load's writes of freshly packed layers into the packed-weight cache (engine.pack_cache), on a thread of their own
that may outlive the load.

The disk takes a BF16 file's int8 packs at its own speed: 5.13 GB for the 8-layer file, 15-16 s at the 0.32 GB/s this
VM's disk sustains, where packing them takes 2-6 s (docs/BENCHMARKS.md, session 22). Written in line they were 15 of
a 37 s first load; on a thread beside the packing the load still waited for the last of them at its end. A session's
load (engine.hybrid) therefore returns once the layers are packed and lets the writes finish while the user reads the
first reply; a direct caller of make_backend waits for them, as before.

Each write is a temporary file renamed into place (PackCache.store), so a write cut short leaves no pack that could be
read. Writes still waiting are finished, never dropped, when the backend is closed (a session closed, another backend
or model chosen: before the next one loads, so the packs' memory is free by then) and when the process ends (the CLI's
quick exit runs the atexit functions too), with one line on the log saying how much is left: a one-shot `tessera-cli
generate` leaves the whole cache behind, as before. Only a load stopped half-way (an error, a cancel) drops the writes
not started; the layers not written are packed and stored at the next load (their digests are recorded already).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

log = logging.getLogger(__name__)
_live: weakref.WeakSet[PackStores] = weakref.WeakSet()
_live_lock = threading.Lock()


class PackStores:
    """The writes of one load, in submission order on one thread: `submit`, then `wait` (all done; an unexpected error
    of a write is raised), `finish` (the same, for a close or an exit) or `drop` (those not started are dropped)."""

    def __init__(self, cache):
        self.cache = cache  # engine.pack_cache.PackCache
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="tessera-pack-store", initializer=_lowest_priority)
        self._writes: list[tuple[Future, int]] = []
        with _live_lock:
            _live.add(self)

    def submit(self, key: str, blob: np.ndarray) -> None:
        self._writes.append((self._writer.submit(self.cache.store, key, blob), blob.nbytes))

    def pending_bytes(self) -> int:
        return sum(n for done, n in self._writes if not done.done())

    def wait(self) -> None:
        self._writer.shutdown(wait=True)
        for done, _ in self._writes:
            done.result()  # an error other than the disk's (which store reports as a notice) is raised here

    def drop(self) -> None:
        self._writer.shutdown(wait=True, cancel_futures=True)


    def finish(self, when: str) -> None:
        """wait(), saying first how much is left (when: "closing the model"), logging an unexpected error instead of
        raising it: a close or an exit goes on."""
        left = self.pending_bytes()
        if left:
            log.info("packed-weight cache: writing the last %.2f GB of packs before %s", left / 1e9, when)
        try:
            self.wait()
        except Exception as e:  # noqa: BLE001 - what was packed is in use; only the next load's speed is at stake
            log.warning("packed-weight cache: a pack could not be stored (%s)", e)


def _lowest_priority() -> None:
    """The writer thread at nice 19 (Linux: this thread only): copying a pack into the page cache must not take a core
    from the kernels. At nice 0 it did, beside a first reply on 2 cores: a pool thread waited for the core and every
    dispatch with it, decode 3.8 tok/s instead of 13.9 while the writes ran (8-layer BF16, AMXInt8)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def _finish_all() -> None:
    """At the end of the process: every load's writes still waiting are finished."""
    with _live_lock:
        stores = list(_live)
    for s in stores:
        s.finish("exiting")


atexit.register(_finish_all)
