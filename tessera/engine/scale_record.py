"""Which GGUF files already passed the block-scale check, so a file checked before is not read end to end again.

The NaN/Inf scale check (engine.quantized.check_scales) has to touch every page of a quantized file: one f16 scale
sits in every 34-210 byte block. At 48 layers (18.6 GB) that is 1.5 s with the file in the page cache and the whole
cold read (~12 s) without it, before the first token. A file whose check passed gets a record here, and the next load
of the *same, unchanged* file skips the scan. File content stays untrusted input: a file that is new, replaced,
edited, moved, or whose identity cannot be read is checked again.

Identity (all of it must match): the resolved path, device, inode, size, mtime_ns and ctime_ns of every part (a split
model has several), and CHECK_VERSION (bumped when the check itself changes). ctime is set by the kernel on every
write and cannot be set back from user space (`touch -d` restores mtime, not ctime), so an edit in place that keeps
size and mtime still changes the identity. As git does for its index ("racy git"), a file changed less than
RACY_SECONDS before it was opened is not recorded: file timestamps tick at the kernel's coarse clock, so a second edit
within the same tick as the check could otherwise keep every field.

Layout: one small JSON file per checked model under `default_folder()` (<user cache dir>/tessera/checked-scales),
named by a hash of the identity and holding it, so `prune()` can drop records of files that are gone or changed.
A folder that cannot be read or written only costs the speed-up: the check runs as if no record existed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

CHECK_VERSION = 1  # of engine.quantized.check_scales: a record made by another version does not count
RACY_SECONDS = 2.0  # a file changed this recently before it was opened is checked again next time
_FIELDS = ("dev", "ino", "size", "mtime_ns", "ctime_ns")


def default_folder() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("tessera")) / "checked-scales"


def identity(path: str | os.PathLike[str], st: os.stat_result) -> dict:
    """One file's identity as recorded: resolved path and the stat fields that change with its content."""
    return {"path": str(Path(path).resolve()), "dev": st.st_dev, "ino": st.st_ino, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _record_name(parts: list[dict]) -> str:
    what = json.dumps({"check": CHECK_VERSION, "parts": parts}, sort_keys=True)
    return hashlib.sha256(what.encode()).hexdigest()[:40] + ".json"


def is_checked(parts: list[dict], folder: Path | None = None) -> bool:
    """Whether a model with these parts' identities (taken when they were opened) passed the check before."""
    if not parts:
        return False
    path = (folder or default_folder()) / _record_name(parts)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and d.get("check") == CHECK_VERSION and d.get("parts") == parts


def mark_checked(parts: list[dict], opened_at: float, folder: Path | None = None) -> bool:
    """Record that every quantized tensor of these parts passed the check. Not recorded (False) when a part changed
    within RACY_SECONDS of `opened_at` (time.time() when it was opened) or the folder cannot be written."""
    if not parts or any(opened_at - p["ctime_ns"] / 1e9 < RACY_SECONDS for p in parts):
        return False
    folder = folder or default_folder()
    path = folder / _record_name(parts)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"check": CHECK_VERSION, "parts": parts, "checked_at": time.time()}),
                       encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # no folder to hold it (a file in its place)
            pass
        return False
    prune(folder)
    return True


def prune(folder: Path | None = None) -> int:
    """Removes records whose files are gone or changed (and unreadable ones); returns how many."""
    return prune_records(folder or default_folder(), "check", CHECK_VERSION)


def prune_records(folder: str | os.PathLike[str], version_key: str, version: int) -> int:
    """Removes the JSON records in `folder` (each {version_key: ..., "parts": [identity, ...]}) that are of another
    version, unreadable, or whose parts' files are gone or changed; returns how many. Shared by every store keyed by
    file identities (this one, engine.source_digest)."""
    removed = 0
    try:
        records = list(Path(folder).glob("*.json"))
    except OSError:
        return 0
    for rec in records:
        try:
            d = json.loads(rec.read_text(encoding="utf-8"))
            stale = d.get(version_key) != version or not all(_unchanged(p) for p in d["parts"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            stale = True
        if stale:
            try:
                rec.unlink()
                removed += 1
            except OSError:
                pass
    return removed


def clear(folder: Path | None = None) -> int:
    """Removes every record (each file is checked again at its next load); returns how many."""
    folder = folder or default_folder()
    removed = 0
    for rec in folder.glob("*.json") if folder.is_dir() else ():
        rec.unlink(missing_ok=True)
        removed += 1
    return removed


def _unchanged(part: dict) -> bool:
    try:
        return identity(part["path"], os.stat(part["path"])) == part
    except OSError:
        return False
