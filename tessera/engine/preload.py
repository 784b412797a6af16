"""The part of a model load that needs no torch, started before `import torch` so that the two overlap.

A warm load of a GGUF file spends much of its time in work the kernel and numpy do: the map's pages mapped
(engine.readahead; 1.04-1.33 s on one core for a cached 16.6 GB Q8_0 file) and the fingerprint of every
cached pack (engine.pack_cache; 0.39 s for the 8-layer BF16 file's 5.1 GB). `import torch` takes 1.1-1.25 s on one
core of the 2-core Zen 4 before any of it can begin, and its Python work holds the GIL while the other core waits
(docs/BENCHMARKS.md, session 7). `start(path, backend=...)`, called by the CLI and the app's worker before they import
torch, begins on a background thread, in this order:

1. the cached packs the last load of this model with this backend used (pack_cache.recorded_keys: its record under
   models/), each mapped and checked as PackCache.load checks a file (pack_cache.open_checked: header, key,
   fingerprint on the map that is then used); PackCache.load takes them (`take_pack`), checks the header again
   against the size it expects and runs the backend's validation; a pack the thread has not begun when the load asks
   for it is checked by the load itself, on all of its threads;
2. opening the GGUF file (the header parsed, the file mapped): the very GGUFModel the load then uses
   (engine.weights.open_model takes it; a file that fails to open is opened again by the load, which reports it);
3. the map's pages, as engine.session decides without a preload (the ranges of readahead.read_in_place): mapped when
   the file is (nearly) all in the page cache, else read ahead on readahead's thread, which the session then owns and
   stops when closed. The load's `wait` joins the mapping on POPULATE_THREADS threads before it returns (a populate
   beside the first forward slowed decode on 2 cores, engine.readahead).

One thread while the import runs: two threads on 2 cores slowed the import by more than they hid. The packs' sums map
their pages by faults (`populate=False`): the madvise holds the process's mmap lock for a whole piece, which stalled
the import's library maps (0.9 s longer beside a Q8_0 populate in 256 MB pieces; a fault takes only its VMA's lock;
docs/BENCHMARKS.md, session 8). The model's pages are mapped by MADV_POPULATE_READ in readahead.CHUNK (64 MB) pieces
(readahead.SharedPopulate): reading a byte of each page instead, as before session 22, was the first CPU access to
pages a cold load had just read from disk, which a VM's hypervisor makes slow (the docstring there).

Nothing is checked less than before: the same checks, on the maps the kernels read, only sooner. A pack the load does
not ask for (a key no longer in use) is dropped when the load ends (`Preload.release`); errors on the thread cost the
head start only (the load does that work itself). The CLI and the worker call `discard` when a command or a load
ends, so nothing stays mapped when no load took it (another path, a usage error).

The thread's numpy sums release the GIL; its Python glue needs it, so while the thread runs the interpreter's switch
interval is 1 ms instead of 5 (a waiting thread gets the GIL sooner from the importing one), and it works in pieces of
CHUNK bytes.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

SWITCH_INTERVAL = 0.001  # s: sys.setswitchinterval while a preload runs (Python's default is 0.005)
CHUNK = 256 << 20  # bytes a pack's check sums between two waits for the GIL

_lock = threading.Lock()
_started: dict[str, Preload] = {}  # resolved model path -> its preload, until a load takes it or `discard`
_taken: set[Preload] = set()  # preloads a load has taken and not yet released (their packs are still offered)
_switch = {"count": 0, "before": 0.0}  # running preloads and the interval they replaced


def _key(path: str | os.PathLike[str]) -> str:
    return str(Path(path).resolve())


def start(path: str | os.PathLike[str], *, backend: str = "Auto", cancel: threading.Event | None = None,
          cache_root: str | os.PathLike[str] | None = None) -> Preload | None:
    """Begin the torch-free part of loading `path` with `backend` (None: not a .gguf file, or one already started).
    cache_root: the packed-weight cache's folder (default: pack_cache.default_root(), where the load looks)."""
    p = Path(path)
    try:
        if p.suffix.lower() != ".gguf" or not p.is_file():
            return None
        key = _key(p)
    except OSError:
        return None
    with _lock:
        if key in _started:
            return None
        _import_what_the_thread_uses()
        pre = _started[key] = Preload(p, backend, cancel, cache_root)
    pre._thread.start()
    return pre


def _import_what_the_thread_uses() -> None:
    """Every module the thread's work imports, imported here, on the caller's thread, before it starts.

    The thread must import nothing while the caller imports torch: two threads importing modules that import each
    other in opposite orders make Python's import locks break the cycle by handing one of them a partly initialized
    module (CI once saw `partially initialized module 'typing' has no attribute 'ClassVar'` from a `serve` run).
    tests/engine/test_preload.py checks that a preload's thread adds nothing to sys.modules."""
    import mmap  # noqa: F401 - numpy.memmap's own import

    import platformdirs  # noqa: F401 - pack_cache.default_root
    import psutil  # noqa: F401 - readahead._available_memory

    from tessera.engine import backends, errors, gguf_reader, pack_cache, quants, readahead  # noqa: F401


def take(path: str | os.PathLike[str]) -> Preload | None:
    """The preload started for `path`, now the caller's (engine.session.load): None when none was started."""
    try:
        key = _key(path)
    except OSError:
        return None
    with _lock:
        return _started.pop(key, None)


def discard(path: str | os.PathLike[str] | None = None) -> None:
    """Drop the preload of `path` (None: every one) that no load took: its thread is stopped and its maps closed."""
    with _lock:
        try:
            keys = list(_started) if path is None else [_key(path)]
        except OSError:
            return
        dropped = [_started.pop(k) for k in keys if k in _started]
    for pre in dropped:
        pre.release(close_model=True)


def take_pack(path: str | os.PathLike[str]) -> object | None:
    """The pack_cache.Opened of the pack file at `path`, checked by a running or finished preload (waiting for it),
    or None when no preload opened it (or its check failed: the caller opens it again and says why)."""
    with _lock:
        live = [pre for pre in _started.values()] + list(_taken)
    want = str(path)
    for pre in live:
        got = pre._pack(want)
        if got is not None:
            return got
    return None


class _Pack:
    """One cached pack on the preload's list: "new" (a load that asks for it first checks it itself), "running",
    or "done" (`opened`: the pack_cache.Opened, None when its check failed)."""

    def __init__(self, path: Path, key: str):
        self.path, self.key, self.state, self.opened = path, key, "new", None
        self.ready = threading.Event()


class Preload:
    """One model's head start. `ahead`: the readahead.ReadAhead of a cold file; `populated`: the map's pages
    populated; `error`: what stopped the thread."""

    def __init__(self, path: Path, backend: str, cancel: threading.Event | None, cache_root):
        self.path, self.backend, self.cancel = path, backend, cancel
        self.cache_root = None if cache_root is None else Path(cache_root)
        self._file = None  # the opened GGUFModel (the thread keeps using it after model() hands it over)
        self.ahead = None
        self.populated = False
        self.pages_done = False  # the pages step ran to its decision (populated, read ahead, or neither)
        self.error: BaseException | None = None
        self._opened, self._listed, self._done = threading.Event(), threading.Event(), threading.Event()
        self._decided = threading.Event()  # the pages step's populate (if any) is made
        self._packs: dict[str, _Pack] = {}
        self._populate = None  # the readahead.SharedPopulate the load's wait() joins
        self._handed = None  # the GGUFModel model() handed over
        self._plock = threading.Lock()
        self._stop = _Either(cancel)  # release() sets it; a set `cancel` counts too
        self._thread = threading.Thread(target=self._run, name="tessera-preload", daemon=True)

    # ---- the thread ------------------------------------------------------------------------------------------------
    # One thread: `import torch` runs on the other core. Two threads checking packs beside the import (2 cores)
    # made the import 0.2-0.5 s slower than the packs' whole check (8-layer BF16, docs/BENCHMARKS.md session 8).

    def _run(self) -> None:
        _switch_enter()
        try:
            self._list_packs()  # first: the list needs only the cache's record
            self._listed.set()
            self._check_packs()  # before the file: the load needs the packs first and the file's parse holds the GIL
            self._open()
            if self._file is not None:
                self._pages()
        except Exception as e:  # noqa: BLE001 - a head start only: the load does whatever this did not
            self.error = e
        finally:
            self._opened.set()
            self._listed.set()
            self._decided.set()
            self._done.set()
            _switch_leave()

    def _open(self) -> None:
        from tessera.engine.gguf_reader import open_gguf_model

        try:
            self._file = open_gguf_model(self.path)
        except Exception as e:  # noqa: BLE001 - the load opens it again and reports it
            self.error = e
        finally:
            self._opened.set()

    def _list_packs(self) -> None:
        from tessera.engine.backends import TORCH, resolve
        from tessera.engine.pack_cache import default_root, recorded_keys

        try:
            concrete = resolve(self.backend)[0]
        except Exception:  # noqa: BLE001 - an unknown or unavailable backend: the load says so
            return
        if concrete == TORCH:
            return
        root = self.cache_root or default_root()
        with self._plock:
            for key in recorded_keys(root, _key(self.path), concrete):
                path = root / "layers" / f"{key}.pack"
                self._packs[str(path)] = _Pack(path, key)

    def _check_packs(self) -> None:
        from tessera.engine.pack_cache import open_checked

        with self._plock:
            todo = list(self._packs.values())
        for pack in todo:
            with self._plock:
                if pack.state != "new" or self._stop.is_set():
                    continue
                pack.state = "running"
            try:
                pack.opened = open_checked(pack.path, pack.key, chunk=CHUNK, populate=False)[0]
            except Exception:  # noqa: BLE001 - gone, unreadable, a bad header: PackCache.load finds it, says so
                pack.opened = None
            finally:
                pack.state = "done"
                pack.ready.set()

    def _pages(self) -> None:
        from tessera.engine import readahead

        maps = [part.mapping for part in self._file.files]
        ranges = readahead.read_in_place(self._file, self.backend)
        if readahead.resident_fraction(maps, ranges) >= readahead.POPULATE_WHEN_CACHED:
            self._populate = readahead.SharedPopulate(maps, ranges, self._stop, readahead.CHUNK)
            self._decided.set()
            self._populate.work()
            self.populated = True
        else:
            self.ahead = readahead.start((part.path for part in self._file.files), ranges)
        self.pages_done = True

    # ---- what the load takes ---------------------------------------------------------------------------------------

    @property
    def gguf(self):
        """The opened GGUFModel while no load has taken it (None before it is open, after, or when opening failed)."""
        return None if self._handed is not None else self._file

    def model(self):
        """The opened GGUFModel (waiting for the thread to open it), now the caller's; None when it failed."""
        self._opened.wait()
        with _lock:
            _taken.add(self)
        self._handed = self._file
        return self._file

    def opened(self, gguf) -> bool:
        """Whether `gguf` is the model this preload opened (and `model()` handed over)."""
        return gguf is not None and gguf is self._handed

    def _pack(self, path: str):
        self._listed.wait()  # the thread sets it whatever happens
        with self._plock:
            pack = self._packs.pop(path, None)
            if pack is None:
                return None
            if pack.state == "new":  # not begun: the caller checks it now, on all of its threads
                pack.state = "taken"
                return None
        pack.ready.wait()
        return pack.opened

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for the thread to end, helping with its populate meanwhile (the first forward should not share the
        cores with it, and the caller has nothing else to do); True when it ended."""
        from tessera.engine import readahead

        self._decided.wait(timeout)
        populate = self._populate
        if populate is not None:
            helpers = [threading.Thread(target=populate.work, name="tessera-populate", daemon=True)
                       for _ in range(readahead.POPULATE_THREADS - 1)]
            for t in helpers:
                t.start()
            populate.work()
            for t in helpers:
                t.join()
        return self._done.wait(timeout)

    def release(self, close_model: bool = False) -> None:
        """Ends this preload: packs no load took are dropped (their maps closed when the last reference goes), no
        more are opened; with close_model a model no load took is closed and its read-ahead stopped."""
        self._stop.set()
        with _lock:
            _taken.discard(self)
        with self._plock:
            self._packs = {}
        if close_model:
            self._done.wait()
            if self.ahead is not None:
                self.ahead.stop()
            if self._file is not None and self._handed is None:
                self._file.close()
            self._file = None


class _Either:
    """A stop flag that is also set when the caller's cancel event is (readahead.populate asks `is_set()` only)."""

    def __init__(self, other: threading.Event | None):
        self._own, self._other = threading.Event(), other

    def set(self) -> None:
        self._own.set()

    def is_set(self) -> bool:
        return self._own.is_set() or (self._other is not None and self._other.is_set())


def _switch_enter() -> None:
    with _lock:
        if _switch["count"] == 0:
            _switch["before"] = sys.getswitchinterval()
            sys.setswitchinterval(min(SWITCH_INTERVAL, _switch["before"]))
        _switch["count"] += 1


def _switch_leave() -> None:
    with _lock:
        _switch["count"] -= 1
        if _switch["count"] == 0:
            sys.setswitchinterval(_switch["before"])
