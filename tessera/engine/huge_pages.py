"""CPU tensors on transparent huge pages, for the buffers a decode step streams from memory (the KV cache).

A decode step at long contexts reads every layer's K/V once. On 4 KiB pages each 4 KiB of K/V is a page of its own:
the hardware prefetchers stop at every page boundary and every page costs a TLB entry (a layer's 8k q8_0 K/V is 2,200
pages, more than the L2 TLB holds after the weights passed through). On 2 MiB pages the same stream crosses a boundary
every 2 MiB. Linux gives an anonymous mapping huge pages where it is marked MADV_HUGEPAGE (the default policy,
"madvise", gives them nowhere else) and a whole aligned 2 MiB of it is touched; torch's allocator marks nothing unless
THP_MEM_ALLOC_ENABLE is set for the whole process.

Opt-in (KVCache(huge_pages=True)), not the default. Measured on Zen 4, 2 cores, 24 GiB (docs/BENCHMARKS.md, issue 16,
2026-12-04 session 7): the decode attention kernel alone reads its 8k K/V ~5 % faster from huge pages, but in the
48-layer Q4_K_M model (18.6 GB mapped in 24 GiB) two of three runs with the cache on huge pages had decode steps of
1.5-3x the usual time in their first rounds, none of three on 4 KiB pages: consistent with the huge pages' direct
compaction migrating (unmapping) pages of the mapped model, which the next steps fault back in. Not shown either way
on a busy machine; kept off until a quiet machine settles it.
"""

from __future__ import annotations

import ctypes
import math
import mmap

import torch

HUGE_PAGE = 2 << 20  # bytes: x86-64's transparent huge page


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """An uninitialised contiguous tensor like torch.empty. On the CPU and at 2 MiB or more, its memory is an anonymous
    mapping aligned to 2 MiB and marked MADV_HUGEPAGE (where the OS has the call): huge pages as the pages are first
    touched, if the kernel has them to give (else ordinary pages, nothing fails). The mapping lives as long as the
    tensor (and any view of it) does."""
    device = torch.device(device)
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype, device=device)
    # Private and anonymous (mmap's default for -1 is a shared /dev/zero map: shmem, whose huge pages another knob
    # governs), zero-filled on touch; one spare huge page to align the start in.
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    offset = -address % HUGE_PAGE
    try:
        region.madvise(mmap.MADV_HUGEPAGE, offset, nbytes)  # offset: whole 4 KiB pages (mmap's address is one)
    except OSError:  # a kernel without transparent huge pages: ordinary pages
        pass
    flat = torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=offset)  # holds `region`
    return flat.view(dtype).view(shape)
