"""Decode (one query token) over the q8_0 cache at the lengths where the int8 kernels' (AVX512_VNNI, AVX2) blocks,
key splits and rescaling change: 1, 15-17, 31-33 keys, around the split points at 4096 and 8192, 8191; the running max
moving in a late block (the accumulator rescaled there) or never after the first key (no block rescales); pools of 1-3
threads (2 and 3 split the keys differently); NaN-prefilled outputs. Held to test_kv_q8.int8_ok's bound with each
kernel's levels. And the dispatch where the ISA is capped (a fresh process): the AVX2 kernel at TESSERA_MAX_ISA=avx2
(held to its bound), the reference below (against float64)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from test_kv_q8 import KERNELS, LEVELS, filled_cache, int8_ok, naive

from tessera.engine import kv_q8, native
from tessera.engine.kv_cache import KVCache
from tessera.engine.native import make_pool

NH, NKV, HD = 32, 4, 128  # Qwen3-30B-A3B attention: GQA groups of 8 query heads
LENGTHS = [1, 15, 16, 17, 31, 33, 4095, 4096, 4097, 8191, 8192]


def decode(cache, S: int, q: torch.Tensor, threads: int, kernel: str) -> torch.Tensor:
    out = torch.full((1, NH * HD), float("nan"))  # [1, nh*hd]: every element must be written
    native.attention_q8(q, cache.k[0], cache.ks[0], cache.v[0], cache.vs[0], S - 1, HD**-0.5, out, make_pool(threads),
                        kernel=kernel)
    return out


def _skip_unless_runs(kernel: str) -> None:
    if not KERNELS[kernel]:
        pytest.skip(f"no {kernel} q8_0 attention kernel on this CPU")


@pytest.mark.parametrize("kernel", list(LEVELS))
@pytest.mark.parametrize("S", LENGTHS)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_decode_at_block_and_split_edges(S, threads, kernel):
    _skip_unless_runs(kernel)
    cache, keys, values = filled_cache(NKV, HD, S - 1, 1, seed=S)
    q = torch.randn(NH, 1, HD, generator=torch.Generator().manual_seed(S + 1)) * 3  # [nh, 1, hd]
    out = decode(cache, S, q, threads, kernel)
    assert not out.isnan().any()
    ok, why = int8_ok(out, q, keys, values, S - 1, HD**-0.5, HD, LEVELS[kernel])
    assert ok, why


@pytest.mark.parametrize("kernel", list(LEVELS))
@pytest.mark.parametrize("where", ["first", "late", "last"])
@pytest.mark.parametrize("threads", [1, 2])
def test_decode_when_the_max_moves_late_or_never(where, threads, kernel):
    """One key aligned with every query (a score far above the rest) at position 0 (no block after the first moves
    any row's max), in a late block of a split (every row rescales there), or the last key."""
    _skip_unless_runs(kernel)
    S = 4133
    pos = {"first": 0, "late": 3000, "last": S - 1}[where]
    g = torch.Generator().manual_seed(5)
    u = torch.randn(NKV, 1, HD, generator=g)  # [nkv, 1, hd]: each group's queries are near one direction
    q = (u + 0.3 * torch.randn(NKV, NH // NKV, HD, generator=g)).reshape(NH, 1, HD)  # [nh, 1, hd]
    k, v = torch.randn(2, NKV, S, HD, generator=g)  # [nkv, S, hd] each
    k[:, pos] = u[:, 0]  # score ~ |u|^2 / sqrt(hd) ~ 11 against ~N(0, 1) for the other keys
    v[:, pos] += 5.0
    cache = KVCache(1, NKV, HD, S, dtype=torch.int8)
    cache.write(0, k, v)
    keys, values = (kv_q8.dequantize_q8_0(*kv_q8.quantize_q8_0(x)) for x in (k, v))
    out = decode(cache, S, q, threads, kernel)
    assert not out.isnan().any()
    ok, why = int8_ok(out, q, keys, values, S - 1, HD**-0.5, HD, LEVELS[kernel])
    assert ok, why
    w, _ = naive(q, keys, values, S - 1, HD**-0.5)
    assert float(w[:, 0, pos].min()) > 0.3  # the key does dominate (the case tests what it says)


@pytest.mark.parametrize("cap,want", [("avx2", "AVX2"), ("reference", "Reference")])
def test_capped_isa_decodes_with_the_next_kernel(cap, want):
    """TESSERA_MAX_ISA=avx2: the dispatch (attention_q8 with no kernel named, as the decode step calls it) runs the
    AVX2 kernel, held to its int8 bound, and refuses AVX512_VNNI by name; reference: the scalar kernel, float64-close.
    """
    if want == "AVX2" and not KERNELS["AVX2"]:
        pytest.skip("no AVX2 q8_0 attention kernel on this CPU")
    script = textwrap.dedent("""
        import torch
        from test_kv_q8 import LEVELS, filled_cache, int8_ok, naive
        from tessera.engine import native
        from tessera.engine.native import make_pool
        kernel = native.attention_q8_kernel(128)
        print(kernel)
        for S in (1, 17, 33, 300, 4097):
            cache, keys, values = filled_cache(4, 128, S - 1, 1, seed=S)
            q = torch.randn(32, 1, 128, generator=torch.Generator().manual_seed(S)) * 3
            for threads in (1, 2, 3):
                out = torch.full((1, 32 * 128), float("nan"))
                native.attention_q8(q, cache.k[0], cache.ks[0], cache.v[0], cache.vs[0], S - 1, 128**-0.5, out,
                                    make_pool(threads))
                assert not out.isnan().any(), (S, threads)
                if kernel in LEVELS:
                    ok, why = int8_ok(out, q, keys, values, S - 1, 128**-0.5, 128, LEVELS[kernel])
                    assert ok, (S, threads, why)
                    continue
                want = naive(q, keys, values, S - 1, 128**-0.5)[1].transpose(0, 1).reshape(1, -1)
                err = float((out.double() - want).abs().max())
                assert err < 2e-6 * float(values.abs().max()), (S, threads, err)
        try:
            native.attention_q8(q, cache.k[0], cache.ks[0], cache.v[0], cache.vs[0], 0, 1.0, out, make_pool(1),
                                kernel="AVX512_VNNI")
        except ValueError:
            print("capped")
        else:
            print("uncapped")
    """)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TESSERA_MAX_ISA=cap, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [want, "capped"]
