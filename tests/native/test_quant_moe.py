"""Quantized GGUF kernels, MoE side: `quant_moe_forward` on gate/up/down expert tensors as stored in the file, each
projection with its own type (llama-quantize's mixes put ffn_down one type above gate/up).

Oracle: float64 experts on gguf.quants.dequantize's values (quant_cases.moe_float64). Tolerance (NMSE): two int8
activation quantizations now, x per 256 (~4e-5, see test_quant_matmul.py) and the intermediate silu(g) * u, whose
product of two near-Gaussian factors is heavy-tailed, so its per-256 step is larger relative to its rms: measured
1.2e-4 to 4.7e-4 over the mixes and T (with one scale per 32, before llama.cpp's Q8_K scheme: 6e-5 to 2.6e-4). Bound
1e-3 (2x over the worst measured); a wrong expert, a dropped weight or a skipped slot that runs gives NMSE of order 0.1
to 1. ISA vs Reference: the same arithmetic up to f32 summation order, except that an intermediate value sitting on a
rounding boundary of its int8 step may take the neighbouring code in one ISA (one step of one value among T*k*I:
measured 3e-14 to 4e-8): bound 1e-7.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera.engine.native as N
from tests.native.quant_cases import K_QUANTS, Q, dequantized, moe_float64, nmse, quant_isas, random_blocks

ISAS = quant_isas()
NMSE_VS_FLOAT64 = 1e-3
NMSE_VS_REFERENCE = 1e-7
T_SAMPLE = (1, 2, 7, 16, 33, 128, 513)
MIXES = {  # gate, up, down
    "q4_k_m": (Q.Q4_K, Q.Q4_K, Q.Q6_K),
    "q5_k_m": (Q.Q5_K, Q.Q5_K, Q.Q6_K),
    "q6_k": (Q.Q6_K, Q.Q6_K, Q.Q6_K),
    "q8_0": (Q.Q8_0, Q.Q8_0, Q.Q8_0),
    "q4_0": (Q.Q4_0, Q.Q4_0, Q.Q8_0),
    "iq4_xs": (Q.IQ4_XS, Q.IQ4_XS, Q.IQ4_XS),
    "gate_up_differ": (Q.Q4_K, Q.Q5_K, Q.Q8_0),
}
E, k = 5, 3  # odd expert count


def _dims(mix):
    """H, I: multiples of 256 when any projection is a K-quant; else 160 and 96 (not multiples of 64)."""
    return (256, 512) if any(t in K_QUANTS for t in mix) else (160, 96)


_layers: dict = {}
_oracles: dict = {}


def _layer(name):
    if name not in _layers:
        mix = MIXES[name]
        H, I = _dims(mix)
        rng = np.random.default_rng(sorted(MIXES).index(name))
        raw = (random_blocks(mix[0], I, H, rng, lead=(E,)), random_blocks(mix[1], I, H, rng, lead=(E,)),
               random_blocks(mix[2], H, I, rng, lead=(E,)))
        _layers[name] = raw, tuple(dequantized(t, r) for t, r in zip(mix, raw))
    return _layers[name]


def _case(name, T):
    """x [T, H], ids [T, k] with ~20 % of slots skipped (-1) and token 0 fully skipped when T > 1, weights [T, k], and
    the float64 reference output."""
    if (name, T) not in _oracles:
        (_, deq) = _layer(name)
        H = deq[0].shape[2]
        rng = np.random.default_rng(T)
        x = rng.standard_normal((T, H)).astype(np.float32)
        ids = np.argsort(rng.random((T, E)), axis=1)[:, :k].astype(np.int64)
        ids[rng.random((T, k)) < 0.2] = -1
        if T > 1:
            ids[0] = -1
        weights = rng.random((T, k)).astype(np.float32)
        _oracles[(name, T)] = x, ids, weights, moe_float64(*deq, ids, weights, x)
    return _oracles[(name, T)]


def _run(name, x, ids, weights, pool, isa):
    raw, _ = _layer(name)
    mix = MIXES[name]
    out = np.full(x.shape, np.nan, np.float32)  # overwritten everywhere, skipped tokens included
    N.quant_moe_forward(mix[0], raw[0], mix[1], raw[1], mix[2], raw[2], ids, weights, x, out, pool, isa)
    return out


@pytest.mark.parametrize("T", T_SAMPLE)
@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("isa", ISAS)
def test_moe_against_float64_and_reference(pool, isa, mix, T):
    x, ids, weights, exact = _case(mix, T)
    out = _run(mix, x, ids, weights, pool, isa)
    assert np.isfinite(out).all()
    if T > 1:
        assert not out[0].any(), "a token whose slots are all skipped must come out zero"
    assert nmse(out, exact) < NMSE_VS_FLOAT64
    if isa != "reference":
        assert nmse(out, _run(mix, x, ids, weights, pool, "reference")) < NMSE_VS_REFERENCE


@pytest.mark.parametrize("isa", ISAS)
def test_moe_all_slots_skipped_gives_zeros(pool, isa):
    x, ids, weights, _ = _case("q4_k_m", 7)
    out = _run("q4_k_m", x, np.full_like(ids, -1), weights, pool, isa)
    assert np.array_equal(out, np.zeros_like(out))


@pytest.mark.parametrize("isa", ISAS)
def test_moe_over_one_chunk_of_tokens(pool, isa):
    """T = 600 > the 256-token pass of the driver: tokens of later passes see their own routing."""
    x, ids, weights, _ = _case("q8_0", 513)
    x2, ids2, w2 = np.concatenate([x, x[:87]]), np.concatenate([ids, ids[:87]]), np.concatenate([weights, weights[:87]])
    out = _run("q8_0", x2, ids2, w2, pool, isa)
    assert np.array_equal(out[513:], out[:87])


@pytest.mark.parametrize("case, exc, match", [
    ("gate_2d", ValueError, r"gate: expected shape \[E, I, row_bytes\]"),
    ("up_rows", ValueError, r"up: expected shape \[5, 512, 144\]"),
    ("down_type", ValueError, r"down: expected shape \[5, 256, 352\] \(512 Q5_K values = 352 bytes per row\), got "
                              r"\[5, 256, 420\]"),
    ("down_k", ValueError, r"down: 96 values per row is not a multiple of Q4_K's block of 256 values"),
    ("ids_range", ValueError, r"expert_ids: id 5 out of range for 5 experts"),
    ("ids_dtype", TypeError, r"expert_ids: expected int64, got int32"),
    ("weights_shape", ValueError, r"weights: expected shape \[7, 3\]"),
    ("x_dtype", TypeError, r"x: expected float32"),
    ("out_shape", ValueError, r"out: expected shape \[7, 256\]"),
    ("gate_type", ValueError, r"gate_type: unknown GGML type name 'Q9_K'"),
    ("gate_dtype", TypeError, r"gate: expected uint8"),
])
def test_moe_rejects_malformed_arguments(pool, case, exc, match):
    raw, _ = _layer("q4_k_m")
    gate, up, down = raw
    types = ["Q4_K", "Q4_K", "Q6_K"]
    x, ids, weights, _ = _case("q4_k_m", 7)
    out = np.empty_like(x)
    if case == "gate_2d":
        gate = gate.reshape(-1, gate.shape[-1])
    elif case == "up_rows":
        up = up[:, :-1].copy()
    elif case == "down_type":
        types[2] = "Q5_K"  # Q6_K rows (2 x 210 bytes) called Q5_K (2 x 176)
    elif case == "down_k":  # the Q4_0 layer (I = 96) with its down projection called a K-quant
        (gate, up, down), _ = _layer("q4_0")
        types = ["Q4_0", "Q4_0", "Q4_K"]
        x, ids, weights, _ = _case("q4_0", 7)
        out = np.empty_like(x)
    elif case == "ids_range":
        ids = ids.copy()
        ids[2, 1] = 5
    elif case == "ids_dtype":
        ids = ids.astype(np.int32)
    elif case == "weights_shape":
        weights = weights[:, :2].copy()
    elif case == "x_dtype":
        x = x.astype(np.float64)
    elif case == "out_shape":
        out = np.empty((7, 255), np.float32)
    elif case == "gate_type":
        types[0] = "Q9_K"
    elif case == "gate_dtype":
        gate = gate.view(np.int8)
    with pytest.raises(exc, match=match):
        N.quant_moe_forward(types[0], gate, types[1], up, types[2], down, ids, weights, x, out, pool)
