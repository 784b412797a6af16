"""The quantized prefill keeps its scratch (quantized activations, packed tokens, the MoE's per-slot act and y) from
call to call on the calling thread (quant_driver.cpp `grown`): a call must give the same bits whatever ran before it.
Each case runs a call, then a larger call with other data (which fills every buffer with its own values), then the
first call again: the repeat must equal the first run bit for bit, and be finite (the output starts as NaN, so a row
the kernel left unwritten would show). Masked slots (id -1) and experts without tokens are where a stale value could
be read, so the MoE case has both; each case runs on every quantized ISA this machine has and on two threads."""

from __future__ import annotations

import numpy as np
import pytest

import tessera.engine.native as N
from tests.native.quant_cases import Q, quant_isas, random_blocks

E, k, H, I = 9, 3, 256, 512
TYPES = (Q.Q4_K, Q.Q4_K, Q.Q6_K)


def _experts(rng):
    return (random_blocks(TYPES[0], I, H, rng, lead=(E,)), random_blocks(TYPES[1], I, H, rng, lead=(E,)),
            random_blocks(TYPES[2], H, I, rng, lead=(E,)))


def _routing(T: int, rng, masked: float):
    ids = np.stack([rng.choice(E - 2, k, replace=False) for _ in range(T)]).astype(np.int64)  # experts 7, 8: idle
    ids[rng.random((T, k)) < masked] = -1
    return ids, rng.random((T, k)).astype(np.float32), rng.standard_normal((T, H)).astype(np.float32)


def _moe(raw, ids, weights, x, pool, isa):
    out = np.full(x.shape, np.nan, np.float32)  # [T, H]
    N.quant_moe_forward(TYPES[0], raw[0], TYPES[1], raw[1], TYPES[2], raw[2], ids, weights, x, out, pool, isa)
    return out


def _same_bits(a, b) -> bool:
    return np.isfinite(a).all() and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("isa", quant_isas())
@pytest.mark.parametrize("T", (1, 5, 40))
def test_moe_call_is_unchanged_by_a_larger_call_before_it(pool, isa, T):
    rng = np.random.default_rng(T)
    raw = _experts(rng)
    first = _routing(T, rng, masked=0.3)
    other = _routing(3 * T + 17, rng, masked=0.0)  # larger, every slot used: writes all of act and y it reaches
    before = _moe(raw, *first, pool, isa)
    _moe(raw, *other, pool, isa)
    assert _same_bits(_moe(raw, *first, pool, isa), before)


@pytest.mark.parametrize("isa", quant_isas())
@pytest.mark.parametrize("T", (2, 13, 70))
def test_matmul_call_is_unchanged_by_a_larger_call_before_it(pool, isa, T):
    rng = np.random.default_rng(100 + T)
    w = random_blocks(Q.Q4_K, 96, H, rng)
    x = rng.standard_normal((T, H)).astype(np.float32)
    big = rng.standard_normal((4 * T + 33, H)).astype(np.float32) * 50.0

    def run(x_):
        out = np.full((x_.shape[0], 96), np.nan, np.float32)
        N.quant_matmul(Q.Q4_K, w, x_, out, pool, isa)
        return out

    before = run(x)
    run(big)
    assert _same_bits(run(x), before)
