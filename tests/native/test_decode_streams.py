"""The decode mat-vecs that read the blocks directly (AVX-512 VNNI, AVX2) read a call's rows as one or two sequential
streams per thread (tessera/tuning.h decode_streams; 0: the CPU's default, Intel 2, others 1; TESSERA_DECODE_STREAMS
or a stored calibration set it). Two streams cut the rows in halves and take a row (AVX-512: a super-block) of each in
turn: every row is written, each row's sums run in the same order, so the results are the same bits as one stream's,
for every type, row count (odd, under and over a row group) and the MoE decode; and they stay correct against float64
on the dequantized weights."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tessera.engine.native as N
from tests.native.quant_cases import TYPES, dequantized, matmul, nmse, quant_isas, random_blocks
from tests.native.test_quant_moe_chunk import _case, _moe

KNOB = "decode_streams"
ISAS = [i for i in quant_isas() if i in ("amx_int8", "avx512_vnni", "avx2")]  # amx_int8 decodes on the VNNI mat-vec
pytestmark = pytest.mark.skipif(not ISAS, reason="this CPU runs no SIMD quantized kernels")
ROWS = (1, 2, 3, 31, 32, 33, 63, 65, 100, 257)  # kRowGroup is 32: halves of whole row groups, odd tails


@pytest.fixture
def knob():
    before = N.tuning()[KNOB]
    yield lambda v: N.set_tuning_knob(KNOB, v)
    N.set_tuning_knob(KNOB, before)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
def test_two_streams_give_one_streams_bits(pool, knob, qtype, isa):
    K = 512
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((1, K)).astype(np.float32)  # [1, K]: one token, decode
    outs, refs = [], []
    for R in ROWS:
        w = random_blocks(qtype, R, K, rng)  # [R, row_bytes]
        knob(1)
        one = matmul(qtype, w, x, pool, isa)  # [1, R], NaN where a row was never written
        knob(2)
        two = matmul(qtype, w, x, pool, isa)
        assert not np.isnan(two).any(), f"{qtype.name}, {R} rows: a row left unwritten"
        np.testing.assert_array_equal(one.view(np.uint32), two.view(np.uint32), err_msg=f"{qtype.name}, {R} rows")
        outs.append(two[0])
        refs.append(x[0].astype(np.float64) @ dequantized(qtype, w).astype(np.float64).T)  # [R]
    # test_quant_matmul.py's bound (int8 activations, one scale per 256 values), over all the calls' rows: one row alone
    # carries a single dot's quantization error
    assert nmse(np.concatenate(outs), np.concatenate(refs)) < 2e-4


@pytest.mark.parametrize("isa", ISAS)
def test_the_moe_decode_is_the_same_with_either(pool, knob, isa):
    raw, ids, weights, x = _case(6, seed=11)
    for t in range(6):  # one token a call: the decode path
        knob(1)
        one = _moe(raw, ids[t:t + 1], weights[t:t + 1], x[t:t + 1], pool, isa)
        knob(2)
        two = _moe(raw, ids[t:t + 1], weights[t:t + 1], x[t:t + 1], pool, isa)
        assert not np.isnan(two).any()
        np.testing.assert_array_equal(one.view(np.uint32), two.view(np.uint32))


def test_the_knob_takes_0_1_or_2(knob):
    assert N.tuning()[KNOB] == 0  # the CPU's default unless the environment set it
    assert knob(2) == 0 and N.tuning()[KNOB] == 2
    for bad in (-1, 3):
        with pytest.raises(ValueError, match="decode_streams: must be 0 .* 1 or 2"):
            N.set_tuning_knob(KNOB, bad)


def test_a_bad_value_in_the_environment_is_named():
    env = dict(os.environ, TESSERA_DECODE_STREAMS="3")
    r = subprocess.run([sys.executable, "-c", "from tessera.engine import native; native.tuning()"], env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "TESSERA_DECODE_STREAMS: must be 0 (the CPU's default), 1 or 2, got '3'" in r.stderr
