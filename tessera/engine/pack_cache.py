"""The disk cache of packed expert weights: content-keyed, checksummed, budgeted, and never trusted blindly.

Layout under the cache folder (`default_root()`; TESSERA_PACK_CACHE_DIR overrides it):
    layers/<key>.pack    one packed layer: a 128-byte header (magic, format, blob size, key, blob fingerprint) + blob
    models/<id>.json     which keys one model+backend load used, their bytes and when it last loaded (the LRU clock)
    sources/<id>.json    the layer digests of one model file version (engine.source_digest)

The key of a layer is a SHA-256 over the content of the tensors it packs (a tree of per-expert digests, hashed on all
cores) together with everything that changes the packed bytes: backend, layout version, the native build, the packing
knobs (the int8 group size), dims and source dtype. A model replaced by other weights of the same size and mtime gets
other keys; two models sharing a layer share its file.

Every file is verified before its bytes are used: header, size, key and the fingerprint of the whole blob
(`fingerprint`: a 64-bit word sum of every 4 KiB page), computed on the very map the kernels will read (a copy-on-write
map of the file, used in place: files are only ever replaced by rename, never rewritten in place, so a verified map
keeps its bytes). A file that fails any check is deleted and the layer repacked, with a one-line notice.

Why a page sum and not a SHA-256 of the blob (format 2): the check guards against accidents to our own file, not
against an adversary (whoever can write this folder can write the model file, which nothing hashes at all). The
accidents are: a truncated file (caught by the size in the header before anything is read), a torn write left by a
crash or power cut (same size, pages of zeros or stale blocks: their sums change), garbage or zeroed blocks from the
disk or the filesystem, and bit flips (any single flipped bit changes its page's sum). What a page sum misses: two
flips of the same bit position in opposite directions within one page, or words swapped within a page; a disk returns
a bad sector as an error or as garbage, not as such patterns. The sum runs at memory speed (~17 GB/s on one Zen 4 core)
and is the pass that maps the file's pages anyway; the SHA-256 it replaces ran at 1.8 GB/s, 2.9 s of every warm load of
the 8-layer BF16 file (5.1 GB of packs, docs/BENCHMARKS.md). The content that the key stands for is still a SHA-256
(`layer_digest`, of the source experts; engine.source_digest remembers it per file version).

A cache folder that cannot be written (read-only, a file in its place) only costs the speed-up: the model loads
without storing, and says so once per process. The cache keeps to a budget (default: the
smaller of 25 % of the disk space it may use, free space plus the cache itself, and twice the largest cached model;
TESSERA_PACK_CACHE_BUDGET sets it) by evicting the least recently loaded models first. A model larger than the whole
budget keeps what fits, a prefix of its layers, and the notice says how much disk space or which budget would keep all
of it.

Notices go to the `tessera.pack_cache` logger (printed on stderr when nothing else handles it) and to
`PackCache.notices`, which the loader copies into its LoadStats.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tessera.engine.errors import TesseraError

if TYPE_CHECKING:  # imported where used: engine.preload opens this cache's files before `import torch`
    import torch

    from tessera.engine.experts import LayerExperts
    from tessera.engine.quantized import QuantizedTensor

FORMAT = 3  # of the files below; part of every key (2: the blob's SHA-256 in the header, checked at every load)
MAGIC = b"TESSPC3\0"
HEADER_BYTES = 128
_HEADER = struct.Struct("<8sIIQ32s32s")  # magic, format, header bytes, blob bytes, key digest, blob fingerprint
PAGE = 4096  # bytes per page sum of the fingerprint
_CHUNK = 64 << 20  # bytes summed at a time (a multiple of PAGE)
_STORE_PIECE = 64 << 20  # bytes written and flushed at a time by a store with `between` (engine.pack_store)
_LEGACY_DIR = re.compile(r".+-v\d+$")  # format 1 kept one folder per model: <name>-<backend>-v<layout>/layerNNN-*.pack
_BUDGET_ENV = "TESSERA_PACK_CACHE_BUDGET"
_DIR_ENV = "TESSERA_PACK_CACHE_DIR"
DISK_SHARE = 0.25  # of free disk (plus what the cache already holds)
MODEL_MULTIPLE = 2  # times the largest cached model

log = logging.getLogger("tessera.pack_cache")
_said_once: set[str] = set()  # notices said once per process (an unwritable folder)
_writing: set[str] = set()  # names of the temporary files this process is writing now (PackCache.store), kept
# by the sweep (by name: two spellings of one cache folder are one folder)
_writing_lock = threading.Lock()


def default_root() -> Path:
    """The packed-weight cache folder: TESSERA_PACK_CACHE_DIR, else <user cache dir>/tessera/packed."""
    override = os.environ.get(_DIR_ENV)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("tessera")) / "packed"


# ------------------------------------------------------------------------------------------------------------ digests


def _as_bytes(t: torch.Tensor | QuantizedTensor) -> np.ndarray:
    """A uint8 view of a contiguous CPU tensor (no copy when it already is one; bf16 has no numpy dtype), or the
    stored blocks of a QuantizedTensor."""
    import torch

    from tessera.engine.quantized import QuantizedTensor

    if isinstance(t, QuantizedTensor):
        return t.raw.reshape(-1)
    t = t.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8).numpy()


def layer_digest(experts: LayerExperts, workers: int | None = None,
                 before_leaf: Callable[[], None] | None = None) -> bytes:
    """SHA-256 over the shapes, dtypes and bytes of gate/up/down, one leaf per (matrix, expert) hashed in parallel
    (hashlib releases the GIL), then a digest of the leaves in order. SHA-256 runs on the CPU's SHA extensions:
    ~1.8 GB/s per core on Zen 4, twice blake2b there. `before_leaf`: called before each leaf is hashed, on the thread
    hashing it (engine.pack_store's wait while a request generates; an exception it raises ends the digest)."""
    mats = [experts.gate_proj, experts.up_proj, experts.down_proj]  # [E, I, H], [E, I, H], [E, H, I]
    head = hashlib.sha256(repr([(tuple(m.shape), _type_name(m)) for m in mats]).encode())
    views = [_as_bytes(m).reshape(m.shape[0], -1) if m.shape[0] else _as_bytes(m).reshape(0, 0) for m in mats]
    leaves = [v[e] for v in views for e in range(v.shape[0])]
    workers = max(1, workers or os.cpu_count() or 1)

    def leaf_digest(leaf) -> bytes:
        if before_leaf is not None:
            before_leaf()
        return hashlib.sha256(leaf).digest()

    if workers == 1 or len(leaves) < 2:
        digests = [leaf_digest(leaf) for leaf in leaves]
    else:
        with ThreadPoolExecutor(min(workers, len(leaves))) as ex:
            digests = list(ex.map(leaf_digest, leaves))
    for d in digests:
        head.update(d)
    return head.digest()


def _type_name(t: torch.Tensor | QuantizedTensor) -> str:
    """The stored type: a torch dtype ("torch.bfloat16"), or a GGML block type ("Q4_K") for quantized experts."""
    from tessera.engine.quantized import QuantizedTensor

    return t.qtype.name if isinstance(t, QuantizedTensor) else str(t.dtype)


def fingerprint(blob: np.ndarray, workers: int = 1, chunk: int = _CHUNK, populate: bool = True) -> bytes:
    """The integrity check of a packed blob: SHA-256 of its length and of the wrapping sum of the 512 little-endian
    uint64 words of each 4 KiB page (the last page zero-padded), in page order. Any change that alters some page's sum
    changes it: truncation, zeroed or garbage pages, any single flipped bit (see the top of this file for what it
    misses and why that is the right trade). Reads every byte once, at memory speed; on a fresh map of a file each
    chunk is populated first (MADV_POPULATE_READ: one call maps its pages, instead of a fault per 64 kB).
    `workers` > 1: the chunks' page sums on that many threads (the populate and numpy's sum release the GIL; the
    page-table work of the populate is per core), hashed in order, so the digest is the same. `chunk`: bytes a
    thread sums at a time, a multiple of PAGE (any gives the same digest; engine.preload takes bigger ones: each
    chunk waits for the GIL a few times, and while torch is imported each wait is up to the switch interval).
    `populate` False: the pages are mapped by the sum's page faults instead (slower, ~5 GB/s, but a fault takes only
    its VMA's lock, where MADV_POPULATE_READ holds the process's mmap lock for the whole chunk and so stalls every
    mmap of another thread meanwhile: engine.preload's check beside `import torch`, which maps libraries)."""
    data = blob.reshape(-1).view(np.uint8)
    head = hashlib.sha256(struct.pack("<Q", data.nbytes))
    chunk = max(PAGE, chunk - chunk % PAGE)
    pieces = [data[off : off + chunk] for off in range(0, data.nbytes, chunk)]
    if workers > 1 and len(pieces) > 1:
        with ThreadPoolExecutor(min(workers, len(pieces)), thread_name_prefix="tessera-fingerprint") as ex:
            sums = list(ex.map(lambda piece: _page_sums(piece, populate), pieces))
    else:
        sums = [_page_sums(piece, populate) for piece in pieces]
    for s in sums:
        head.update(s)
    return head.digest()


def _page_sums(chunk: np.ndarray, populate: bool = True) -> bytes:
    """The little-endian uint64 sums of `chunk`'s 4 KiB pages (its last page zero-padded), populated first."""
    from tessera.engine import readahead

    if populate:
        start = chunk.ctypes.data
        aligned = start & ~(PAGE - 1)
        readahead.madvise(aligned, start + chunk.nbytes - aligned, readahead.MADV_POPULATE_READ)  # errors: faults
    whole = chunk.nbytes - chunk.nbytes % PAGE
    out = chunk[:whole].view("<u8").reshape(-1, PAGE // 8).sum(axis=1, dtype="<u8").tobytes()
    if whole < chunk.nbytes:
        tail = np.zeros(PAGE, np.uint8)
        tail[: chunk.nbytes - whole] = chunk[whole:]
        out += tail.view("<u8").sum(dtype="<u8").tobytes()
    return out


@dataclass
class Opened:
    """A packed-weight file as `open_checked` found it: its header, its size, and the checked map of its blob."""

    header: bytes
    size: int
    blob: np.ndarray


def open_checked(path: Path, key: str, nbytes: int | None = None, workers: int = 1,
                 chunk: int = _CHUNK, populate: bool = True) -> tuple[Opened | None, str]:
    """Map the blob of the file of `key` at `path` and check it: the header (magic, format, key, `nbytes`: None takes
    the header's own size, as engine.preload does before it knows the size expected) and the fingerprint of the blob,
    computed on the map returned. (Opened, "") or (None, why it fails). Raises OSError (FileNotFoundError: the file
    is not there) and struct.error as reading it does."""
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
        size = os.fstat(f.fileno()).st_size
        if nbytes is None and len(raw) >= _HEADER.size:
            nbytes = _HEADER.unpack(raw[: _HEADER.size])[3]
        why = PackCache._header_problem(raw, key, nbytes or 0, size)
        if why:
            return None, why
        blob = np.memmap(f, dtype=np.uint8, mode="c", offset=HEADER_BYTES, shape=(nbytes,))
    from tessera.engine import readahead

    readahead.advise_huge_pages(blob)  # before the fingerprint reads it: 2 MB pages where the kernel can
    if fingerprint(blob, workers, chunk, populate) != _HEADER.unpack(raw[: _HEADER.size])[5]:
        return None, "does not match its checksum (damaged on disk)"
    return Opened(raw, size, blob), ""


def manifest_name(model: str, backend: str) -> str:
    """The file name under models/ of one model+backend's record."""
    return f"{hashlib.sha256(f'{model}|{backend}'.encode()).hexdigest()[:24]}.json"


def recorded_keys(root: Path, model: str, backend: str) -> list[str]:
    """The keys the last load of `model` with `backend` used, from its record under `root` (read only); [] when
    there is none or it cannot be read."""
    try:
        keys = json.loads((root / "models" / manifest_name(model, backend)).read_text(encoding="utf-8"))["keys"]
        return [k for k in keys if isinstance(k, str) and re.fullmatch(r"[0-9a-f]{1,64}", k)]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return []


def layer_key(identity: dict, experts: LayerExperts, digest: bytes) -> str:
    """The cache key of one layer: its content digest and every parameter that changes the packed bytes."""
    E, I, H = experts.gate_proj.shape
    what = {"format": FORMAT, **identity, "dims": [E, I, H], "dtype": _type_name(experts.gate_proj),
            "content": digest.hex()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:40]


# ------------------------------------------------------------------------------------------------------------ budget


def parse_size(text: str, subject: str) -> int:
    """"12G", "500M", "123456" -> bytes (powers of 1024 for K/M/G/T)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        raise TesseraError(subject, f"expected a size like 20G, 500M or a number of bytes, got {text!r}")
    scale = 1024 ** " KMGT".index(m.group(2).upper() or " ")
    return int(float(m.group(1)) * scale)


def default_budget(free_bytes: int, held_bytes: int, largest_model_bytes: int) -> int:
    """The smaller of 25 % of the disk the cache may use (free space plus what it already holds) and twice the
    largest cached model."""
    return int(min(DISK_SHARE * (free_bytes + held_bytes), MODEL_MULTIPLE * largest_model_bytes))


def human_bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


# ------------------------------------------------------------------------------------------------------------ the cache


@dataclass
class ModelEntry:
    """One model+backend load recorded in models/: what `tessera-cli cache list` shows."""

    id: str
    model: str
    backend: str
    keys: list[str]
    last_used: float
    bytes: int  # of its layer files present now

    @property
    def path_name(self) -> str:
        return f"{self.id}.json"


class PackCache:
    """One cache folder. `usable` False: neither read nor written (no folder, a file in its place); `writable` False:
    verified files are still read, nothing is stored or deleted."""

    def __init__(self, root: str | os.PathLike, *, budget: int | None = None):
        self.root = Path(root)
        self.layers_dir = self.root / "layers"
        self.models_dir = self.root / "models"
        self.notices: list[str] = []
        self.budget_override = budget
        self.store_enabled = True
        self.admitted: set[str] | None = None  # make_room: the keys of a model over the budget that are stored
        self.usable, self.writable = self._probe()

    # -- notices
    def notice(self, text: str, *, once_per_process: bool = False) -> None:
        line = f"packed-weight cache: {text}"
        self.notices.append(line)
        if once_per_process:
            if line in _said_once:
                return
            _said_once.add(line)
        log.warning(line)

    def _probe(self) -> tuple[bool, bool]:
        if self.root.exists() and not self.root.is_dir():
            self.notice(f"{self.root} is not a folder; loading without the cache", once_per_process=True)
            return False, False
        try:
            self.layers_dir.mkdir(parents=True, exist_ok=True)
            self.models_dir.mkdir(parents=True, exist_ok=True)
            probe = self.layers_dir / f".probe{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            readable = self.layers_dir.is_dir() and os.access(self.layers_dir, os.R_OK | os.X_OK)
            what = "reading verified files only" if readable else "loading without the cache"
            self.notice(f"{self.root} cannot be written ({e.strerror or e}); {what}", once_per_process=True)
            return readable, False
        self._sweep_partials()
        return True, True

    def _sweep_partials(self) -> None:
        """Temporary files of a process that died mid-write (killed, power cut) are removed; not those of a live
        process, nor this process's writes in progress (engine.pack_store writes behind a load: a PackCache opened
        meanwhile, by a backend switch or the next load, swept the file being written, whose rename then failed and
        turned storing off for the rest of that load)."""
        for tmp in self.layers_dir.glob("*.tmp*"):
            pid = tmp.name.rsplit(".tmp", 1)[-1].split("-")[0]  # _tmp_path: NAME.tmpPID-THREAD
            if pid.isdigit() and _pid_alive(int(pid)) and int(pid) != os.getpid():
                continue
            with _writing_lock:
                if tmp.name in _writing:
                    continue
                tmp.unlink(missing_ok=True)

    # -- layer files
    def layer_path(self, key: str) -> Path:
        return self.layers_dir / f"{key}.pack"

    def has(self, key: str) -> bool:
        return self.usable and self.layer_path(key).is_file()

    def load(self, key: str, nbytes: int, validate: Callable[[np.ndarray], None], what: str = "",
             workers: int = 1) -> np.ndarray | None:
        """The verified blob of `key` (of `nbytes`), or None when absent or not valid (then the file is deleted with a
        notice and the caller repacks). `validate` raises ValueError for a blob the backend rejects. `workers`:
        threads for the fingerprint.

        The blob is a copy-on-write memory map of the file's data (HEADER_BYTES = 128 in: 64-byte aligned, as the
        kernels want), used in place as the GGUF file is: its pages are the page cache's, one copy in RAM. Read into
        an anonymous buffer instead, a cached model held its packs twice (the buffer and the file's cached pages), and
        on a machine where the model file, the packs and that second copy do not fit, every warm load read the packs
        from disk again (BF16 8 layers on 24 GB: 15 s of a 25 s load, docs/BENCHMARKS.md). The checksum pass reads
        every page once, so the map is populated before the first forward. The file is replaced only by rename
        (store), never rewritten in place, so a map stays valid when another process evicts or re-stores the key.

        A file engine.preload opened and checked before this load asked (while `import torch` ran) is taken from it:
        the same checks on the same kind of map, made earlier; its header is checked again against `nbytes`."""
        from tessera.engine import preload

        if not self.usable:
            return None
        path = self.layer_path(key)
        try:
            early = preload.take_pack(path)
            if early is not None and not self._header_problem(early.header, key, nbytes, early.size):
                blob = early.blob
            else:
                opened, why = open_checked(path, key, nbytes, workers)
                if opened is None:
                    return self._discard(path, why, what)
                blob = opened.blob
            validate(blob)
        except FileNotFoundError:
            return None  # evicted by another process meanwhile
        except (OSError, ValueError, struct.error) as e:
            return self._discard(path, f"cannot be used ({e})", what)
        return blob

    @staticmethod
    def _header_problem(raw: bytes, key: str, nbytes: int, size: int) -> str:
        if len(raw) < HEADER_BYTES:
            return "is truncated (no header)"
        magic, fmt, header_bytes, blob_bytes, key_bytes, _ = _HEADER.unpack(raw[: _HEADER.size])
        if magic != MAGIC or header_bytes != HEADER_BYTES:
            return "is not a packed-weight file of this version"
        if fmt != FORMAT or key_bytes.rstrip(b"\0") != key.encode()[:32]:
            return "belongs to another key or format"
        if blob_bytes != nbytes or size != HEADER_BYTES + nbytes:
            return f"has {size - HEADER_BYTES} bytes of packed data, {nbytes} expected"
        return ""

    def _discard(self, path: Path, why: str, what: str) -> None:
        subject = f"{what} " if what else ""
        if self.writable:
            path.unlink(missing_ok=True)
            self.notice(f"{subject}{path.name} {why}; discarded, repacking")
        else:
            self.notice(f"{subject}{path.name} {why}; ignored (the folder is read-only), repacking in memory")
        return None

    def store(self, key: str, blob: np.ndarray, between: Callable[[int], bool] | None = None) -> bool:
        """Writes the blob atomically (temporary file, then rename). A full disk or an I/O error costs only the next
        start: said once, then storing stops for this load.

        With `between` (engine.pack_store), the data goes in pieces of _STORE_PIECE bytes, each flushed to the disk
        before the next (at most one piece of dirty pages at a time), and `between(bytes written)` is called before
        each: it may wait, and False abandons the write (the temporary file removed, False returned)."""
        if not (self.writable and self.store_enabled) or (self.admitted is not None and key not in self.admitted):
            return False
        path = self.layer_path(key)
        tmp = _tmp_path(path)
        data = np.ascontiguousarray(blob).view(np.uint8).reshape(-1)
        header = _HEADER.pack(MAGIC, FORMAT, HEADER_BYTES, data.nbytes, key.encode()[:32],
                              fingerprint(data)).ljust(HEADER_BYTES, b"\0")
        step = _STORE_PIECE if between is not None else max(data.nbytes, 1)
        with _writing_lock:
            _writing.add(tmp.name)
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                for start in range(0, data.nbytes, step):
                    if between is not None and not between(start):
                        f.close()
                        tmp.unlink(missing_ok=True)
                        return False
                    f.write(memoryview(data[start:start + step]))
                    if between is not None:
                        os.fdatasync(f.fileno())
            os.replace(tmp, path)
            return True
        except OSError as e:
            tmp.unlink(missing_ok=True)
            self.store_enabled = False
            self.notice(f"cannot store in {self.root} ({e.strerror or e}); this load continues without storing")
            return False
        finally:
            with _writing_lock:
                _writing.discard(tmp.name)

    # -- models, budget, eviction
    def _manifest_path(self, model: str, backend: str) -> Path:
        return self.models_dir / manifest_name(model, backend)

    def models(self) -> list[ModelEntry]:
        """Recorded loads, least recently used first; unreadable manifests are skipped (and removed if writable)."""
        out = []
        if not self.models_dir.is_dir():
            return out
        for p in self.models_dir.glob("*.json"):
            try:
                d = json.loads(p.read_text(encoding="utf-8"))
                keys = [str(k) for k in d["keys"]]
                entry = ModelEntry(p.stem, str(d["model"]), str(d["backend"]), keys, float(d["last_used"]), 0)
            except (OSError, ValueError, KeyError, TypeError, RecursionError):
                if self.writable:
                    p.unlink(missing_ok=True)
                continue
            entry.bytes = sum(_size(self.layer_path(k)) for k in entry.keys)
            out.append(entry)
        return sorted(out, key=lambda m: m.last_used)

    def files(self) -> list[Path]:
        """Every file the cache holds: layer files, manifests, engine.source_digest's records and format-1 folders'
        files."""
        out: list[Path] = []
        for d in (self.layers_dir, self.models_dir, self.root / "sources"):
            if d.is_dir():
                out += [p for p in d.iterdir() if p.is_file()]
        out += [p for d in self._legacy_dirs() for p in d.rglob("*") if p.is_file()]
        return out

    def _legacy_dirs(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [d for d in self.root.iterdir() if d.is_dir() and _LEGACY_DIR.fullmatch(d.name)]

    def held_bytes(self) -> int:
        """Bytes of packed data the budget counts: layer files and format-1 folders (manifests are a few hundred
        bytes each and left out)."""
        layers = sum(_size(p) for p in self.layers_dir.glob("*.pack")) if self.layers_dir.is_dir() else 0
        return layers + sum(_size(p) for d in self._legacy_dirs() for p in d.rglob("*") if p.is_file())

    def budget(self, incoming_model_bytes: int = 0) -> int:
        return self.budget_explained(incoming_model_bytes)[0]

    def budget_explained(self, incoming_model_bytes: int = 0) -> tuple[int, str]:
        """(the budget in bytes, where it comes from, for people). Every byte the cache holds counts as room: a load
        may evict all of it (least recently used first), so the disk share is of free space plus the cache."""
        if self.budget_override is not None:
            return self.budget_override, "set by the caller"
        env = os.environ.get(_BUDGET_ENV)
        if env:
            return parse_size(env, _BUDGET_ENV), f"set by {_BUDGET_ENV}"
        largest = max([incoming_model_bytes] + [m.bytes for m in self.models()])
        free = shutil.disk_usage(self.root).free if self.root.is_dir() else 0
        held = self.held_bytes()
        budget = default_budget(free, held, largest)
        disk = f"{DISK_SHARE:.0%} of {human_bytes(free + held)} (free disk space plus the cache)"
        if budget < MODEL_MULTIPLE * largest:
            return budget, disk
        return budget, f"{MODEL_MULTIPLE} x the largest model, {human_bytes(largest)}; {disk} would allow more"

    def _room_hint(self, model_bytes: int, why: str) -> str:
        """What would make the budget hold `model_bytes`: more free disk space (when the disk share decides it) or
        TESSERA_PACK_CACHE_BUDGET (in GiB, rounded up, as parse_size reads it)."""
        setting = f"set {_BUDGET_ENV}={-(-model_bytes * 10 // 2**30) / 10:.1f}G"
        if why.startswith("set by"):
            return setting
        more = int(model_bytes / DISK_SHARE) - shutil.disk_usage(self.root).free - self.held_bytes()
        return f"free {human_bytes(more)} more disk space on {self.root}'s disk, or {setting}"

    def make_room(self, keys: Iterable[str], sizes: Iterable[int], model: str, backend: str) -> None:
        """Before a load stores its layers: evict least recently used models (never a layer of this load) until the
        cache and the layers still to store fit the budget. A model larger than the whole budget keeps the layers
        that fit, in load order (those load from the cache next time, the others pack at every load; said in a
        notice with what to do): `store` then stores only those."""
        if not self.writable:
            return
        keys, sizes = list(keys), [HEADER_BYTES + n for n in sizes]  # file sizes
        model_bytes = sum(sizes)
        budget, why = self.budget_explained(model_bytes)
        if model_bytes > budget:
            admitted, total = [], 0
            for k, n in zip(keys, sizes):
                if total + n > budget:
                    break
                admitted.append(k)
                total += n
            self.admitted = set(admitted)
            self.notice(f"this model packs to {human_bytes(model_bytes)}, over the cache budget of "
                        f"{human_bytes(budget)} ({why}); caching {len(admitted)} of its {len(keys)} layers "
                        f"({human_bytes(total)}), the other {len(keys) - len(admitted)} are packed again at every "
                        f"load. To cache all of it: {self._room_hint(model_bytes, why)}")
            keys, sizes = admitted, sizes[: len(admitted)]
        incoming = sum(n for k, n in zip(keys, sizes) if not self.layer_path(k).is_file())
        self.evict(budget - incoming, keep=set(keys), keep_model=self._manifest_path(model, backend).stem)

    def evict(self, target: int, *, keep: set[str] = frozenset(), keep_model: str = "") -> list[str]:
        """Removes format-1 folders, then layer files no model refers to, then whole models least recently used
        first, until the cache holds at most `target` bytes. Returns what it removed (names)."""
        removed: list[str] = []
        held = self.held_bytes()
        for d in self._legacy_dirs():
            if held <= target:
                return removed
            held -= sum(_size(p) for p in d.rglob("*") if p.is_file())
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d.name)
        models = self.models()
        referenced = {k for m in models for k in m.keys} | set(keep)
        if self.layers_dir.is_dir():
            for p in sorted(self.layers_dir.glob("*.pack"), key=_mtime):
                if held <= target:
                    return removed
                if p.stem not in referenced:
                    held -= _size(p)
                    p.unlink(missing_ok=True)
                    removed.append(p.name)
        for m in models:  # least recently used first
            if held <= target:
                break
            if m.id == keep_model:
                continue
            still_used = {k for other in models if other is not m and other.id not in removed for k in other.keys}
            for k in m.keys:
                if k not in keep and k not in still_used:
                    held -= _size(self.layer_path(k))
                    self.layer_path(k).unlink(missing_ok=True)
            (self.models_dir / m.path_name).unlink(missing_ok=True)
            removed.append(m.id)
        return removed

    def record(self, model: str, backend: str, keys: list[str]) -> None:
        """Notes this load (its keys and the time: the LRU clock) in models/."""
        if not self.writable:
            return
        path = self._manifest_path(model, backend)
        tmp = _tmp_path(path)
        try:
            tmp.write_text(json.dumps({"model": model, "backend": backend, "keys": keys, "last_used": time.time()}),
                           encoding="utf-8")
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)

    def clear(self) -> int:
        """Removes every file of the cache (layers, manifests, format-1 folders); returns the bytes freed. Files that
        are not the cache's are left alone."""
        freed = 0
        for p in self.files():
            freed += _size(p)
            p.unlink(missing_ok=True)
        for d in self._legacy_dirs():
            shutil.rmtree(d, ignore_errors=True)
        return freed


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _tmp_path(path: Path) -> Path:
    """The temporary file a write of `path` goes through before its rename: one per process and thread, since two
    loads' store threads may write the same pack or manifest at once (a backend switched during a first load)."""
    return path.with_name(f"{path.name}.tmp{os.getpid()}-{threading.get_ident()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
