"""Quantized GGUF kernels, dense side: exact dequantization and the mat-mul out = x @ W.T on the file's blocks.

Oracles nobody here wrote: gguf.quants.dequantize (llama.cpp's numpy reference) for every weight's value, and float64
x @ W.T on those values. Tolerance against float64 (NMSE = |y - ref|^2 / |ref|^2): the kernels' only approximation
is the activation quantization, int8 per 256 values (llama.cpp's Q8_K, test_quant_activations.py) with step
dx = max|x| / 127 and round-to-nearest, an independent error of variance dx^2 / 12 per value. For Gaussian x the max of
256 |x| is about 2.9 sigma, so the relative error variance is ~(2.9 / 127)^2 / 12 = 4.3e-5 and, being independent of
the weights, the output NMSE is about the same (measured 1.7e-5 to 7.9e-5 over the types and T: weights with a nonzero
mean, Q4_K/Q5_K's mins, cancel part of the output). The bound 2e-4 leaves a factor ~2.5 over the worst measured case;
any real defect (a wrong scale, a misplaced nibble, a dropped min) gives NMSE of order 1e-2 to 1. ISAs against
Reference: same int8 activations, same codes and scales, exact int32 dots; only the f32 rounding order differs
(Reference: double), NMSE ~1e-14: bound 1e-10.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera.engine.native as N
from tessera.engine import backends
from tests.native.quant_cases import K_QUANTS, TYPES, Q, dequantized, nmse, quant_isas, random_blocks

ISAS = quant_isas()
NMSE_VS_FLOAT64 = 2e-4
NMSE_VS_REFERENCE = 1e-10
T_SAMPLE = (1, 2, 7, 16, 33, 128, 513)


def _K(qtype) -> int:
    """768 for 256-value super-blocks; 416 = 13 blocks of 32 (not a multiple of 64 or 256) for Q4_0/Q8_0."""
    return 768 if qtype in K_QUANTS else 416


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_is_bit_exact_with_gguf(pool, qtype):
    rng = np.random.default_rng(int(qtype))
    K = 2 * _K(qtype)
    w = random_blocks(qtype, 29, K, rng, any_finite_scale=True)
    out = np.full((29, K), np.nan, np.float32)
    N.quant_dequantize(qtype, w, out, pool)
    ref = dequantized(qtype, w)
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("T", T_SAMPLE)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
def test_matmul_against_float64_and_reference(pool, isa, qtype, T):
    rng = np.random.default_rng(1000 * int(qtype) + T)
    N_rows, K = 37, _K(qtype)  # 37 rows: not a multiple of the 4-row tile or the 32-row task
    w = random_blocks(qtype, N_rows, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    exact = x.astype(np.float64) @ dequantized(qtype, w).astype(np.float64).T  # [T, N]
    out = np.full((T, N_rows), np.nan, np.float32)
    N.quant_matmul(qtype, w, x, out, pool, isa)
    assert np.isfinite(out).all()
    assert nmse(out, exact) < NMSE_VS_FLOAT64
    ref = np.full((T, N_rows), np.nan, np.float32)
    N.quant_matmul(qtype, w, x, ref, pool, "reference")
    assert nmse(out, ref) < NMSE_VS_REFERENCE


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
def test_matmul_heavy_tailed_activations(pool, isa, qtype):
    """Outliers (one value per 32 30x the rest, as in real hidden states) coarsen the int8 step of their block only;
    the per-block scale keeps the error bounded. Bound: 50x the Gaussian bound (the 30x outlier raises dx of every
    block)."""
    rng = np.random.default_rng(7)
    K = _K(qtype)
    w = random_blocks(qtype, 16, K, rng)
    x = rng.standard_normal((5, K)).astype(np.float32)
    x[:, ::32] *= 30.0
    exact = x.astype(np.float64) @ dequantized(qtype, w).astype(np.float64).T
    out = np.full((5, 16), np.nan, np.float32)
    N.quant_matmul(qtype, w, x, out, pool, isa)
    assert nmse(out, exact) < 50 * NMSE_VS_FLOAT64


def test_isa_names_and_backend_mapping():
    names = [i["name"] for i in N.quant_isas()]
    assert names == ["amx_int8", "amx_int8_emu", "avx512_vnni", "avx2", "reference"]
    assert "reference" in ISAS
    assert N.quant_isa_for_backend("Reference") == "reference"
    for b in backends.available_names():
        assert N.quant_isa_for_backend(b) in ISAS


def test_row_bytes():
    assert N.quant_row_bytes("Q4_K", 2048) == 8 * 144
    assert N.quant_row_bytes(Q.Q8_0, 96) == 3 * 34
    assert N.quant_row_bytes("iq4_xs", 512) == 2 * 136
    with pytest.raises(ValueError, match="multiple of 256"):
        N.quant_row_bytes("Q6_K", 416)


# ----------------------------------------------------------------------------------------------------- bad arguments


def _args(qtype=Q.Q4_K, T=2, N_rows=8, K=256):
    rng = np.random.default_rng(0)
    w = random_blocks(qtype, N_rows, K, rng)
    return w, rng.standard_normal((T, K)).astype(np.float32), np.empty((T, N_rows), np.float32)


def test_k_not_a_multiple_of_the_super_block_is_a_named_error(pool):
    rng = np.random.default_rng(0)
    w = random_blocks(Q.Q8_0, 4, 416, rng)  # valid Q8_0 bytes, but K = 416 is not a whole number of Q4_K blocks
    x = np.zeros((1, 416), np.float32)
    with pytest.raises(ValueError, match=r"w: 416 values per row is not a multiple of Q4_K's block of 256"):
        N.quant_matmul(Q.Q4_K, w, x, np.empty((1, 4), np.float32), pool)


@pytest.mark.parametrize("case, exc, match", [
    ("w_dtype", TypeError, r"w: expected uint8"),
    ("w_row_bytes", ValueError, r"w: expected shape \[8, 144\]"),
    ("w_1d", ValueError, r"w: expected a 2-D"),
    ("x_dtype", TypeError, r"x: expected float32, got float64"),
    ("x_strided", ValueError, r"x: must be C-contiguous"),
    ("out_shape", ValueError, r"out: expected shape \[2, 8\]"),
    ("qtype", ValueError, r"qtype: GGML type 10 has no quantized kernel"),
    ("isa", ValueError, r"isa: unknown quantized ISA 'sse9'"),
])
def test_matmul_rejects_malformed_arguments(pool, case, exc, match):
    w, x, out = _args()
    qtype, isa = Q.Q4_K, "auto"
    if case == "w_dtype":
        w = w.view(np.int8)
    elif case == "w_row_bytes":
        w = np.ascontiguousarray(w[:, :-2])
    elif case == "w_1d":
        w = w.reshape(-1)
    elif case == "x_dtype":
        x = x.astype(np.float64)
    elif case == "x_strided":
        x = np.repeat(x, 2, axis=1)[:, ::2]
    elif case == "out_shape":
        out = np.empty((2, 9), np.float32)
    elif case == "qtype":
        qtype = Q.Q2_K
    elif case == "isa":
        isa = "sse9"
    with pytest.raises(exc, match=match):
        N.quant_matmul(qtype, w, x, out, pool, isa)


@pytest.mark.parametrize("qtype, field, offset", [(Q.Q4_K, "d", 0), (Q.Q4_K, "dmin", 2), (Q.Q6_K, "d", 208),
                                                  (Q.Q8_0, "d", 0), (Q.Q4_0, "d", 0), (Q.Q5_K, "dmin", 2),
                                                  (Q.IQ4_XS, "d", 0)], ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_validate_names_tensor_row_and_block_of_a_non_finite_scale(pool, qtype, field, offset, bad):
    rng = np.random.default_rng(3)
    K = _K(qtype)
    w = random_blocks(qtype, 11, K, rng)
    N.quant_validate(qtype, w, "blk.3.ffn_down_exps.weight", pool)  # all finite: no error
    size = w.shape[1] // (K // (256 if qtype in K_QUANTS else 32))
    for row, block in ((9, 2), (6, 1)):  # two bad blocks: the first in row-major order is reported
        w[row, block * size + offset:block * size + offset + 2] = np.array([bad], np.float16).view(np.uint8)
    with pytest.raises(ValueError, match=rf"tensor blk\.3\.ffn_down_exps\.weight: row 6, block 1 has a non-finite "
                                         rf"scale {field} \(NaN or Inf\)"):
        N.quant_validate(qtype, w, "blk.3.ffn_down_exps.weight", pool)


def test_validate_accepts_expert_tensors_as_stored(pool):
    rng = np.random.default_rng(4)
    w = random_blocks(Q.Q6_K, 6, 512, rng, lead=(3,))  # [E, rows, row_bytes]
    N.quant_validate("Q6_K", w, "blk.0.ffn_gate_exps.weight", pool)
    with pytest.raises(ValueError, match=r"tensor t: rows are not a whole number of Q6_K blocks"):
        N.quant_validate("Q6_K", w[..., :-1].copy(), "t", pool)
