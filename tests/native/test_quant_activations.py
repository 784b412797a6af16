"""The quantized kernels' activation scheme, pinned against an independent numpy model of llama.cpp's Q8_K: per token,
blocks of 256 values (the last block of a row whose K is not a multiple of 256 holds the K % 256 values left), f32
scale d = max|x| / 127, int8 q = round-half-even(x * (1 / d)) clamped to +-127.

With x replaced by its quantized value q * d, the kernels' product is exact up to f32 rounding: the weights'
f32 scales (d * sc and d * m are exact f32 products of an f16 and a 6/8-bit integer), integer dots exact in int32, and
only the f32 accumulation (Reference: double) and the f32 products dx * sum(q) round, relative ~1e-7 per term: NMSE
~1e-14. Bound 1e-9. The control below shows the bound separates schemes: llama.cpp's Q8_0 activations (one scale per
32 values) differ from Q8_K's by NMSE ~1e-5 on the same data, four orders of magnitude above it.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera.engine.native as N
from tests.native.quant_cases import K_QUANTS, TYPES, dequantized, nmse, quant_isas, random_blocks

NMSE_SAME_SCHEME = 1e-9


def quantized_activations(x: np.ndarray, block: int) -> np.ndarray:
    """x [T, K] float32 -> q * d as float64, per `block` values (the last block may be shorter), f32 arithmetic."""
    out = np.empty(x.shape, np.float64)
    for b0 in range(0, x.shape[1], block):
        xb = x[:, b0:b0 + block].astype(np.float32)
        d = (np.abs(xb).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
        inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
        q = np.clip(np.rint(xb * inv), -127, 127)  # np.rint: round half to even, as nearbyint
        out[:, b0:b0 + block] = q.astype(np.float64) * d.astype(np.float64)
    return out


def _K(qtype) -> int:
    """768 for super-block types; 416 = one block of 256 and one of 160 for Q4_0/Q8_0."""
    return 768 if qtype in K_QUANTS else 416


@pytest.mark.parametrize("T", (1, 3, 70))
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", quant_isas())
def test_matmul_is_q8k_activations_times_exact_weights(pool, isa, qtype, T):
    rng = np.random.default_rng(100 * int(qtype) + T)
    N_rows, K = 21, _K(qtype)
    w = random_blocks(qtype, N_rows, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[:, 5] *= 40.0  # one outlier: its block's step is coarse, the other blocks' are not
    expected = quantized_activations(x, 256) @ dequantized(qtype, w).astype(np.float64).T
    out = np.full((T, N_rows), np.nan, np.float32)
    N.quant_matmul(qtype, w, x, out, pool, isa)
    assert nmse(out, expected) < NMSE_SAME_SCHEME


def test_the_bound_separates_activation_schemes():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 768)).astype(np.float32)
    x[:, 5] *= 40.0
    w = rng.standard_normal((21, 768))
    per_256, per_32 = quantized_activations(x, 256) @ w.T, quantized_activations(x, 32) @ w.T
    assert nmse(per_32, per_256) > 1e3 * NMSE_SAME_SCHEME
