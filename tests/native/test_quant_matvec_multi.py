"""quant_matvec_multi: a decode step's mat-vecs that share one activation row (a layer's q/k/v) in one pool dispatch.

Its contract is quant_matmul at T = 1 for every weight, bit for bit (same row groups, same kernels, x quantized the
same way), so quant_matmul is the oracle here; quant_matmul itself is checked against gguf.quants.dequantize and float64
in test_quant_matmul.py, and one float64 check here guards against both being wrong the same way.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera.engine.native as N
from tests.native.quant_cases import TYPES, Q, dequantized, nmse, quant_isas, random_blocks

ISAS = quant_isas()
K = 768  # a whole number of blocks for every type (3 super-blocks of 256, 24 blocks of 32)


def _parts(rng, spec):
    """Random blocks for each (qtype, rows) of `spec`."""
    return [(qtype, random_blocks(qtype, rows, K, rng)) for qtype, rows in spec]


@pytest.mark.parametrize("isa", ISAS)
def test_equals_quant_matmul_per_weight_bit_for_bit(pool, isa):
    rng = np.random.default_rng(7)
    # Every type, row counts off the 4-row tile and the 32-row task, one part of a single row.
    parts = _parts(rng, [(t, rows) for t, rows in zip(TYPES, (37, 70, 1, 33, 96, 5))])
    x = rng.standard_normal((1, K)).astype(np.float32)
    outs = [np.full((1, w.shape[0]), np.nan, np.float32) for _, w in parts]
    N.quant_matvec_multi(x, [t for t, _ in parts], [w for _, w in parts], outs, pool, isa)
    exact = []
    for (qtype, w), out in zip(parts, outs):
        alone = np.full_like(out, np.nan)
        N.quant_matmul(qtype, w, x, alone, pool, isa)
        assert np.array_equal(out.view(np.uint32), alone.view(np.uint32)), qtype.name
        exact.append(x.astype(np.float64) @ dequantized(qtype, w).astype(np.float64).T)  # [1, N]
    # int8 activations per 256 values: test_quant_matmul.py's bound, over all 242 outputs (one part of 5 or 1 rows is
    # too small a sample for a statistical bound on its own)
    assert nmse(np.concatenate(outs, axis=1), np.concatenate(exact, axis=1)) < 2e-4


def test_one_thread_pool_and_a_single_weight(pool):
    rng = np.random.default_rng(8)
    (qtype, w), = _parts(rng, [(Q.Q4_K, 65)])
    x = rng.standard_normal((1, K)).astype(np.float32)
    out, alone = np.full((1, 65), np.nan, np.float32), np.full((1, 65), np.nan, np.float32)
    N.quant_matvec_multi(x, [qtype], [w], [out], N.make_pool(1))
    N.quant_matmul(qtype, w, x, alone, pool)
    assert np.array_equal(out, alone)


def _call(pool, **change):
    rng = np.random.default_rng(9)
    w = random_blocks(Q.Q4_K, 8, K, rng)
    args = dict(x=np.zeros((1, K), np.float32), qtypes=[Q.Q4_K], ws=[w], outs=[np.zeros((1, 8), np.float32)])
    args.update(change)
    N.quant_matvec_multi(args["x"], args["qtypes"], args["ws"], args["outs"], pool)


@pytest.mark.parametrize("change, match", [
    (dict(x=np.zeros((2, K), np.float32)), r"x: expected a \[1, K\]"),
    (dict(x=np.zeros((1, 512), np.float32)), r"ws\[0\]"),
    (dict(qtypes=[]), r"qtypes: no weights"),
    (dict(outs=[]), r"one of each per weight, got 1, 1, 0"),
    (dict(outs=[np.zeros((1, 9), np.float32)]), r"outs\[0\]"),
    (dict(qtypes=[Q.F16]), r"qtypes\[0\]: GGML type 1 has no quantized kernel"),
])
def test_malformed_arguments_are_named(pool, change, match):
    with pytest.raises(ValueError, match=match):
        _call(pool, **change)

