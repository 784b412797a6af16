"""Helpers for the quantized-kernel tests: random valid GGUF blocks, the ISAs this CPU runs, float64 oracles.

Random valid blocks = uniformly random bytes (every code, sub-scale and min bit pattern) with the f16 block scales
(d, and dmin for Q4_K/Q5_K) replaced by finite values: gguf.quants.dequantize gives every weight's exact value, which
the kernels must reproduce without ever widening a weight.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

import tessera.engine.native as N

Q = GGMLQuantizationType
TYPES = (Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS)
K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS)  # 256-value super-blocks
# Byte offsets of each type's f16 block scales inside its block.
SCALE_OFFSETS = {Q.Q4_0: (0,), Q.Q8_0: (0,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.IQ4_XS: (0,)}


def quant_isas() -> list[str]:
    """Every quantized ISA this CPU runs (under TESSERA_MAX_ISA), best first; the tests run on each."""
    return [i["name"] for i in N.quant_isas() if i["available"]]


def random_blocks(qtype: Q, rows: int, K: int, rng: np.random.Generator, *, any_finite_scale: bool = False,
                  lead: tuple[int, ...] = ()) -> np.ndarray:
    """[*lead, rows, row_bytes] uint8 of random valid blocks. Scales: random sign and magnitude in [1e-3, 2e-2]
    (weights of order 0.01-1, as in real checkpoints), or with `any_finite_scale` any finite f16 bit pattern
    (subnormals, 65504) for the bit-exactness test."""
    block, size = GGML_QUANT_SIZES[qtype]
    nb = K // block
    raw = rng.integers(0, 256, size=(*lead, rows, nb, size), dtype=np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        if any_finite_scale:
            bits = rng.integers(0, 1 << 16, size=raw.shape[:-1], dtype=np.uint16)
            bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # clear one exponent bit of Inf/NaN patterns: finite
            scale = bits.view(np.float16)
        else:
            scale = (rng.uniform(1e-3, 2e-2, raw.shape[:-1])
                     * rng.choice([-1.0, 1.0], raw.shape[:-1])).astype(np.float16)
        raw[..., off:off + 2] = scale.view(np.uint8).reshape(*raw.shape[:-1], 2)
    return raw.reshape(*lead, rows, nb * size)


def dequantized(qtype: Q, raw: np.ndarray) -> np.ndarray:
    """gguf.quants.dequantize of raw [..., rows, row_bytes] -> float32 [..., rows, K]."""
    return dequantize(raw, qtype)


def matmul(qtype: Q, w: np.ndarray, x: np.ndarray, pool, isa: str) -> np.ndarray:
    """N.quant_matmul of w [N, row_bytes] and x [T, K] on `isa` into a NaN-prefilled out [T, N]: a result the kernel
    leaves unwritten stays NaN and fails every comparison."""
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)  # [T, N]
    N.quant_matmul(qtype, np.ascontiguousarray(w), np.ascontiguousarray(x), out, pool, isa)
    return out


def nmse(y, ref) -> float:
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    return float(((y - ref) ** 2).sum() / max((ref ** 2).sum(), 1e-300))


def moe_float64(gate, up, down, ids, weights, x) -> np.ndarray:
    """out[t] = sum_j weights[t, j] * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, j] >= 0, all in float64 on the
    dequantized weights gate, up [E, I, H], down [E, H, I]."""
    x = np.asarray(x, np.float64)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t]):
            if e < 0:
                continue
            g = gate[e].astype(np.float64) @ x[t]
            u = up[e].astype(np.float64) @ x[t]
            h = g * 0.5 * (1.0 + np.tanh(0.5 * g)) * u  # silu(g) * u, without exp overflow
            out[t] += float(weights[t, j]) * (down[e].astype(np.float64) @ h)
    return out
