"""engine.huge_pages.empty: torch.empty's contract, 2 MiB alignment, the MADV_HUGEPAGE mark, the mapping's lifetime;
and the KV cache on it storing and reading exactly what it does on ordinary pages."""

import gc
import mmap
import sys

import pytest
import torch
from smaps import mapping_field

from tessera.engine import huge_pages
from tessera.engine.kv_cache import KVCache


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding `address` in /proc/self/smaps."""
    return mapping_field(address, "VmFlags")


@pytest.mark.parametrize("shape,dtype", [((0,), torch.int8), ((3, 5), torch.float32), ((4, 1024, 1024), torch.int8),
                                         ((2, 700, 1000), torch.bfloat16), ((3, 1 << 20), torch.float16)])
def test_empty_is_a_writable_contiguous_tensor_of_the_shape(shape, dtype):
    t = huge_pages.empty(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and t.device.type == "cpu"
    t.fill_(3)
    assert bool((t == 3).all())


def test_large_buffers_start_on_a_huge_page_boundary_and_small_ones_are_plain_torch():
    big = huge_pages.empty((huge_pages.HUGE_PAGE + 1,), torch.int8)
    assert big.data_ptr() % huge_pages.HUGE_PAGE == 0
    small = huge_pages.empty((huge_pages.HUGE_PAGE // 2 - 1, 2), torch.int8)
    assert small.untyped_storage().resizable() and not big.untyped_storage().resizable()  # torch's own allocator


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"),
                    reason="MADV_HUGEPAGE is Linux's")
def test_large_buffers_are_marked_for_huge_pages():
    t = huge_pages.empty((3 * huge_pages.HUGE_PAGE,), torch.int8)
    t.zero_()
    assert "hg" in _vm_flags(t.data_ptr())  # madvise(MADV_HUGEPAGE) applied to the mapping
    assert "sh" not in _vm_flags(t.data_ptr())  # private: shared anonymous memory is shmem, whose THP knob differs


def test_a_view_keeps_the_mapping_alive():
    t = huge_pages.empty((2, huge_pages.HUGE_PAGE), torch.int8)
    t.copy_(torch.arange(2 * huge_pages.HUGE_PAGE).reshape(t.shape) % 101)
    view = t[1, 5:9]
    del t
    gc.collect()
    assert view.tolist() == [(huge_pages.HUGE_PAGE + i) % 101 for i in range(5, 9)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8])
def test_kv_cache_on_huge_pages_holds_what_ordinary_pages_hold(dtype):
    g = torch.Generator().manual_seed(0)
    caches = [KVCache(2, 4, 128, 4096 + 64, dtype=dtype, huge_pages=huge) for huge in (True, False)]
    k, v = torch.randn(4, 100, 128, generator=g), torch.randn(4, 100, 128, generator=g)
    for cache in caches:
        cache.write(1, k, v)
        cache.tokens = list(range(100))
        cache.reserve(9000)  # growth copies into new buffers
    a, b = (c.keys_values(1, 100) for c in caches)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert caches[0].k[1].data_ptr() % huge_pages.HUGE_PAGE == 0


def test_the_kv_cache_is_on_ordinary_pages_unless_asked():
    """Opt-in (engine.huge_pages says why): the default cache's buffers are torch's own."""
    cache = KVCache(1, 4, 128, 8192, dtype=torch.int8)
    assert not cache.huge_pages and cache.k[0].untyped_storage().resizable()
