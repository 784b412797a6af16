"""The widening prefill GEMM (native.dense_gemm_f32: bf16 or f16 weights read in place and widened exactly to f32,
x in f32, an AVX2 FMA register tile) against a float64 matmul of the same operands, on shapes around its 8-row panels,
16-column tiles, 64-row tasks and 256-value K blocks and every T from 1 to 40 and past; the property its summation
order gives (a token's outputs do not depend on the other tokens of the call); its argument checks and the ISA cap;
and engine.dense.Linear's choice of it (bf16 weights where the CPU has no avx512_bf16, f16 weights everywhere).
Skipped where the CPU has no AVX2."""

from __future__ import annotations

import pytest
import torch

from tessera.engine import dense, native
from tests.engine.dense_cases import capped_kernel_script, check_argument_errors, check_linear_threshold, run_capped

needs_gemm = pytest.mark.skipif(not native.dense_gemm_f32_available(), reason="CPU lacks avx2/fma/f16c")

# N around the 8-row panels, 16-column tiles and 64-row tasks; K below 8 (the scalar tail only), odd, and past one
# 256-value block (chained through the output).
SHAPES = [(1, 1), (3, 5), (8, 8), (37, 45), (64, 32), (65, 513), (129, 1000), (17, 2049), (200, 1031)]


def _check(out: torch.Tensor, w: torch.Tensor, x: torch.Tensor) -> None:
    """out against the float64 product of x and the widened w: each of the K FMAs rounds once in f32, so the error
    is at most ~K * 2^-24 of sum |x w| (6e-8 leaves a little room)."""
    ref = x.double() @ w.double().T  # [T, N]
    bound = w.shape[1] * 6e-8 * (x.double().abs() @ w.double().abs().T) + 1e-30  # [T, N]
    assert not torch.isnan(out).any(), "output left unwritten (NaN prefill survived)"
    err = (out.double() - ref).abs()
    assert bool((err <= bound).all()), f"max err {float(err.max())} (T={x.shape[0]}, N, K={tuple(w.shape)})"


@needs_gemm
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_odd_shapes_match_float64(dtype, threads):
    g = torch.Generator().manual_seed(21)
    pool = native.make_pool(threads)
    for N, K in SHAPES:
        w = torch.randn(N, K, generator=g).to(dtype)  # [N, K]
        for T in (1, 5, 6, 7, 12, 13, 16, 33, 128, 257):
            x = torch.randn(T, K, generator=g)  # [T, K]
            out = torch.full((T, N), float("nan"))  # [T, N]
            native.dense_gemm_f32(w, x, out, pool)
            _check(out, w, x)


@needs_gemm
def test_every_token_count_and_a_token_alone_gives_the_same_bits():
    """Each (row, token) sums its K products in K order whatever tile holds it: the outputs of a token computed in a
    batch of T equal, bit for bit, those of the token computed alone (the same holds for every T from 1 to 40)."""
    g = torch.Generator().manual_seed(22)
    pool = native.make_pool(2)
    w = torch.randn(70, 600, generator=g).to(torch.bfloat16)  # [N, K]: a partial task, two K blocks and a tail
    x = torch.randn(40, 600, generator=g)  # [T, K]
    alone = torch.empty(40, 70)
    for t in range(40):
        native.dense_gemm_f32(w, x[t : t + 1].contiguous(), alone[t : t + 1], pool)
    _check(alone, w, x)
    for T in range(1, 41):
        out = torch.full((T, 70), float("nan"))
        native.dense_gemm_f32(w, x[:T].contiguous(), out, pool)
        assert torch.equal(out, alone[:T]), f"T={T}"


@needs_gemm
def test_special_values_propagate():
    pool = native.make_pool(2)
    w = torch.ones(24, 40, dtype=torch.bfloat16)
    w[3, 7] = float("inf")
    w[5, 0] = float("nan")
    x = torch.ones(3, 40)
    out = torch.empty(3, 24)
    native.dense_gemm_f32(w, x, out, pool)
    assert torch.isinf(out[:, 3]).all() and torch.isnan(out[:, 5]).all()
    others = [i for i in range(24) if i not in (3, 5)]
    assert torch.equal(out[:, others], torch.full((3, 22), 40.0))


@needs_gemm
def test_bad_arguments_are_named():
    check_argument_errors(native.dense_gemm_f32)


def test_isa_cap_turns_it_off_with_a_clear_error():  # the Linear takes the scalar reference mat-vec
    assert run_capped(capped_kernel_script("dense_gemm_f32", "GEMM_F32_AVAILABLE", "AVX2"), "reference") == ["ok"]


# ------------------------------------------------------------------------------------------------------------ Linear


@needs_gemm
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_linear_takes_it_where_no_bf16_gemm_runs(monkeypatch, dtype):
    """f16 weights everywhere, bf16 weights where dense_gemm_bf16 is unavailable: the widening GEMM from
    GEMM_MIN_TOKENS tokens on, at any T (past NATIVE_MAX_TOKENS too); the exact mat-vec below."""
    if dtype == torch.bfloat16:
        monkeypatch.setattr(dense, "GEMM_AVAILABLE", False)  # as on a CPU without avx512_bf16
    w = torch.randn(33, 70, generator=torch.Generator().manual_seed(23)).to(dtype)
    check_linear_threshold(monkeypatch, "dense_gemm_f32", w, _check, seed=24)
