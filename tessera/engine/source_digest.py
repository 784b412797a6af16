"""The content digests of expert layers read in place from a model file, remembered by the file's identity, so the
packed-weight cache finds its keys without hashing an unchanged file again at every load.

engine.pack_cache keys a packed layer by a SHA-256 over the bytes it packs (`layer_digest`). For a BF16 GGUF that is
the whole expert payload: ~10.6 GB for the 8-layer Qwen3-30B-A3B-shaped file, 3-4 s on 2 cores at every warm load,
most of the time that load took (docs/BENCHMARKS.md, "BF16 warm load"). The key must still change with the content
(issue 12 item 5), so the digest is not dropped: it is computed once per file version and kept in a record here.

Which file version: engine.scale_record's identity rule, reused as is (resolved path, device, inode, size, mtime_ns
and ctime_ns of every part, taken by fstat of the file handle the map was made from). ctime is set by the kernel on
every write and cannot be set back from user space, so a file replaced, edited in place, truncated or moved gets
another identity, hence another record, hence a fresh digest and the keys of its new content. A file changed less than
scale_record.RACY_SECONDS before it was opened is not recorded (its timestamps might not yet show a second edit).

What a record holds: for each layer, where its three expert tensors lie in the file (part, byte offset, shape, type:
the "span") and the layer_digest of those bytes. A digest is only looked up for tensors that are contiguous views of
the very map the file was opened as (their addresses fall inside it); anything else (an HF checkpoint's stacked
copies, tensors built in memory) is hashed at every load, as before. DIGEST_VERSION names layer_digest's definition:
a record of another version does not count.

Two loads of one file version at once (a backend switched while the first load's job, engine.deferred_keys, still
hashes behind it: Session.set_backend builds the new backend before it closes the old) hash each layer once: a
digest being computed in this process is waited for, not computed again, and one computed is kept for the process
(`_InProcess`; only for versions that will be recorded).

Layout: one JSON file per model version under the packed-weight cache's `sources/` folder, named by a hash of the
identities; a record whose files are gone or changed is removed when a new one is written. A folder that cannot be
read or written only costs the speed-up.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from tessera.engine import scale_record
from tessera.engine.quantized import QuantizedTensor

DIGEST_VERSION = 1  # of pack_cache.layer_digest (a tree of per-expert SHA-256 leaves over shapes, types and bytes)
FOLDER = "sources"  # under the packed-weight cache's root


@dataclass(frozen=True)
class SourceFile:
    """One part of a model file as it was opened and mapped."""

    identity: dict  # scale_record.identity at open
    opened_at: float  # time.time() when it was opened
    start: int  # address of the map's first byte
    nbytes: int  # bytes mapped (the whole file)


def gguf_sources(gguf) -> tuple[SourceFile, ...]:
    """The parts of an open engine.gguf_reader.GGUFModel; () when a part is closed (no map)."""
    out = []
    for part in gguf.files:
        mapped = part.mapping
        if mapped is None:
            return ()
        out.append(SourceFile(scale_record.identity(part.path, part.stat), part.opened_at, int(mapped.ctypes.data),
                              int(mapped.nbytes)))
    return tuple(out)


def _address(t) -> tuple[int, int] | None:
    """(address, bytes) of a tensor's data when it is one contiguous run of memory, else None. A QuantizedTensor is
    read through its raw blocks (uint8 numpy)."""
    if isinstance(t, QuantizedTensor):
        raw = t.raw  # [E, R, row bytes] uint8
        return (int(raw.ctypes.data), int(raw.nbytes)) if raw.flags.c_contiguous else None
    if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.is_contiguous():
        return int(t.data_ptr()), int(t.numel() * t.element_size())
    return None


def part_of(address: int, n: int, files: Sequence[SourceFile]) -> int | None:
    """The index of the map in `files` that holds all of [address, address + n), or None."""
    return next((i for i, f in enumerate(files) if f.start <= address and address + n <= f.start + f.nbytes), None)


def mapped_run(t, files: Sequence[SourceFile]) -> tuple[int, int] | None:
    """(address, bytes) of tensor `t` when it is one contiguous run inside one of the maps `files`, else None."""
    where = _address(t)
    return where if where is not None and part_of(*where, files) is not None else None


def layer_span(experts, files: Sequence[SourceFile]) -> str | None:
    """Where gate, up and down of one layer lie in `files`: a text key ("part:offset:shape:type" each), or None when
    any of them is not a contiguous view of one of the maps."""
    out = []
    for t in (experts.gate_proj, experts.up_proj, experts.down_proj):
        where = _address(t)
        if where is None:
            return None
        address, n = where
        part = part_of(address, n, files)
        if part is None:
            return None
        kind = t.qtype.name if isinstance(t, QuantizedTensor) else str(t.dtype)
        out.append(f"{part}:{address - files[part].start}:{'x'.join(map(str, t.shape))}:{kind}")
    return "|".join(out)


class _InProcess:
    """The digests computed in this process, by (record, span), and those being computed now: `get` returns one
    computed already, waits for one another thread is computing, or computes it. A computation that fails (a job
    skipped, an error) leaves nothing: a waiter then computes it itself."""

    def __init__(self):
        self._lock = threading.Lock()
        self._done: dict[tuple[str, str], bytes] = {}  # tiny (a digest a layer), kept for the process
        self._running: dict[tuple[str, str], threading.Event] = {}

    def get(self, key: tuple[str, str], compute: Callable[[], bytes],
            poll: Callable[[], None] | None = None) -> bytes:
        """The digest. A caller with `poll` waits for another thread computing it, calling `poll` four times a second
        (a pack-store job's gate: it waits while a request generates, raises once the job is skipped); one without
        (a load on its own thread, which must not wait on a job that pauses while requests generate) computes it."""
        while True:
            with self._lock:
                if key in self._done:
                    return self._done[key]
                running = self._running.get(key)
                if running is None:
                    running = self._running[key] = threading.Event()
                    break
            if poll is None:
                return compute()
            while not running.wait(0.25):
                poll()
        try:
            value = compute()
            with self._lock:
                self._done[key] = value
            return value
        finally:
            with self._lock:
                del self._running[key]
            running.set()


_in_process = _InProcess()


class DigestRecord:
    """The remembered layer digests of one model version (its parts' identities). `digest(experts, compute)` returns
    the recorded digest of the layer's span, or computes it (and remembers it for `save`); `known` only looks."""

    def __init__(self, folder: str | os.PathLike, files: Sequence[SourceFile]):
        self.folder = Path(folder)
        self.files = tuple(files)
        self.parts = [f.identity for f in self.files]
        self.path = self.folder / _record_name(self.parts)
        self.digests: dict[str, str] = self._read()
        self.added = 0  # digests computed by this load (save writes them)
        self.reused = 0  # digests taken from the record

    def _read(self) -> dict[str, str]:
        try:
            d = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(d, dict) or d.get("version") != DIGEST_VERSION or d.get("parts") != self.parts:
            return {}
        layers = d.get("layers")
        if not isinstance(layers, dict):
            return {}
        return {str(k): str(v) for k, v in layers.items() if isinstance(v, str) and len(v) == 64}

    def known(self, experts) -> bytes | None:
        """The recorded digest of the layer's span, without computing anything; None when there is none."""
        span = layer_span(experts, self.files) if self.files else None
        if span is not None and span in self.digests:
            try:
                return bytes.fromhex(self.digests[span])
            except ValueError:
                pass
        return None

    def can_record(self, experts) -> bool:
        """Whether a digest of this layer would be remembered (its tensors are views of the file's map)."""
        return bool(self.files) and layer_span(experts, self.files) is not None

    def digest(self, experts, compute: Callable[[], bytes], poll: Callable[[], None] | None = None) -> bytes:
        """The layer's digest: from the record, from this process (computed by another load of the same version,
        or waited for while it computes: `poll` as in _InProcess.get), or computed now."""
        value = self.known(experts)
        if value is not None:
            self.reused += 1
            return value
        span = layer_span(experts, self.files) if self.files else None
        if span is None:
            return compute()
        if self.recordable():
            value = _in_process.get((str(self.path), span), compute, poll)
        else:  # a file changed just before it was opened: its digest is not trusted beyond this load
            value = compute()
        self.digests[span] = value.hex()
        self.added += 1
        return value

    def recordable(self) -> bool:
        """Whether digests computed now could be recorded: a file, none of whose parts changed within
        scale_record.RACY_SECONDS of being opened (its timestamps might hide a second edit)."""
        if not self.files:
            return False
        opened = min(f.opened_at for f in self.files)
        return all(opened - p["ctime_ns"] / 1e9 >= scale_record.RACY_SECONDS for p in self.parts)

    def save(self) -> bool:
        """Writes the record when this load computed digests, unless it is not `recordable` or the folder cannot be
        written."""
        if not self.added or not self.recordable():
            return False
        # one temporary file per writing thread: two loads' jobs of one version save the same record at once
        tmp = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}-{threading.get_ident()}")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"version": DIGEST_VERSION, "parts": self.parts, "layers": self.digests,
                                       "saved_at": time.time()}), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            return False
        prune(self.folder)
        return True


def _record_name(parts: list[dict]) -> str:
    what = json.dumps({"version": DIGEST_VERSION, "parts": parts}, sort_keys=True)
    return hashlib.sha256(what.encode()).hexdigest()[:40] + ".json"


def prune(folder: str | os.PathLike) -> int:
    """Removes records whose files are gone or changed, of another version, or unreadable; returns how many."""
    return scale_record.prune_records(folder, "version", DIGEST_VERSION)
