"""From how many tokens a block takes the AVX-512 VNNI quantized GEMM is a runtime knob (tessera/tuning.h
vnni_gemm_min_tokens; 0: the kernels' 12; TESSERA_VNNI_GEMM_MIN_T or a stored calibration set it): quant_isas() reports
the threshold in force, the MoE and quant_matmul follow it (a threshold above every block's tokens gives the mat-vec
path's bits, which differ from the GEMM's), every value stays correct against Reference, and decode never takes the
GEMM (the kernel clamps the knob to >= 2)."""

from __future__ import annotations

import numpy as np
import pytest

import tessera.engine.native as N
from tests.native.quant_cases import Q, matmul, nmse, quant_isas, random_blocks
from tests.native.test_quant_moe_chunk import _case, _moe

KNOB = "vnni_gemm_min_tokens"
pytestmark = pytest.mark.skipif("avx512_vnni" not in quant_isas(), reason="this CPU does not run AVX-512 VNNI")


@pytest.fixture
def knob():
    before = N.tuning()[KNOB]
    yield lambda v: N.set_tuning_knob(KNOB, v)
    N.set_tuning_knob(KNOB, before)


def _threshold() -> int:
    return next(i for i in N.quant_isas() if i["name"] == "avx512_vnni")["gemm_min_tokens"]["Q4_K"]


def test_the_threshold_in_force_is_reported(knob):
    assert N.tuning()[KNOB] == 0 and _threshold() == 12  # the kernels' default
    knob(5)
    assert _threshold() == 5
    knob(1)
    assert _threshold() == 2  # one token is decode: never the GEMM
    with pytest.raises(ValueError, match="vnni_gemm_min_tokens: must be >= 0"):
        N.set_tuning_knob(KNOB, -1)


def test_the_moe_follows_the_threshold(pool, knob):
    raw, ids, weights, x = _case(40)
    gemm = _moe(raw, ids, weights, x, pool, "avx512_vnni")  # default 12: the busy experts take the GEMM
    knob(65)  # above any expert's tokens in a 64-token block: the mat-vec for every expert
    rows = _moe(raw, ids, weights, x, pool, "avx512_vnni")
    assert not np.array_equal(gemm.view(np.uint32), rows.view(np.uint32))
    ref = _moe(raw, ids, weights, x, pool, "reference")
    for value in (2, 3, 8, 24, 65):
        knob(value)
        out = _moe(raw, ids, weights, x, pool, "avx512_vnni")
        assert np.isfinite(out).all() and nmse(out, ref) < 1e-7, value
    assert nmse(rows, ref) < 1e-7


def test_quant_matmul_follows_the_threshold_and_decode_keeps_the_mat_vec(pool, knob):
    rng = np.random.default_rng(9)
    w = random_blocks(Q.Q4_K, 37, 512, rng)
    x = rng.standard_normal((6, 512)).astype(np.float32)  # [6, K]: under the default 12, the mat-vec
    rows = matmul(Q.Q4_K, w, x, pool, "avx512_vnni")
    one = matmul(Q.Q4_K, w, x[:1], pool, "avx512_vnni")
    knob(2)
    gemm = matmul(Q.Q4_K, w, x, pool, "avx512_vnni")
    assert not np.array_equal(gemm.view(np.uint32), rows.view(np.uint32))
    assert nmse(gemm, matmul(Q.Q4_K, w, x, pool, "reference")) < 1e-10
    knob(1)  # clamped to 2: a one-token call keeps the mat-vec, bit for bit
    assert np.array_equal(matmul(Q.Q4_K, w, x[:1], pool, "avx512_vnni").view(np.uint32), one.view(np.uint32))
