"""Quantized prefill tiles: the kernels run several rows over a block of tokens at once (AVX-512 below 12 tokens: a
row at a time, its tokens in register-held chunks of up to 8; from 12 the GEMM of test_quant_gemm.py; AVX2: each (row,
token) read from the blocks, its GEMM from 2-4 tokens by type).
That grouping must change nothing: every (row, token) result is bit-identical whether its row runs paired or alone
(at T = 1 too: decode keeps each row's vector sums and reduces 16 rows at a time), for ragged token counts
(T = 5, 13, 37: not a multiple of any tile; 37 = two 16-token sum passes + 5), and, for the
256-value super-block types, to running that token by itself (T = 1, the decode path: same integer dot, same f32
steps in the same order; where the GEMM of test_quant_gemm.py runs, within NMSE 1e-10 instead). Block-32 types
(Q4_0, Q8_0) fold the token's scale into the weights' at T = 1, a different f32 rounding order, so for them only the
row grouping is checked bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera.engine.native as N
from tests.native.quant_cases import K_QUANTS, TYPES, matmul, nmse, quant_isas, random_blocks

ISAS = quant_isas()
# {isa: {type name: n}}: token blocks of n tokens and more take the GEMM of test_quant_gemm.py (0: none), as the
# kernels choose (AVX-512 VNNI from 12; AVX2 per type, or TESSERA_AVX2_GEMM_MIN_T).
GEMM_MIN_TOKENS = {i["name"]: i["gemm_min_tokens"] for i in N.quant_isas()}


def _K(qtype) -> int:
    return 768 if qtype in K_QUANTS else 416


@pytest.mark.parametrize("T", (1, 5, 13, 37))  # T = 1: decode, whose rows are reduced 16 at a time
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
def test_row_grouping_is_bit_exact(pool, isa, qtype, T):
    rng = np.random.default_rng(31 * int(qtype) + T)
    N_rows, K = 37, _K(qtype)  # 37 = one 32-row task (16 pairs) + 5 rows (2 pairs + a lone row)
    w = random_blocks(qtype, N_rows, K, rng)  # [N, row_bytes]
    x = rng.standard_normal((T, K)).astype(np.float32)
    full = matmul(qtype, w, x, pool, isa)
    assert np.isfinite(full).all()
    for n in (0, 1, 17, 32, 35, 36):
        alone = matmul(qtype, w[n:n + 1], x, pool, isa)  # [T, 1]: the one-row path
        assert np.array_equal(full[:, n:n + 1].view(np.uint32), alone.view(np.uint32)), f"row {n}"
    pair = matmul(qtype, w[35:37], x, pool, isa)  # rows 35, 36 as a pair (in `full` 36 ran alone)
    assert np.array_equal(full[:, 35:37].view(np.uint32), pair.view(np.uint32))


@pytest.mark.parametrize("T", (5, 13, 37))
@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
def test_token_tile_equals_one_token_at_a_time(pool, isa, qtype, T):
    rng = np.random.default_rng(77 * int(qtype) + T)
    N_rows, K = 37, _K(qtype)
    w = random_blocks(qtype, N_rows, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    full = matmul(qtype, w, x, pool, isa)
    n_gemm = GEMM_MIN_TOKENS[isa][qtype.name]
    gemm = 0 < n_gemm <= T  # test_quant_gemm.py: other f32 order, same integer dots (never at T = 1: decode)
    for t in range(T):
        one = matmul(qtype, w, x[t:t + 1], pool, isa)  # [1, N]: decode
        if gemm:
            assert nmse(full[t:t + 1], one) < 1e-10, f"token {t}"
        else:
            assert np.array_equal(full[t:t + 1].view(np.uint32), one.view(np.uint32)), f"token {t}"


@pytest.mark.parametrize("T", (2, 8, 9, 11, 17, 64))  # 1, 2 (9 = 5 + 4, 11 = 6 + 5, 17 = 6 + 6 + 5) and 8 chunks
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_short_blocks_in_register_chunks_are_bit_exact(pool, qtype, T):
    """AVX-512 VNNI runs a short token block's tokens in chunks of at most 8 held in registers, split as evenly as
    they come (short_block in quant_avx512_vnni.cpp). With the GEMM threshold above the block, every chunking must
    give each token the bits it gets alone: the decode path's for the super-block types, and for the block-32 types
    (whose T = 1 path folds the token's scale differently) the bits of the same token in a block of one other size."""
    if "avx512_vnni" not in ISAS:
        pytest.skip("this CPU does not run AVX-512 VNNI")
    before = N.tuning()["vnni_gemm_min_tokens"]
    N.set_tuning_knob("vnni_gemm_min_tokens", 65)  # every block of up to 64 tokens takes the short path
    try:
        rng = np.random.default_rng(5 * int(qtype) + T)
        N_rows, K = 37, _K(qtype)
        w = random_blocks(qtype, N_rows, K, rng)
        x = rng.standard_normal((T, K)).astype(np.float32)
        full = matmul(qtype, w, x, pool, "avx512_vnni")
        assert np.isfinite(full).all()
        if qtype in K_QUANTS:
            for t in range(T):
                one = matmul(qtype, w, x[t:t + 1], pool, "avx512_vnni")
                assert np.array_equal(full[t:t + 1].view(np.uint32), one.view(np.uint32)), f"token {t}"
        else:  # the block's tokens again in a block of 3 (one chunk): the same bits
            for t0 in range(0, T - 2, 3):
                three = matmul(qtype, w, x[t0:t0 + 3], pool, "avx512_vnni")
                assert np.array_equal(full[t0:t0 + 3].view(np.uint32), three.view(np.uint32)), f"tokens {t0}.."
        ref = matmul(qtype, w, x, pool, "reference")
        assert nmse(full, ref) < 1e-10
    finally:
        N.set_tuning_knob("vnni_gemm_min_tokens", before)
