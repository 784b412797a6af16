"""engine.native.dense_matvec_multi: one token through several 16-bit matrices that share x (a layer's q/k/v) in one
pool dispatch. Each row is summed as dense_matvec sums it at T = 1, so the outputs must equal one dense_matvec call
per matrix bit for bit (whose arithmetic test_dense.py holds to float64), on every kernel this CPU runs (the
TESSERA_MAX_ISA-capped ones in a fresh process), on odd shapes, on pools of 1-3 threads, with NaN-prefilled outputs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tessera.engine import native

# (N of each part), K: odd row counts and K not a multiple of 16/32 lanes; the last ones large enough (>= 256 kB of
# weights in all) to be split over the pool, with part boundaries falling inside one thread's range.
CASES = [((1,), 1), ((3, 5, 7), 45), ((37, 1, 64), 257), ((129, 33, 33), 1000), ((1031, 129, 129), 257),
         ((512, 64, 64), 2048)]


def _parts(ns, K, dtypes, g):
    ws = [torch.randn(n, K, generator=g).to(dt) for n, dt in zip(ns, dtypes)]  # [N_i, K] each
    outs = [torch.full((1, n), float("nan")) for n in ns]  # [1, N_i]: every element must be written
    return ws, outs


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("mix", ["bf16", "f16", "mixed"])
def test_equals_one_dense_matvec_per_matrix(threads, mix):
    g = torch.Generator().manual_seed(11)
    pool = native.make_pool(threads)
    for ns, K in CASES:
        dtypes = {"bf16": [torch.bfloat16] * 3, "f16": [torch.float16] * 3,
                  "mixed": [torch.bfloat16, torch.float16, torch.bfloat16]}[mix]
        ws, outs = _parts(ns, K, dtypes, g)
        x = torch.randn(1, K, generator=g)  # [1, K]
        native.dense_matvec_multi(ws, x, outs, pool)
        for w, out in zip(ws, outs):
            ref = torch.full_like(out, float("nan"))
            native.dense_matvec(w, x, ref, pool)
            assert not torch.isnan(out).any(), (ns, K)
            assert torch.equal(out, ref), (ns, K, float((out - ref).abs().max()))
            exact = x.double() @ w.double().T  # [1, N]
            bound = K * 6e-8 * (x.double().abs() @ w.double().abs().T) + 1e-30  # f32 summation error bound
            assert bool(((out.double() - exact).abs() <= bound).all()), (ns, K)


def test_special_values_stay_in_their_rows():
    w = torch.ones(5, 40, dtype=torch.bfloat16)
    w[1, 3], w[2, 39] = float("inf"), float("nan")
    v = torch.ones(3, 40, dtype=torch.bfloat16)
    x = torch.ones(1, 40)
    outs = [torch.full((1, 5), float("nan")), torch.full((1, 3), float("nan"))]
    native.dense_matvec_multi([w, v], x, outs, native.make_pool(2))
    assert outs[0][0, 1] == float("inf") and torch.isnan(outs[0][0, 2])
    assert torch.equal(outs[0][0, [0, 3, 4]], torch.full((3,), 40.0)) and torch.equal(outs[1], torch.full((1, 3), 40.0))


def test_argument_errors_name_the_argument():
    pool = native.make_pool(1)
    w = torch.zeros(4, 8, dtype=torch.bfloat16)
    x = torch.zeros(1, 8)
    out = torch.zeros(1, 4)
    with pytest.raises(ValueError, match="ws"):
        native.dense_matvec_multi([], x, [], pool)
    with pytest.raises(ValueError, match="outs: one per weight"):
        native.dense_matvec_multi([w, w], x, [out], pool)
    with pytest.raises(ValueError, match="one token"):
        native.dense_matvec_multi([w], torch.zeros(2, 8), [torch.zeros(2, 4)], pool)
    with pytest.raises(ValueError, match="x"):
        native.dense_matvec_multi([w, torch.zeros(4, 9, dtype=torch.bfloat16)], x, [out, out.clone()], pool)
    with pytest.raises(TypeError, match="w"):
        native.dense_matvec_multi([torch.zeros(4, 8)], x, [out], pool)
    with pytest.raises(ValueError, match="out"):
        native.dense_matvec_multi([w], x, [torch.zeros(1, 5)], pool)


@pytest.mark.parametrize("cap", ["avx2", "reference"])
def test_isa_capped_kernels_equal_dense_matvec(cap):
    script = textwrap.dedent("""
        import torch
        from tessera.engine import native
        pool = native.make_pool(2)
        g = torch.Generator().manual_seed(5)
        print(native.dense_kernel())
        for ns, K in [((3, 5, 7), 45), ((1031, 129, 129), 257)]:
            for dtypes in ([torch.bfloat16] * 3, [torch.float16, torch.bfloat16, torch.float16]):
                ws = [torch.randn(n, K, generator=g).to(dt) for n, dt in zip(ns, dtypes)]
                x = torch.randn(1, K, generator=g)
                outs = [torch.full((1, n), float("nan")) for n in ns]
                native.dense_matvec_multi(ws, x, outs, pool)
                for w, out in zip(ws, outs):
                    ref = torch.full_like(out, float("nan"))
                    native.dense_matvec(w, x, ref, pool)
                    assert torch.equal(out, ref), (cap, ns, K)
        print("ok")
    """).replace("cap, ", f"{cap!r}, ")
    env = dict(os.environ, TESSERA_MAX_ISA=cap)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    kernel, ok = r.stdout.split()
    assert ok == "ok"
    assert kernel == {"avx2": "AVX2", "reference": "Reference"}[cap] or (cap == "avx2" and kernel == "Reference")
