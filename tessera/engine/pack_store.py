"""A load's writes of freshly packed layers into the packed-weight cache (engine.pack_cache), on a thread of their own
that may outlive the load.

The disk takes a BF16 file's int8 packs at its own speed: 5.13 GB for the 8-layer file, 15-16 s at the 0.32 GB/s this
VM's disk sustains, where packing them takes 2-6 s (docs/BENCHMARKS.md, session 22). Written in line they were 15 of
a 37 s first load; on a thread beside the packing the load still waited for the last of them at its end. A session's
load (engine.hybrid) therefore returns once the layers are packed and lets the writes finish while the user reads the
first reply; a direct caller of make_backend waits for them, as before.

Each write is a temporary file renamed into place (PackCache.store), so a write cut short leaves no pack that could be
read. Writes still waiting are finished, never dropped, when the backend is closed (a session closed, another model
chosen: before the next one loads, so the packs' memory is free by then; a backend switch leaves them running, below)
and when the process ends (the CLI's quick exit runs the atexit functions too), with one line on the log saying how
much is left: a one-shot `tessera-cli generate` leaves the whole cache behind, as before. Only a load stopped
half-way (an error, a cancel) drops the writes not started; the layers not written are packed and stored at the next
load (their digests are recorded already).

The writes yield to generation. Written behind the load at full speed they cost the first reply most of its speed
(8-layer BF16 on 2 cores: decode 5.4 tok/s against 16.3 while they ran, session 22): the kernel's writeback of the
dirty pages and the reclaim of page cache for new ones took the cores, not this thread. So a pack goes to disk in
pieces of 64 MB (PackCache.store; ~0.2 s each on that disk), each flushed (fdatasync) before the next is written, so
that at most one piece waits in the page cache for writeback; between pieces the writer waits while any session
generates (`generating`, which Session holds around every request). The writes run while the user reads and types.

A backend switched (Session.set_backend) does not wait for the old backend's writes: the new one is loaded by then, so
the packs they hold are no more memory than the switch itself took, and waiting made a switch right after a BF16
file's first load take 24.5-27 s instead of 13-15 (docs/BENCHMARKS.md, session 24). Its PackStores are detached
(`detach`): the process keeps them until their last write, still counted by `pending_bytes`, still finished at exit.

A user who closes the app while writes remain sees what is left and may skip it (`pending_bytes`, `skip_all`: the
app's close dialog); a pack skipped half-way is abandoned at its next piece boundary and its temporary file removed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

log = logging.getLogger(__name__)
_live: weakref.WeakSet[PackStores] = weakref.WeakSet()
_detached: set[PackStores] = set()  # kept alive by the process until their last write (PackStores.detach)
_live_lock = threading.Lock()


class _Generating:
    """How many requests are generating in this process; the writers wait while there is any."""

    def __init__(self):
        self._cond = threading.Condition()
        self._running = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self._cond:
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def wait_idle(self, skip: threading.Event) -> None:
        """Returns when nothing generates, or once `skip` is set."""
        with self._cond:
            while self._running and not skip.is_set():
                self._cond.wait(0.25)  # skip is an Event of its own: looked at four times a second


_generating = _Generating()


def generating() -> contextlib.AbstractContextManager[None]:
    """Held around a request's prefill and decode (engine.session): the pack-cache writes pause between pieces."""
    return _generating.hold()


class Skipped(Exception):
    """Raised inside a write or a job when the user gave up the writes left (PackStores.skip)."""


class PackStores:
    """The writes of one load, in submission order on one thread: `submit` (a pack and its key) or `submit_job` (work
    that finds keys first, engine.deferred_keys), then `wait` (all done; an unexpected error of a write is raised),
    `finish` (the same, for a close or an exit), `drop` (those not started are dropped) or `skip` (those not started
    dropped, the one running abandoned at its next piece)."""

    def __init__(self, cache):
        self.cache = cache  # engine.pack_cache.PackCache
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="tessera-pack-store", initializer=_lowest_priority)
        self._writes: list[tuple[Future, int, int]] = []  # (future, bytes of work, of which hashing first)
        self._skip = threading.Event()
        self._written = 0  # bytes of the entry in progress already done
        with _live_lock:
            _live.add(self)

    def submit(self, key: str, blob: np.ndarray) -> None:
        self._queue(blob.nbytes, 0, self._store, key, blob)

    def submit_job(self, job: Callable[[PackStores], None], nbytes: int, hash_bytes: int = 0) -> None:
        """Runs `job(self)` on the writer thread after what is queued; `nbytes`: the work it stands for, counted in
        `pending_bytes` until it ends, the first `hash_bytes` of it hashing (the job reports its progress with
        `advance` and `write`, in that order)."""
        self._queue(nbytes, hash_bytes, self._run_job, job)

    def _queue(self, nbytes: int, hash_bytes: int, fn, *args) -> None:
        """Queues fn(*args) on the writer; nothing once the writes were skipped (a close skipping them while the
        load still packs: that load goes on without storing)."""
        try:
            self._writes.append((self._writer.submit(fn, *args), nbytes, hash_bytes))
        except RuntimeError:  # shut down by skip(): only that may stop the writer before the load has returned
            if not self._skip.is_set():
                raise

    def _store(self, key: str, blob: np.ndarray) -> bool:
        try:
            return self.write(key, blob)
        except Skipped:
            return False
        finally:
            self._written = 0  # the next entry starts from nothing (pending_bytes may count this one a moment more)

    def _run_job(self, job: Callable[[PackStores], None]) -> None:
        try:
            job(self)
        except Skipped:
            pass
        finally:
            self._written = 0

    def write(self, key: str, blob: np.ndarray) -> bool:
        """Stores one pack now, on the writer thread, in pieces that wait while a request generates (`gate`); its bytes
        count as done. Raises Skipped when given up."""
        base = self._written
        stored = self.cache.store(key, blob, between=lambda written: self._between(base + written))
        if self._skip.is_set():
            raise Skipped
        self._written = base + blob.nbytes
        return stored

    def advance(self, nbytes: int) -> None:
        """A job's work done besides writes (a layer hashed)."""
        self._written += nbytes

    def gate(self) -> None:
        """Waits while a request generates; raises Skipped once the writes are given up."""
        _generating.wait_idle(self._skip)
        if self._skip.is_set():
            raise Skipped

    def _between(self, written: int) -> bool:
        """Before each piece of a pack: waits while a request generates; False abandons the write (skipped)."""
        self._written = written
        _generating.wait_idle(self._skip)
        return not self._skip.is_set()

    def pending_bytes(self) -> int:
        """Bytes of work not yet done (a write or job in progress counts what it has left)."""
        left = sum(n for done, n, _ in self._writes if not done.done())
        return max(0, left - self._written) if left else 0

    def pending_hash_bytes(self) -> int:
        """Of pending_bytes, those still to hash before their packs can be written (engine.deferred_keys)."""
        waiting = [h for done, _, h in self._writes if not done.done()]
        if not waiting:
            return 0
        return max(0, waiting[0] - self._written) + sum(waiting[1:])  # the first waiting entry is the one running

    def wait(self) -> None:
        self._writer.shutdown(wait=True)
        for done, _, _ in self._writes:
            if not done.cancelled():
                done.result()  # an error other than the disk's (which store reports as a notice) is raised here

    def drop(self) -> None:
        self._writer.shutdown(wait=True, cancel_futures=True)

    def skip(self) -> None:
        """Gives up the writes left, without waiting: the layers not stored are packed again at the next load."""
        self._skip.set()
        self._writer.shutdown(wait=False, cancel_futures=True)
        self._forget()

    def detach(self) -> None:
        """The writes left go on without their load's backend (closed by a backend switch): the process holds this
        object until the last of them is done. Nothing waits; skip_all and finish_all still reach them."""
        with _live_lock:
            _detached.add(self)
        try:
            self._writer.submit(self._forget)  # after every write queued (one writer thread, in order)
            self._writer.shutdown(wait=False)
        except RuntimeError:  # shut down already (skipped or waited for): nothing left to keep it for
            self._forget()

    def _forget(self) -> None:
        with _live_lock:
            _detached.discard(self)

    def finish(self, when: str) -> None:
        """wait(), saying first how much is left (when: "closing the model"), logging an unexpected error instead of
        raising it: a close or an exit goes on."""
        left = self.pending_bytes()
        if left:
            log.info("packed-weight cache: %.2f GB of packs left to save before %s", left / 1e9, when)
        try:
            self.wait()
        except Exception as e:  # noqa: BLE001 - what was packed is in use; only the next load's speed is at stake
            log.warning("packed-weight cache: a pack could not be stored (%s)", e)


def _live_stores() -> list[PackStores]:
    with _live_lock:
        return list(_live)


def pending_bytes() -> int:
    """Bytes of work every load of this process has still to do to save its packs: writing them, and hashing a new
    file version's layers for their keys first (engine.deferred_keys). The app's close dialog shows them."""
    return sum(s.pending_bytes() for s in _live_stores())


def pending_hash_bytes() -> int:
    """Of pending_bytes(), the bytes of model files still to hash before their packs are written."""
    return sum(s.pending_hash_bytes() for s in _live_stores())


def work_left(left: int, hashing: int) -> str:
    """The work left in words, as the CLI and the app say it: "5.13 GB left to write", or "5.13 GB left to write, after
    hashing 7.50 GB of the model file" (`left`: all of it in bytes, `hashing` included)."""
    text = f"{max(left - hashing, 0) / 1e9:.2f} GB left to write"
    return text + (f", after hashing {hashing / 1e9:.2f} GB of the model file" if hashing > 0 else "")


def skip_all() -> None:
    """Gives up every load's writes left (the user chose not to wait at close)."""
    for s in _live_stores():
        s.skip()


def _lowest_priority() -> None:
    """The writer thread at nice 19 (Linux: this thread only): copying a pack into the page cache must not take a core
    from the kernels. At nice 0 it did, beside a first reply on 2 cores: a pool thread waited for the core and every
    dispatch with it, decode 3.8 tok/s instead of 13.9 while the writes ran (8-layer BF16, AMXInt8)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def finish_all() -> None:
    """Every load's writes still waiting, finished (at the end of the process: atexit; the CLI says so first)."""
    for s in _live_stores():
        s.finish("exiting")


atexit.register(finish_all)
