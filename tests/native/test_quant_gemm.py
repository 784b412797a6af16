"""Quantized prefill GEMMs: on AVX-512 VNNI (native/src/quant_gemm_avx512.cpp) from 12 tokens per block, a row group
runs as a rows x 16-token register GEMM on the decoded rows instead of one mat-vec per token; on AVX2
(native/src/quant_gemm_avx2.cpp) from 2-4 tokens by type (where it measured faster; quant_isas()'s gemm_min_tokens,
TESSERA_AVX2_GEMM_MIN_T overrides) as a 4-row x 8-token one, with vpmaddubsw int16 pair sums added in int16 only as
far as they cannot overflow.

Proven here, for every type and every ISA this CPU runs (the others take their mat-vec path, and must agree too):
- every token count from 1 to 70 (1 = decode, the mat-vec / row tiles below each GEMM's threshold, the smallest GEMM,
  8- and 16-token lane groups full and ragged, the MoE's 64-token block and the block after it) and 127-129, 255-257,
  511-513 (AVX-512 quant_matmul's GEMM tasks of 256 tokens on tokens packed once per call, full and ragged), on 1, 2
  and 3 threads (bit-identical whatever the thread count: the tasks do not depend on it), against
  Reference (the same integer dots, double accumulation: NMSE bound 1e-10 as in test_quant_matmul.py) and float64
  on gguf.quants.dequantize's values (2e-4, the int8 activation step; see test_quant_matmul.py), on NaN-prefilled
  outputs that must be overwritten everywhere. Neither GEMM is bit-identical to its ISA's row path: each rounds its
  f32 scale products per 16- or 32-value group, the row paths per 4 values (AVX2) or per 256 (AVX-512); the integer
  dots are exact in all of them, so Reference's NMSE bound is the contract;
- the int16 sums at their bounds: every code at its largest magnitude times activations all at +-127 (random weights
  and activations never come near 32767, so an int16 sum that could overflow would pass the other tests);
- a (row, token) result does not depend on the rows or tokens that share its call (bit for bit: the lanes and the
  row micro-tiles never mix), for 37 rows (one 32-row task, then 5 rows padded to a micro-tile of 8 or 4);
- TESSERA_AVX2_GEMM_MIN_T=65 turns the AVX2 GEMM off (the row path alone, for before/after timings), and that path
  agrees with Reference too;
- the MoE forward on odd expert counts (7 experts, 3 per token), so each expert gets a ragged number of tokens
  (none, one, a few, more than 64), on 1-3 threads, against Reference and float64 (bounds of test_quant_moe.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES

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
THREADS = (1, 2, 3)
_pools: dict = {}


def _pool(threads: int):
    if threads not in _pools:
        _pools[threads] = N.make_pool(threads)
    return _pools[threads]


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


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
def test_every_token_count_against_reference_and_float64(pool, isa, qtype, threads):
    w, xs, exact = _case(qtype)
    for T in T_ALL:
        x = xs[:T]
        out = matmul(qtype, w, x, _pool(threads), isa)
        assert np.isfinite(out).all(), f"T={T}: not every output written"
        assert nmse(out, exact[:T]) < 2e-4, f"T={T}"
        if isa != "reference":
            ref = matmul(qtype, w, x, pool, "reference")
            assert nmse(out, ref) < 1e-10, f"T={T}"
        if threads != 2:
            two = matmul(qtype, w, x, pool, isa)
            assert np.array_equal(out.view(np.uint32), two.view(np.uint32)), f"T={T}: {threads} vs 2 threads"


# Byte ranges of each type's codes in its block, and the byte that puts every code of the range at its largest
# magnitude: nibbles 15 (Q4_0, Q4_K), 31 (Q5_K: high bits set too), 63 (Q6_K), -128 (Q8_0), kvalues[0] = -127 (IQ4_XS).
EXTREME_CODES = {Q.Q4_0: ((2, 18, 0xFF),), Q.Q4_K: ((16, 144, 0xFF),), Q.Q5_K: ((16, 176, 0xFF),),
                 Q.Q6_K: ((0, 192, 0xFF),), Q.Q8_0: ((2, 34, 0x80),), Q.IQ4_XS: ((8, 136, 0x00),)}


# T = 1 (decode) and 5 (a short token block) take the row kernels: on AVX-512 VNNI the K-quants' paired vpdpbusd sums,
# whose int16 halves are at their bound (4 * 63 * 127 for Q6_K) here; T = 24 the GEMM.
@pytest.mark.parametrize("T", (1, 5, 24))
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
def test_int16_sums_at_their_bounds(pool, isa, qtype, T):
    rng = np.random.default_rng(5 + int(qtype) + T)
    K, rows = _K(qtype), 37  # 37 rows: two 16-row reductions of the decode path and a ragged 5
    block, size = GGML_QUANT_SIZES[qtype]
    w = random_blocks(qtype, rows, K, rng).reshape(rows, K // block, size)
    for lo, hi, byte in EXTREME_CODES[qtype]:
        w[:, :, lo:hi] = byte
    w = w.reshape(rows, -1)
    # Every activation quantizes to +-127 (one sign per token and 16-value run): each vpmaddubsw pair is at its
    # bound and the int16 sums of a group all have one sign.
    signs = rng.choice([-1.0, 1.0], size=(T, K // 16))
    x = (np.repeat(signs, 16, axis=1) * 3.0).astype(np.float32)  # [T, K]
    exact = x.astype(np.float64) @ dequantized(qtype, w).astype(np.float64).T
    out = matmul(qtype, w, x, pool, isa)
    assert np.isfinite(out).all()
    assert nmse(out, exact) < 1e-10  # the activations are exact here (3 = 127 * 3/127 up to f32 rounding)
    if isa != "reference":
        assert nmse(out, matmul(qtype, w, x, pool, "reference")) < 1e-10


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


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("T", (1, 2, 3, 5, 9, 17, 40, 100, 257, 513))
@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("isa", ISAS)
def test_moe_odd_experts_against_reference_and_float64(pool, isa, mix, T, threads):
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
        N.quant_moe_forward(gt, raw[0], ut, raw[1], dt, raw[2], ids, weights, x, out, _pool(threads), which)
        return out

    out = run(isa)
    assert np.isfinite(out).all()
    assert nmse(out, moe_float64(*deq, ids, weights, x)) < 1e-3
    if isa != "reference":
        assert nmse(out, run("reference")) < 1e-7


def test_avx2_gemm_knob_selects_the_row_path():
    if "avx2" not in ISAS:
        pytest.skip("this CPU does not run AVX2")
    code = ("import numpy as np, tessera.engine.native as N; from tests.native.quant_cases import Q, random_blocks, "
            "matmul; rng = np.random.default_rng(3); w = random_blocks(Q.Q4_K, 37, 512, rng); "
            "x = rng.standard_normal((20, 512)).astype(np.float32); p = N.make_pool(2); "
            "print([i['gemm_min_tokens'] for i in N.quant_isas() if i['name'] == 'avx2'][0]['Q4_K']); "
            "np.save('OUT', matmul(Q.Q4_K, w, x, p, 'avx2'))")
    outs = {}
    for knob in ("65", ""):
        path = Path(tempfile.mkdtemp()) / "out.npy"
        env = dict(os.environ, TESSERA_AVX2_GEMM_MIN_T=knob)
        r = subprocess.run([sys.executable, "-c", code.replace("OUT", str(path))], env=env, capture_output=True,
                           text=True, check=True, cwd=Path(__file__).resolve().parents[2])
        outs[knob] = int(r.stdout.strip()), np.load(path)
    assert outs["65"][0] == 65 and outs[""][0] <= 20  # 65 > kTokenBlock: never the GEMM; default: the GEMM at T = 20
    row, gemm = outs["65"][1], outs[""][1]
    assert np.isfinite(row).all() and not np.array_equal(row.view(np.uint32), gemm.view(np.uint32))
    assert nmse(row, gemm) < 1e-10  # both the exact integer dots, f32 rounded in another order


def _moe_case(mix, T, rng, scale=1.0):
    gt, ut, dt = MIXES[mix]
    H, I = 256, 512
    raw = (random_blocks(gt, I, H, rng, lead=(E,)), random_blocks(ut, I, H, rng, lead=(E,)),
           random_blocks(dt, H, I, rng, lead=(E,)))
    x = (rng.standard_normal((T, H)) * scale).astype(np.float32)
    p = np.array([0.45, 0.25, 0.12, 0.08, 0.05, 0.03, 0.02])  # skewed: expert 0's tokens reach the GEMM from T ~ 9
    ids = np.stack([rng.choice(E, k, replace=False, p=p) for _ in range(T)]).astype(np.int64)  # [T, k]
    ids[rng.random((T, k)) < 0.1] = -1
    weights = rng.random((T, k)).astype(np.float32)
    return raw, ids, weights, x


def _moe(mix, raw, ids, weights, x, pool, isa):
    gt, ut, dt = MIXES[mix]
    out = np.full(x.shape, np.nan, np.float32)
    N.quant_moe_forward(gt, raw[0], ut, raw[1], dt, raw[2], ids, weights, x, out, pool, isa)
    return out


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("isa", [i for i in ISAS if i != "reference"])
def test_moe_every_token_count_against_reference_and_across_threads(pool, isa, mix):
    """The prefill paths of quant_moe_forward (AVX-512 VNNI: each expert's tokens packed once for the GEMM, shared by
    gate and up when their packings agree, the row path below kGemmMinTokens, the vector SiLU) at every token count
    that changes which experts take which path, against Reference; the same bits on 1, 2 and 3 threads."""
    rng = np.random.default_rng(77 + sorted(MIXES).index(mix))
    raw, ids, weights, x = _moe_case(mix, 513, rng)
    for T in T_ALL:
        args = raw, ids[:T], weights[:T], x[:T]
        out = _moe(mix, *args, _pool(2), isa)
        assert np.isfinite(out).all(), f"T={T}: not every output written"
        assert nmse(out, _moe(mix, *args, pool, "reference")) < 1e-7, f"T={T}"
        for threads in (1, 3):
            other = _moe(mix, *args, _pool(threads), isa)
            assert np.array_equal(out.view(np.uint32), other.view(np.uint32)), f"T={T}: {threads} vs 2 threads"


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "reference"])
def test_moe_silu_at_large_gate_values(pool, isa):
    """Inputs 300x larger: gate values of several hundred either sign, where exp(-g) overflows f32 (silu -> -0) or
    vanishes (silu -> g); the vector SiLU must saturate like the scalar one, finite and close to Reference."""
    rng = np.random.default_rng(8)
    raw, ids, weights, x = _moe_case("q4_k_m", 100, rng, scale=300.0)
    out = _moe("q4_k_m", raw, ids, weights, x, pool, isa)
    assert np.isfinite(out).all()
    assert nmse(out, _moe("q4_k_m", raw, ids, weights, x, pool, "reference")) < 1e-7
