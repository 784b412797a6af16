"""Quantized prefill GEMM (native/src/quant_gemm_avx512.cpp): from 12 tokens per block on AVX-512 VNNI, a row group
runs as a rows x 16-token register GEMM on the decoded rows instead of one mat-vec per token.

Proven here, for every type and every ISA this CPU runs (the others take their mat-vec path, and must agree too):
- every token count from 1 to 70 (1 = decode, 2-11 the mat-vec per token, 12 = the smallest GEMM, 16-token lane
  groups full and ragged, the MoE's 64-token block and the block after it) and 127-129, 255-257, 511-513 (quant_matmul's
  GEMM tasks of 256 tokens on tokens packed once per call, full and ragged), against
  Reference (the same integer dots, double accumulation: NMSE bound 1e-10 as in test_quant_matmul.py) and float64
  on gguf.quants.dequantize's values (2e-4, the int8 activation step; see test_quant_matmul.py), on NaN-prefilled
  outputs that must be overwritten everywhere;
- a (row, token) result does not depend on the rows or tokens that share its call (bit for bit: the lanes and the
  8-row micro-tiles never mix), for 37 rows (one 32-row task, then 5 rows padded to a micro-tile of 8);
- the MoE forward on odd expert counts (7 experts, 3 per token), so each expert gets a ragged number of tokens
  (none, one, a few, more than 64), against Reference and float64 (bounds of test_quant_moe.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera.engine.native as N
from tests.native.quant_cases import (
    K_QUANTS,
    TYPES,
    Q,
    dequantized,
    matmul,
    moe_float64,
    nmse,
    quant_isas,
    random_blocks,
)

ISAS = quant_isas()
T_ALL = (*range(1, 71), 127, 128, 129, 255, 256, 257, 511, 512, 513)


def _K(qtype) -> int:
    """512 for 256-value super-blocks; 416 = 13 blocks of 32 (a partial last 256-value activation block) otherwise."""
    return 512 if qtype in K_QUANTS else 416


_weights: dict = {}


def _case(qtype):
    if qtype not in _weights:
        rng = np.random.default_rng(int(qtype))
        K = _K(qtype)
        w = random_blocks(qtype, 37, K, rng)  # [N, row_bytes]
        x = rng.standard_normal((513, K)).astype(np.float32)
        exact = x.astype(np.float64) @ dequantized(qtype, w).astype(np.float64).T  # [T, N]
        _weights[qtype] = w, x, exact
    return _weights[qtype]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
def test_every_token_count_against_reference_and_float64(pool, isa, qtype):
    w, xs, exact = _case(qtype)
    for T in T_ALL:
        x = xs[:T]
        out = matmul(qtype, w, x, pool, isa)
        assert np.isfinite(out).all(), f"T={T}: not every output written"
        assert nmse(out, exact[:T]) < 2e-4, f"T={T}"
        if isa != "reference":
            ref = matmul(qtype, w, x, pool, "reference")
            assert nmse(out, ref) < 1e-10, f"T={T}"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
def test_result_depends_only_on_its_row_and_token(pool, isa, qtype):
    w, xs, _ = _case(qtype)
    x = xs[:37]
    full = matmul(qtype, w, x, pool, isa)  # [37, 37]
    for t0 in (0, 5, 16, 21):  # the tokens in other lanes of other 16-token groups, 16 at a time (a GEMM call)
        part = matmul(qtype, w, x[t0:t0 + 16], pool, isa)
        assert np.array_equal(full[t0:t0 + 16].view(np.uint32), part.view(np.uint32)), f"tokens {t0}.."
    for n in (0, 7, 8, 31, 32, 36):  # the row alone: first of a micro-tile of zeros
        alone = matmul(qtype, w[n:n + 1], x, pool, isa)
        assert np.array_equal(full[:, n:n + 1].view(np.uint32), alone.view(np.uint32)), f"row {n}"


MIXES = {"q4_k_m": (Q.Q4_K, Q.Q4_K, Q.Q6_K), "q8_0": (Q.Q8_0, Q.Q8_0, Q.Q8_0), "iq4_q5": (Q.IQ4_XS, Q.Q5_K, Q.Q4_0)}
E, k = 7, 3


@pytest.mark.parametrize("T", (1, 2, 3, 5, 9, 17, 40, 100, 257, 513))
@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("isa", ISAS)
def test_moe_odd_experts_against_reference_and_float64(pool, isa, mix, T):
    gt, ut, dt = MIXES[mix]
    H, I = 256, 512
    rng = np.random.default_rng(T + 1000 * sorted(MIXES).index(mix))
    raw = (random_blocks(gt, I, H, rng, lead=(E,)), random_blocks(ut, I, H, rng, lead=(E,)),
           random_blocks(dt, H, I, rng, lead=(E,)))
    deq = tuple(dequantized(t, r) for t, r in zip(MIXES[mix], raw))
    x = rng.standard_normal((T, H)).astype(np.float32)
    p = np.array([0.45, 0.25, 0.12, 0.08, 0.05, 0.03, 0.02])  # skewed routing: expert 0 gets most tokens
    ids = np.stack([rng.choice(E, k, replace=False, p=p) for _ in range(T)]).astype(np.int64)  # [T, k]
    ids[rng.random((T, k)) < 0.1] = -1
    weights = rng.random((T, k)).astype(np.float32)

    def run(which):
        out = np.full(x.shape, np.nan, np.float32)
        N.quant_moe_forward(gt, raw[0], ut, raw[1], dt, raw[2], ids, weights, x, out, pool, which)
        return out

    out = run(isa)
    assert np.isfinite(out).all()
    assert nmse(out, moe_float64(*deq, ids, weights, x)) < 1e-3
    if isa != "reference":
        assert nmse(out, run("reference")) < 1e-7
