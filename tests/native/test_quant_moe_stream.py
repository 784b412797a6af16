"""The quantized MoE's prefill writes its per-slot results (act [slot, I] and y [slot, H]) with streaming stores once a
pass's buffer reaches 32 MiB (quant_driver.cpp kStreamMinBytes; streaming skips the read a plain store makes of every
line it overwrites). Streaming is data movement only: a pass large enough to stream must give, bit for bit, what the
same tokens give in passes too small to stream. Each (row, token) of the GEMM depends only on that row and that token,
and with every expert busy enough for the GEMM in every slice, the slices take the same kernels as the whole."""

from __future__ import annotations

import numpy as np
import pytest

import tessera.engine.native as N
from tests.native.quant_cases import Q, nmse, quant_isas, random_blocks

E, k, H, I = 4, 2, 2048, 2048
T = 2100  # act and y: 2100 x 2 x 2048 x 4 bytes = 34.4 MB each, above the 32 MiB threshold
SLICE = 300  # 4.9 MB each: below it; ~150 tokens per expert, far above the GEMM threshold
TYPES = (Q.Q4_K, Q.Q4_K, Q.Q6_K)
STREAMING_ISAS = [i for i in quant_isas() if i in ("avx512_vnni", "amx_int8")]  # the emulator: too slow at this size


@pytest.mark.skipif(not STREAMING_ISAS, reason="the streamed prefill is the AVX-512 VNNI / AMX path's")
@pytest.mark.parametrize("isa", STREAMING_ISAS)
def test_a_streamed_pass_equals_unstreamed_slices(pool, isa):
    rng = np.random.default_rng(11)
    gate, up = (random_blocks(t, I, H, rng, lead=(E,)) for t in TYPES[:2])
    down = random_blocks(TYPES[2], H, I, rng, lead=(E,))
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int64)  # [T, k], every expert ~T k / E
    weights = rng.random((T, k)).astype(np.float32)  # [T, k]
    x = rng.standard_normal((T, H)).astype(np.float32)  # [T, H]

    def moe(lo: int, hi: int) -> np.ndarray:
        out = np.full((hi - lo, H), np.nan, np.float32)  # a row left unwritten stays NaN
        N.quant_moe_forward(TYPES[0], gate, TYPES[1], up, TYPES[2], down, ids[lo:hi], weights[lo:hi], x[lo:hi], out,
                            pool, isa)
        return out

    whole = moe(0, T)
    sliced = np.concatenate([moe(t, min(T, t + SLICE)) for t in range(0, T, SLICE)])
    assert np.isfinite(whole).all()
    assert np.array_equal(whole.view(np.uint32), sliced.view(np.uint32))
    # And the values are right, not only equal: a few tokens against Reference.
    ref = np.full((8, H), np.nan, np.float32)
    N.quant_moe_forward(TYPES[0], gate, TYPES[1], up, TYPES[2], down, ids[-8:], weights[-8:], x[-8:], ref, pool,
                        "reference")
    assert nmse(whole[-8:], ref) < 1e-7
