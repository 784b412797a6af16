"""The quantized prefill GEMM on AMX int8 tiles (native/src/quant_gemm_amx.cpp; quantized ISA amx_int8, and its twin
amx_int8_emu on the tile emulator, which runs wherever AVX-512 VNNI does).

The every-token-count, every-thread-count, NaN-prefilled, row/token-independence and MoE tests of test_quant_gemm.py
and test_quant_matmul*.py run on both ISAs already (they take every ISA quant_isas() lists). Here, what is particular
to the tile GEMM:
- codes times sub-scales are folded at decode into v = sc * (u - off), split into lo = v & 127 and hi = v >> 7 (two
  int8 tile rows): at the extremes of every type (Q4_K 63 * 15, Q5_K 63 * 31, Q6_K -128 * -32 = 4096, so hi = 32,
  IQ4_XS -32 * -127) the result still agrees with Reference (double accumulation of the same integer dots) to the
  NMSE bound of test_quant_gemm.py, 1e-10;
- the instructions and the emulator give the same bits (the same blocking and f32 order; skipped without AMX);
- decode (T = 1) and short blocks (T < 12) never reach the tiles: bit for bit avx512_vnni's mat-vec;
- Q8_0 / Q4_0 (an f16 scale per 32 values: one TDPBSSD of K = 32 per block, then the VNNI GEMM's f32 steps in the
  same order) equal avx512_vnni bit for bit at every token count, K not a multiple of 256 included;
- dispatch: AMXInt8 (and Auto where it resolves to it) runs amx_int8 only where the CPU grants AMX;
  TESSERA_MAX_ISA=avx512 and the AVX512Int8 backend keep avx512_vnni.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES

import tessera.engine.native as N
from tests.native.quant_cases import K_QUANTS, Q, matmul, nmse, quant_isas, random_blocks

ISAS = quant_isas()
AMX_ISAS = [i for i in ("amx_int8", "amx_int8_emu") if i in ISAS]
HAS_AMX = "amx_int8" in ISAS
NMSE_VS_REFERENCE = 1e-10
K = 768  # three super-blocks

pytestmark = pytest.mark.skipif(not AMX_ISAS, reason="this CPU runs neither amx_int8 nor its emulated twin "
                                                      "(both need AVX-512 VNNI)")

# Byte ranges (lo, hi, value) that put a type's fold at its extreme: (sub-scale bytes, code bytes).
FOLD_EXTREMES = {
    Q.Q4_K: [((4, 16, 0xFF), (16, 144, 0xFF))],  # sc = m = 63, u = 15: v = 945
    Q.Q5_K: [((4, 16, 0xFF), (16, 176, 0xFF))],  # sc = 63, u = 31: v = 1953
    Q.Q6_K: [((192, 208, 0x80), (0, 192, 0x00)),  # sc = -128, u = 0: v = -128 * -32 = 4096 (hi = 32)
             ((192, 208, 0x80), (0, 192, 0xFF))],  # sc = -128, u = 63: v = -3968
    Q.IQ4_XS: [((2, 8, 0x00), (8, 136, 0x00))],  # ls - 32 = -32, kvalue -127: v = 4064
}


@pytest.mark.parametrize("T", (12, 24, 100))
@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", AMX_ISAS)
def test_fold_extremes_against_reference(pool, isa, qtype, T):
    rng = np.random.default_rng(int(qtype) + T)
    rows = 37
    block, size = GGML_QUANT_SIZES[qtype]
    w = random_blocks(qtype, rows, K, rng).reshape(rows, K // block, size)
    for pattern in FOLD_EXTREMES[qtype]:
        pick = rng.random((rows, K // block)) < 0.5  # about half the blocks per pattern, the rest random
        for lo, hi, byte in pattern:
            w[pick, lo:hi] = byte
    w = w.reshape(rows, -1)
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[:, ::7] *= 40.0  # activations at +-127 in most blocks
    out = matmul(qtype, w, x, pool, isa)
    assert np.isfinite(out).all()
    # Reference has the same int8 activations (spiked here, so their step is coarse: float64 on the exact weights is
    # test_quant_gemm.py's check, on unspiked data).
    assert nmse(out, matmul(qtype, w, x, pool, "reference")) < NMSE_VS_REFERENCE


@pytest.mark.skipif(not HAS_AMX, reason="this CPU (or OS, or TESSERA_MAX_ISA) does not grant AMX")
@pytest.mark.parametrize("qtype", (*K_QUANTS, Q.Q8_0), ids=lambda t: t.name)
def test_instructions_equal_the_emulator_bit_for_bit(qtype):
    rng = np.random.default_rng(40 + int(qtype))
    w = random_blocks(qtype, 53, K, rng)  # a 32-row task, then 21: a 16-row panel and a ragged 5
    x = rng.standard_normal((513, K)).astype(np.float32)
    for threads in (1, 3):
        pool = N.make_pool(threads)
        for T in (12, 16, 17, 33, 256, 257, 513):
            hw = matmul(qtype, w, x[:T], pool, "amx_int8")
            emu = matmul(qtype, w, x[:T], pool, "amx_int8_emu")
            assert np.array_equal(hw.view(np.uint32), emu.view(np.uint32)), (T, threads)


@pytest.mark.skipif("avx512_vnni" not in ISAS, reason="needs avx512_vnni to compare with")
@pytest.mark.parametrize("isa", AMX_ISAS)
def test_decode_and_short_blocks_are_vnni_bit_for_bit(pool, isa):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((11, K)).astype(np.float32)
    for qtype in K_QUANTS:
        w = random_blocks(qtype, 37, K, rng)
        for T in (1, 2, 11):
            a = matmul(qtype, w, x[:T], pool, isa)
            v = matmul(qtype, w, x[:T], pool, "avx512_vnni")
            assert np.array_equal(a.view(np.uint32), v.view(np.uint32)), (qtype.name, T)


@pytest.mark.skipif("avx512_vnni" not in ISAS, reason="needs avx512_vnni to compare with")
@pytest.mark.parametrize("threads", (1, 3))
@pytest.mark.parametrize("Kb", (96, 768, 2080), ids=lambda k: f"K{k}")
@pytest.mark.parametrize("qtype", (Q.Q8_0, Q.Q4_0), ids=lambda t: t.name)
@pytest.mark.parametrize("isa", AMX_ISAS)
def test_q8_0_q4_0_tiles_equal_vnni_bit_for_bit(isa, qtype, Kb, threads):
    rng = np.random.default_rng(int(qtype) + Kb)
    pool = N.make_pool(threads)
    w = random_blocks(qtype, 53, Kb, rng)
    x = rng.standard_normal((513, Kb)).astype(np.float32)
    for T in (1, 11, 12, 13, 16, 17, 33, 100, 256, 257, 513):
        a = matmul(qtype, w, x[:T], pool, isa)
        v = matmul(qtype, w, x[:T], pool, "avx512_vnni")
        assert np.array_equal(a.view(np.uint32), v.view(np.uint32)), T


def test_backend_mapping():
    from tessera.engine import backends as B

    compiled = {b["name"]: b for b in B.compiled()}
    if compiled.get("AVX512Int8", {}).get("available") and "avx512_vnni" in ISAS:
        assert N.quant_isa_for_backend("AVX512Int8") == "avx512_vnni"
    if compiled.get("AMXInt8", {}).get("available"):
        assert N.quant_isa_for_backend("AMXInt8") == ("amx_int8" if HAS_AMX else "avx512_vnni")
    assert "amx_int8_emu" not in N.QUANT_ISAS  # the twin is for tests: no backend runs it


PROBE = ("import json, tessera.engine.native as N; "
         "print(json.dumps([{i['name']: [i['available'], i['reason']] for i in N.quant_isas()}, "
         "N.quant_isa_for_backend('Auto')]))")


def test_max_isa_avx512_keeps_vnni():
    env = dict(os.environ, TESSERA_MAX_ISA="avx512")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout
    isas, auto = json.loads(out)
    assert isas["amx_int8"] == [False, "capped by TESSERA_MAX_ISA=avx512"] or not isas["amx_int8"][0]
    assert auto != "amx_int8"
    if isas["avx512_vnni"][0]:
        assert auto == "avx512_vnni"


def test_dense_layers_follow_the_expert_backend():
    """engine.dense runs its quantized blocks on the ISA the session's expert backend maps to (Session sets it), so
    AVX512Int8 keeps avx512_vnni on an AMX CPU; Torch experts leave it at auto."""
    import torch

    from tessera.engine import dense
    from tessera.engine.quantized import QuantizedMatrix

    assert N.quant_isa_for_dense("Torch") == "auto"
    assert N.quant_isa_for_dense("Reference") == "reference"
    rng = np.random.default_rng(9)
    w = random_blocks(Q.Q4_K, 40, K, rng)
    x = torch.from_numpy(rng.standard_normal((40, K)).astype(np.float32))  # [T, K]
    lin = dense.Linear(QuantizedMatrix(w, Q.Q4_K, (40, K), "w"), "cpu", "w")
    before = dense.quant_isa()
    try:
        for isa in (*AMX_ISAS, "avx512_vnni" if "avx512_vnni" in ISAS else "reference"):
            dense.set_quant_isa(isa)
            want = matmul(Q.Q4_K, w, x.numpy(), lin._pool, isa)
            assert np.array_equal(lin(x).numpy().view(np.uint32), want.view(np.uint32)), isa
    finally:
        dense.set_quant_isa(before)
