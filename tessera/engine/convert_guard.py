"""What a conversion may write: never over an existing file unless asked (`--force`), never over a file of the model it
reads, and never leaving the temporary files of an earlier, killed conversion behind.

gguf_writer.write_gguf writes `.<name>.<pid>.partial` beside the output and renames it into place when complete; a
conversion killed by SIGKILL or a power cut cannot remove its own, so the next conversion to the same folder does.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tessera.engine.errors import TesseraError

_PARTIAL = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.partial$")


def check_output(src: str | os.PathLike, out: str | os.PathLike, *, force: bool = False) -> Path:
    """The output path, or a TesseraError naming it: a folder, a file inside the source model's folder that exists
    (even with force: the source must survive), the source folder itself or one of its files reached another way
    (symlink, hard link), or an existing file without force."""
    out = Path(out)
    src = Path(src)
    if out.is_dir():
        raise TesseraError(str(out), "is a folder; give the path of the .gguf file to write")
    if out.exists() or out.is_symlink():
        if _is_source_file(src, out):
            raise TesseraError(str(out), f"is a file of the model being converted ({src}); choose another output")
        if not out.is_file():
            raise TesseraError(str(out), "exists and is not a regular file; choose another output")
        if not force:
            raise TesseraError(str(out), "already exists; pass --force to replace it")
    return out


def _is_source_file(src: Path, out: Path) -> bool:
    try:
        real_out = out.resolve()
        real_src = src.resolve()
    except (OSError, RuntimeError):
        return True  # a symlink loop: do not write through it
    if real_src == real_out or real_src in real_out.parents:
        return True
    if not src.is_dir():
        return False
    try:
        return any(f.is_file() and os.path.samefile(f, out) for f in src.iterdir())
    except OSError:
        return False


def sweep_partials(out: str | os.PathLike) -> list[Path]:
    """Removes `.<out name>.<pid>.partial` files in the output's folder whose process is gone; returns them."""
    out = Path(out)
    removed = []
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _PARTIAL.match(p.name)
        if not m or m.group("name") != out.name or _alive(int(m.group("pid"))):
            continue
        try:
            p.unlink()
            removed.append(p)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftover from an earlier attempt in this process cannot still be writing
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
