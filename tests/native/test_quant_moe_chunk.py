"""The quantized MoE's tokens per pass are a runtime knob (tessera/tuning.h quant_moe_chunk_tokens, set by a stored
calibration or TESSERA_QUANT_MOE_CHUNK_T): the kernel splits a call into passes of that many tokens, so a call with the
knob at c gives, bit for bit, what separate calls on its c-token slices give at the default (each slice one pass), and
on a SIMD ISA something else than the one-pass call (experts' token counts per pass decide GEMM or row path, whose f32
rounding differs), which shows the comparison can fail. Every value stays correct against Reference."""

from __future__ import annotations

import numpy as np
import pytest

import tessera.engine.native as N
from tests.native.quant_cases import Q, nmse, quant_isas, random_blocks

E, k, H, I = 7, 3, 256, 512
TYPES = (Q.Q4_K, Q.Q4_K, Q.Q6_K)
KNOB = "quant_moe_chunk_tokens"


def _case(T: int, seed: int = 5):
    rng = np.random.default_rng(seed)
    raw = (random_blocks(TYPES[0], I, H, rng, lead=(E,)), random_blocks(TYPES[1], I, H, rng, lead=(E,)),
           random_blocks(TYPES[2], H, I, rng, lead=(E,)))
    p = np.array([0.45, 0.25, 0.12, 0.08, 0.05, 0.03, 0.02])  # skewed: a few experts get many tokens
    ids = np.stack([rng.choice(E, k, replace=False, p=p) for _ in range(T)]).astype(np.int64)  # [T, k]
    ids[rng.random((T, k)) < 0.1] = -1
    weights = rng.random((T, k)).astype(np.float32)  # [T, k]
    x = rng.standard_normal((T, H)).astype(np.float32)  # [T, H]
    return raw, ids, weights, x


def _moe(raw, ids, weights, x, pool, isa):
    out = np.full(x.shape, np.nan, np.float32)  # [T, H]: a row the kernel leaves unwritten stays NaN
    N.quant_moe_forward(TYPES[0], raw[0], TYPES[1], raw[1], TYPES[2], raw[2], ids, weights, x, out, pool, isa)
    return out


@pytest.fixture
def knob():
    """Sets the knob for one test and puts the previous value back (the process's other tests see the default)."""
    before = N.tuning()[KNOB]
    yield lambda v: N.set_tuning_knob(KNOB, v)
    N.set_tuning_knob(KNOB, before)


@pytest.mark.parametrize("isa", quant_isas())
def test_the_kernel_passes_the_knobs_token_count(pool, knob, isa):
    T, c = 64, 4
    raw, ids, weights, x = _case(T)
    default = N.tuning()[KNOB]
    assert default == 0  # the kernels' default (2048 tokens): the whole 64-token call is one pass
    one_pass = _moe(raw, ids, weights, x, pool, isa)
    sliced = np.concatenate([_moe(raw, ids[t:t + c], weights[t:t + c], x[t:t + c], pool, isa)
                             for t in range(0, T, c)])
    assert knob(c) == default
    chunked = _moe(raw, ids, weights, x, pool, isa)
    assert np.isfinite(chunked).all()
    assert np.array_equal(chunked.view(np.uint32), sliced.view(np.uint32))
    if isa != "reference":  # one pass takes the GEMM for the busy experts, 4-token passes mostly the row path
        assert not np.array_equal(one_pass.view(np.uint32), sliced.view(np.uint32))
    assert nmse(chunked, _moe(raw, ids, weights, x, pool, "reference")) < 1e-7


@pytest.mark.parametrize("c", (1, 3, 63, 64, 65, 512))
def test_every_chunk_agrees_with_reference(pool, knob, c):
    raw, ids, weights, x = _case(70, seed=c)
    ref = _moe(raw, ids, weights, x, pool, "reference")
    knob(c)
    for isa in quant_isas():
        out = _moe(raw, ids, weights, x, pool, isa)
        assert np.isfinite(out).all() and nmse(out, ref) < 1e-7, isa


def test_bad_values_are_refused(knob):
    with pytest.raises(ValueError, match=r"quant_moe_chunk_tokens: must be >= 0 \(0: the kernels' default, 2048\)"):
        N.set_tuning_knob(KNOB, -1)
