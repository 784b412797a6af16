"""The C heap's policy for inference: freed blocks kept for the next layer, handed back to the OS between requests.

A prefill chunk allocates the same temporaries in every layer: torch's [T, H] hidden states, q/k/v, the attention
output, the norms' and residual adds' results (PREFILL_CHUNK = 2048 tokens: 16-32 MiB each, ~200 MiB a layer). glibc
serves blocks from 32 MiB up (its largest dynamic mmap threshold) with a fresh mmap and unmaps them on free, and
trims the heap's top as soon as more than twice its threshold is free, so every layer took its temporaries as new
pages again: a page fault and a zeroed page per 4 KiB, ~50 K faults a layer at 4096 tokens, 7 ms per 32 MiB against
1.2 ms for a reused block (docs/BENCHMARKS.md, session 20). `keep_freed_blocks` raises both thresholds to
KEEP_BYTES, so blocks up to that size come from the heap and stay there when freed. `give_back` (malloc_trim) returns
every whole free page to the OS; a load, a request and a session's close end with it, so kept blocks live across
the layers of one request and no longer. Larger blocks (the KV cache of a long context, packed weights) are still
mapped and unmapped on their own.

glibc only (Linux): elsewhere both calls do nothing and say so by returning False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
import threading

KEEP_BYTES = 256 << 20  # above every prefill temporary (a 2048-token chunk's largest is 32 MiB at Qwen3-235B's widths)

# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_kept = False


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc's malloc interface in this process, or None (another C library, another OS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        version = libc.gnu_get_libc_version  # glibc's own symbol: musl has mallopt's name but not its parameters
        version.restype = ctypes.c_char_p
        version()
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None


def keep_freed_blocks() -> bool:
    """Blocks up to KEEP_BYTES stay in the heap when freed (process-wide, once). True where glibc took the setting."""
    global _kept
    with _lock:
        if _kept:
            return True
        libc = _glibc()
        if libc is None:
            return False
        # the mmap threshold first: setting it fixes both thresholds (glibc stops adjusting them dynamically)
        _kept = bool(libc.mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))
        return _kept


def give_back() -> bool:
    """Return the heap's free whole pages to the OS (malloc_trim(0)). True where some memory was released."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
