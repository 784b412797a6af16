"""quant_matmul_multi: T tokens through several quantized weights that share them (a layer's q/k/v at prefill), with
the tokens quantized once, packed for AVX-512 VNNI's GEMM once per distinct packing (a Q4_K_M layer's Q4_K q/k and Q6_K
v need two), and every weight's row groups in one pool dispatch.

Its contract is one quant_matmul per weight, bit for bit (the same tasks and kernels per (row, token), whatever the
other weights are), so quant_matmul is the oracle here: it is checked against Reference and gguf.quants.dequantize's
values in test_quant_gemm.py and test_quant_matmul.py; one float64 check here guards against both being wrong the
same way. Every token count that changes a path: 1 (quant_matvec_multi), 2..11 (the row paths, one quant_matmul per
weight), 12.. (the shared GEMM: full and ragged 16-token groups, the 256-token task blocks and the one after), 513.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera.engine.native as N
from tests.native.quant_cases import TYPES, Q, dequantized, nmse, quant_isas, random_blocks

ISAS = quant_isas()
K = 768  # a whole number of blocks for every type (3 super-blocks of 256, 24 blocks of 32)
T_CASES = (1, 2, 11, 12, 13, 16, 17, 31, 64, 100, 128, 255, 256, 257, 513)
_pools: dict = {}


def _pool(threads: int):
    if threads not in _pools:
        _pools[threads] = N.make_pool(threads)
    return _pools[threads]


def _parts(rng, spec):
    """Random blocks for each (qtype, rows) of `spec`."""
    return [(qtype, random_blocks(qtype, rows, K, rng)) for qtype, rows in spec]


def _multi(parts, x, pool, isa):
    outs = [np.full((x.shape[0], w.shape[0]), np.nan, np.float32) for _, w in parts]
    N.quant_matmul_multi(x, [t for t, _ in parts], [w for _, w in parts], outs, pool, isa)
    return outs


# Every type in one call (five packings: Q4_K/Q5_K, Q6_K, Q8_0/IQ4_XS, Q4_0), row counts off the 8-row micro-tile and
# the 32-row task, one part of a single row; and a Q4_K_M layer's q/k/v (Q4_K, Q4_K, Q6_K).
SPECS = {"every type": list(zip(TYPES, (37, 70, 1, 33, 96, 5))),
         "q4_k_m qkv": [(Q.Q4_K, 96), (Q.Q4_K, 32), (Q.Q6_K, 32)]}


@pytest.mark.parametrize("spec", sorted(SPECS))
@pytest.mark.parametrize("isa", ISAS)
def test_equals_quant_matmul_per_weight_bit_for_bit(pool, isa, spec):
    rng = np.random.default_rng(11)
    parts = _parts(rng, SPECS[spec])
    xs = rng.standard_normal((max(T_CASES), K)).astype(np.float32)
    for T in T_CASES:
        x = xs[:T]
        for (qtype, w), out in zip(parts, _multi(parts, x, pool, isa)):
            alone = np.full_like(out, np.nan)
            N.quant_matmul(qtype, w, x, alone, pool, isa)
            assert np.isfinite(alone).all()
            assert np.array_equal(out.view(np.uint32), alone.view(np.uint32)), f"T={T} {qtype.name}"


@pytest.mark.parametrize("isa", ISAS)
def test_against_float64_and_across_thread_counts(pool, isa):
    rng = np.random.default_rng(12)
    parts = _parts(rng, SPECS["q4_k_m qkv"])
    x = rng.standard_normal((129, K)).astype(np.float32)
    outs = _multi(parts, x, pool, isa)
    exact = [x.astype(np.float64) @ dequantized(t, w).astype(np.float64).T for t, w in parts]  # [T, N_i]
    # int8 activations per 256 values: test_quant_matmul.py's bound
    assert nmse(np.concatenate(outs, axis=1), np.concatenate(exact, axis=1)) < 2e-4
    for threads in (1, 3):
        for out, other in zip(outs, _multi(parts, x, _pool(threads), isa)):
            assert np.array_equal(out.view(np.uint32), other.view(np.uint32)), f"{threads} vs 2 threads"


def _call(pool, **change):
    rng = np.random.default_rng(13)
    w = random_blocks(Q.Q4_K, 8, K, rng)
    args = dict(x=np.zeros((20, K), np.float32), qtypes=[Q.Q4_K], ws=[w], outs=[np.zeros((20, 8), np.float32)])
    args.update(change)
    N.quant_matmul_multi(args["x"], args["qtypes"], args["ws"], args["outs"], pool)


@pytest.mark.parametrize("change, match", [
    (dict(x=np.zeros(K, np.float32)), r"x: expected a 2-D \[T, K\]"),
    (dict(x=np.zeros((20, 512), np.float32)), r"ws\[0\]"),
    (dict(qtypes=[]), r"qtypes: no weights"),
    (dict(outs=[]), r"one of each per weight, got 1, 1, 0"),
    (dict(outs=[np.zeros((19, 8), np.float32)]), r"outs\[0\]"),
    (dict(qtypes=[Q.F16]), r"qtypes\[0\]: GGML type 1 has no quantized kernel"),
])
def test_malformed_arguments_are_named(pool, change, match):
    with pytest.raises(ValueError, match=match):
        _call(pool, **change)

