"""The AVX2 quantized prefill GEMM on AVX-VNNI (native/src/quant_gemm_avx_vnni.cpp): the same GEMM body as
quant_gemm_avx2.cpp (quant_gemm_avx2_body.inc) with each integer dot formed by the 256-bit VEX vpdpbusd instead of
vpmaddubsw + int16 adds + vpmaddwd. Both dots are exact and every f32 step after them is the same, so the two must
agree bit for bit: that is the contract proven here, on every type, every token count test_quant_gemm.py covers, the
int16 bounds (where vpmaddubsw would saturate if its chunks were too long; vpdpbusd never saturates), and the MoE
forward. Everything test_quant_gemm.py proves for ISA "avx2" against Reference and float64 then holds for both paths:
on a CPU with AVX-VNNI that file runs the vpdpbusd path (the default), on one without it the vpmaddubsw one.

The knob: TESSERA_AVX_VNNI=0 (environment) or set_tuning_knob("avx_vnni", 0) keeps the vpmaddubsw path; quant_isas()
says which one the avx2 ISA runs. Skipped where the CPU has no AVX-VNNI (or no AVX2): no emulator runs vpdpbusd.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES

import tessera.engine.native as N
from tests.native.quant_cases import K_QUANTS, TYPES, Q, matmul, random_blocks

ROOT = Path(__file__).resolve().parents[2]
T_ALL = (*range(1, 71), 127, 128, 129, 255, 256, 257, 511, 512, 513)
HAS_AVX2 = any(i["name"] == "avx2" and i["available"] for i in N.quant_isas())
HAS_VNNI = HAS_AVX2 and bool(N.cpu_features()["flags"]["avx_vnni"])
needs_vnni = pytest.mark.skipif(not HAS_VNNI, reason="this CPU (or TESSERA_MAX_ISA) runs no AVX2 with AVX-VNNI")


def _avx2_entry() -> dict:
    return next(i for i in N.quant_isas() if i["name"] == "avx2")


@pytest.fixture
def knob():
    """Sets avx_vnni for the test and restores the process's value after it. The GEMM runs from 2 tokens meanwhile
    (avx2_gemm_min_tokens = 2): the two paths' default thresholds differ (quant_kernels.h), and below a threshold a
    block takes the row tiles, which round in another order."""
    before, min_t = N.tuning()["avx_vnni"], N.set_tuning_knob("avx2_gemm_min_tokens", 2)
    yield lambda v: N.set_tuning_knob("avx_vnni", v)
    N.set_tuning_knob("avx_vnni", before)
    N.set_tuning_knob("avx2_gemm_min_tokens", min_t)


def _both(knob, f):
    """f() with the vpdpbusd path, then with the vpmaddubsw one."""
    knob(1)
    vnni = f()
    knob(0)
    return vnni, f()


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_knob_and_quant_isas_say_which_path_runs(knob):
    assert N.tuning()["avx_vnni"] == (0 if os.environ.get("TESSERA_AVX_VNNI") == "0" else 1)
    N.set_tuning_knob("avx2_gemm_min_tokens", 0)  # the per-type defaults, which depend on the path
    knob(1)
    assert _avx2_entry()["avx_vnni"] is HAS_VNNI  # on where the CPU has it and the AVX2 ISA runs
    vnni_min = _avx2_entry()["gemm_min_tokens"]
    knob(0)
    assert _avx2_entry()["avx_vnni"] is False
    maddubs_min = _avx2_entry()["gemm_min_tokens"]
    if HAS_AVX2:  # quant_kernels.h avx2_gemm_min_tokens: each path's measured table (the row tiles win below)
        assert maddubs_min == {"Q4_0": 2, "Q8_0": 4, "Q4_K": 2, "Q5_K": 2, "Q6_K": 2, "IQ4_XS": 2}
        assert vnni_min == ({"Q4_0": 3, "Q8_0": 4, "Q4_K": 4, "Q5_K": 3, "Q6_K": 4, "IQ4_XS": 4} if HAS_VNNI
                            else maddubs_min)
    assert not any(i["avx_vnni"] for i in N.quant_isas() if i["name"] != "avx2")
    with pytest.raises(ValueError, match="avx_vnni: must be 0"):
        N.set_tuning_knob("avx_vnni", 2)


def test_environment_turns_it_off_and_a_bad_value_is_named():
    code = ("import tessera.engine.native as N; t = N.tuning(); "
            "print(t['avx_vnni'], 'TESSERA_AVX_VNNI' in t['from_environment'], "
            "[i['avx_vnni'] for i in N.quant_isas() if i['name'] == 'avx2'])")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TESSERA_AVX_VNNI="0"), cwd=ROOT,
                       capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["0", "True", "[False]"]
    bad = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TESSERA_AVX_VNNI="yes"), cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "TESSERA_AVX_VNNI" in bad.stderr


@needs_vnni
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_token_count_bit_identical_to_the_maddubs_path(pool, knob, qtype):
    rng = np.random.default_rng(40 + int(qtype))
    K = 512 if qtype in K_QUANTS else 416  # 416: a partial last 256-value activation block
    w = random_blocks(qtype, 37, K, rng)  # [37, row_bytes]: a 32-row task and 5 rows padded to a micro-tile
    xs = rng.standard_normal((513, K)).astype(np.float32)
    for T in T_ALL:
        vnni, maddubs = _both(knob, lambda T=T: matmul(qtype, w, xs[:T], pool, "avx2"))
        assert np.isfinite(vnni).all(), f"T={T}: not every output written"
        assert _same_bits(vnni, maddubs), f"T={T}"


# Every code at its largest magnitude (the bytes of test_quant_gemm.py's EXTREME_CODES) times activations at +-127:
# the integer dots at their bounds, one sign per 16-value run.
EXTREME_CODES = {Q.Q4_0: (2, 18, 0xFF), Q.Q4_K: (16, 144, 0xFF), Q.Q5_K: (16, 176, 0xFF), Q.Q6_K: (0, 192, 0xFF),
                 Q.Q8_0: (2, 34, 0x80), Q.IQ4_XS: (8, 136, 0x00)}


@needs_vnni
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dots_at_their_bounds_bit_identical(pool, knob, qtype):
    rng = np.random.default_rng(90 + int(qtype))
    K, rows, T = (512 if qtype in K_QUANTS else 416), 37, 24
    block, size = GGML_QUANT_SIZES[qtype]
    w = random_blocks(qtype, rows, K, rng).reshape(rows, K // block, size)
    lo, hi, byte = EXTREME_CODES[qtype]
    w[:, :, lo:hi] = byte
    w = w.reshape(rows, -1)
    signs = rng.choice([-1.0, 1.0], size=(T, K // 16))
    x = (np.repeat(signs, 16, axis=1) * 3.0).astype(np.float32)  # [T, K]: every activation quantizes to +-127
    vnni, maddubs = _both(knob, lambda: matmul(qtype, w, x, pool, "avx2"))
    assert np.isfinite(vnni).all() and _same_bits(vnni, maddubs)


MIXES = {"q4_k_m": (Q.Q4_K, Q.Q4_K, Q.Q6_K), "q8_0": (Q.Q8_0, Q.Q8_0, Q.Q8_0), "iq4_q5": (Q.IQ4_XS, Q.Q5_K, Q.Q4_0)}


@needs_vnni
@pytest.mark.parametrize("T", (9, 40, 257))
@pytest.mark.parametrize("mix", sorted(MIXES))
def test_moe_forward_bit_identical(pool, knob, mix, T):
    gt, ut, dt = MIXES[mix]
    E, k, H, I = 7, 3, 256, 512
    rng = np.random.default_rng(T + 7 * sorted(MIXES).index(mix))
    raw = (random_blocks(gt, I, H, rng, lead=(E,)), random_blocks(ut, I, H, rng, lead=(E,)),
           random_blocks(dt, H, I, rng, lead=(E,)))
    x = rng.standard_normal((T, H)).astype(np.float32)
    p = np.array([0.45, 0.25, 0.12, 0.08, 0.05, 0.03, 0.02])  # skewed: some experts take the GEMM, some the rows
    ids = np.stack([rng.choice(E, k, replace=False, p=p) for _ in range(T)]).astype(np.int64)  # [T, k]
    weights = rng.random((T, k)).astype(np.float32)

    def run():
        out = np.full(x.shape, np.nan, np.float32)
        N.quant_moe_forward(gt, raw[0], ut, raw[1], dt, raw[2], ids, weights, x, out, pool, "avx2")
        return out

    vnni, maddubs = _both(knob, run)
    assert np.isfinite(vnni).all() and _same_bits(vnni, maddubs)
