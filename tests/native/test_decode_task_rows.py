"""The one-token mat-vecs' task size (tessera/tuning.h decode_rows, quant_kernels.h decode_task_rows): on AVX-512 VNNI
a decode task streams ~256 KiB of blocks (hundreds of rows) instead of 32 rows, because the 32-row tasks streamed
25-35 % slower from memory (docs/BENCHMARKS.md, session 8). The task size changes only which thread reads which
rows: each row's sum is the same bits whatever rows share its call, so every setting must give identical outputs,
and equal quant_matmul (which keeps 32-row tasks at T = 1) bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera.engine.native as N
from tests.native.quant_cases import TYPES, Q, quant_isas, random_blocks

pytestmark = pytest.mark.skipif("avx512_vnni" not in quant_isas(),
                                reason="the direct-read decode kernel is AVX-512 VNNI")

KNOB = "decode_rows"
SETTINGS = (0, 16, 32, 48, 200, 2048)  # 0: the ~256 KiB rule; off the 16-row reduction and the 32-row task too


@pytest.fixture
def knob():
    before = N.set_tuning_knob(KNOB, 0)
    yield lambda v: N.set_tuning_knob(KNOB, v)
    N.set_tuning_knob(KNOB, before)


@pytest.mark.parametrize("K", [768, 2048])
def test_matvec_multi_is_the_same_bits_for_every_task_size(pool, knob, K):
    rng = np.random.default_rng(K)
    # Every type, row counts off every task size above, one of them longer than the largest task.
    spec = list(zip(TYPES, (37, 700, 1, 2085, 96, 5)))
    ws = [random_blocks(t, rows, K, rng) for t, rows in spec]
    types = [t for t, _ in spec]
    x = rng.standard_normal((1, K)).astype(np.float32)
    alone = []
    for t, w in zip(types, ws):
        out = np.full((1, w.shape[0]), np.nan, np.float32)
        N.quant_matmul(t, w, x, out, pool, "avx512_vnni")
        alone.append(out)
    for v in SETTINGS:
        knob(v)
        outs = [np.full((1, w.shape[0]), np.nan, np.float32) for w in ws]
        N.quant_matvec_multi(x, types, ws, outs, pool, "avx512_vnni")
        for t, got, want in zip(types, outs, alone):
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (v, t.name)


@pytest.mark.parametrize("mix", [(Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.Q8_0, Q.Q8_0, Q.Q8_0), (Q.Q4_0, Q.Q5_K, Q.IQ4_XS)])
def test_moe_one_token_is_the_same_bits_for_every_task_size(pool, knob, mix):
    E, k, H, I = 9, 4, 512, 768
    rng = np.random.default_rng(5)
    gate, up = (random_blocks(t, I, H, rng, lead=(E,)) for t in mix[:2])
    down = random_blocks(mix[2], H, I, rng, lead=(E,))
    x = rng.standard_normal((1, H)).astype(np.float32)
    ids = np.array([[7, 0, -1, 3]], np.int64)  # one slot skipped
    weights = rng.random((1, k)).astype(np.float32)
    results = []
    for v in SETTINGS:
        knob(v)
        out = np.full((1, H), np.nan, np.float32)
        N.quant_moe_forward(mix[0], gate, mix[1], up, mix[2], down, ids, weights, x, out, pool, "avx512_vnni")
        results.append(out)
    for v, out in zip(SETTINGS, results):
        assert np.isfinite(out).all() and np.array_equal(out.view(np.uint32), results[0].view(np.uint32)), v


def test_a_negative_value_is_refused(knob):
    with pytest.raises(ValueError, match="decode_rows: must be >= 0"):
        N.set_tuning_knob(KNOB, -1)
