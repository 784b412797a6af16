"""The bf16 prefill GEMM (native.dense_gemm_bf16: vdpbf16ps, or AMX bf16 tiles where granted, on bf16 weights read in
place) against a float64 matmul of the same operands (x rounded to bf16 by torch, the weights as stored), on odd shapes
and every T from 1 to 513, each product path by name (the tiles through the emulator on any avx512_bf16 CPU, equal to
the hardware's bit for bit where it has AMX); its argument checks; and engine.dense.Linear's choice of it. Skipped
where the CPU has no avx512_bf16."""

from __future__ import annotations

import pytest
import torch

from tessera.engine import dense, native
from tests.engine.dense_cases import (
    OUT,
    W,
    X,
    capped_kernel_script,
    check_argument_errors,
    check_linear_threshold,
    run_capped,
)

needs_gemm = pytest.mark.skipif(not native.dense_gemm_bf16_available(), reason="CPU lacks avx512_bf16")

# N, K: N around the 16-row panels and 64-row tasks, K odd, below one 32-value vector, and over one 256-pair K block.
SHAPES = [(1, 1), (3, 5), (37, 45), (64, 32), (65, 513), (129, 1000), (17, 2049), (200, 1031)]


def _check(out: torch.Tensor, w: torch.Tensor, x: torch.Tensor) -> None:
    """out against the float64 product of bf16(x) and w: only the f32 summation differs (products of two bf16 values
    are exact in f32), so the error is at most ~K * 2^-24 of sum |x w| (6e-8 leaves a little room)."""
    xb = x.to(torch.bfloat16).double()  # [T, K] round to nearest even, as vcvtne2ps2bf16
    ref = xb @ w.double().T  # [T, N]
    bound = w.shape[1] * 6e-8 * (xb.abs() @ w.double().abs().T) + 1e-30  # [T, N]
    assert not torch.isnan(out).any(), "output left unwritten (NaN prefill survived)"
    err = (out.double() - ref).abs()
    assert bool((err <= bound).all()), f"max err {float(err.max())} (T={x.shape[0]}, N, K={tuple(w.shape)})"


@needs_gemm
def test_every_token_count_from_1_to_513():
    g = torch.Generator().manual_seed(11)
    pool = native.make_pool(2)
    w = torch.randn(37, 45, generator=g).to(torch.bfloat16)  # [N, K]
    for T in range(1, 514):
        x = torch.randn(T, 45, generator=g)  # [T, K]
        out = torch.full((T, 37), float("nan"))  # [T, N]
        native.dense_gemm_bf16(w, x, out, pool)
        _check(out, w, x)


@needs_gemm
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_odd_shapes_match_float64(threads):
    g = torch.Generator().manual_seed(12)
    pool = native.make_pool(threads)
    for N, K in SHAPES:
        w = torch.randn(N, K, generator=g).to(torch.bfloat16)  # [N, K]
        for T in (1, 5, 6, 7, 16, 33, 128, 257, 513):
            x = torch.randn(T, K, generator=g)  # [T, K]
            out = torch.full((T, N), float("nan"))  # [T, N]
            native.dense_gemm_bf16(w, x, out, pool)
            _check(out, w, x)


TILE_MODES = ["vector", "emulated"] + (["amx"] if native.dense_gemm_bf16_amx_available() else [])


@needs_gemm
@pytest.mark.parametrize("tiles", TILE_MODES)
def test_each_product_path_matches_float64(tiles):
    """Token counts around the tiles' 32 (the rest on the vector tile), N around the whole 64-row blocks the tiles
    take (partial blocks on the vector tile), K odd and past a 256-pair K block; the tiles take all of K at once up
    to 4096 and blocks of 256 pairs past it (K = 4100: C tiles accumulated in the output across blocks)."""
    g = torch.Generator().manual_seed(15)
    pool = native.make_pool(2)
    for N, K in [(64, 32), (100, 70), (130, 513), (192, 1031), (65, 2049), (64, 4100)]:
        w = torch.randn(N, K, generator=g).to(torch.bfloat16)  # [N, K]
        for T in (1, 31, 32, 33, 64, 100):
            x = torch.randn(T, K, generator=g)  # [T, K]
            out = torch.full((T, N), float("nan"))  # [T, N]
            native.dense_gemm_bf16(w, x, out, pool, tiles)
            _check(out, w, x)


@needs_gemm
def test_the_tiles_equal_their_emulator_and_auto_takes_them_where_granted():
    g = torch.Generator().manual_seed(16)
    pool = native.make_pool(2)
    w = torch.randn(192, 600, generator=g).to(torch.bfloat16)  # [N, K]
    x = torch.randn(70, 600, generator=g)  # [T, K]: two tile token blocks and 6 vector tokens
    runs = {}
    for tiles in TILE_MODES + ["auto"]:
        runs[tiles] = torch.full((70, 192), float("nan"))
        native.dense_gemm_bf16(w, x, runs[tiles], pool, tiles)
    assert not torch.equal(runs["vector"], runs["emulated"])  # the tiles really ran (another summation order)
    assert torch.equal(runs["vector"][64:], runs["emulated"][64:])  # the last 6 tokens: the vector tile either way
    if native.dense_gemm_bf16_amx_available():
        assert torch.equal(runs["amx"], runs["emulated"])
        assert torch.equal(runs["auto"], runs["amx"])
    else:
        assert torch.equal(runs["auto"], runs["vector"])


@needs_gemm
def test_a_bad_tile_mode_is_named():
    w, x, out = torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(2, 8), torch.zeros(2, 4)
    with pytest.raises(ValueError, match="tiles: 'auto', 'vector', 'amx' or 'emulated', got 'tile'"):
        native.dense_gemm_bf16(w, x, out, native.make_pool(1), "tile")
    if not native.dense_gemm_bf16_amx_available():
        with pytest.raises(RuntimeError, match="AMX bf16 tiles are not available"):
            native.dense_gemm_bf16(w, x, out, native.make_pool(1), "amx")


@needs_gemm
def test_weights_are_read_in_place_from_a_strided_parent():
    """A row slice of a larger matrix (C-contiguous view): nothing past its last row or column is read into a result."""
    g = torch.Generator().manual_seed(13)
    big = torch.randn(80, 33, generator=g).to(torch.bfloat16)
    big[70:] = float("nan")  # rows after the view: a read past N would poison the last panel
    w = big[:70]  # [70, 33], odd K: the last pair of each row straddles into the next row's first value
    x = torch.randn(20, 33, generator=g)
    out = torch.full((20, 70), float("nan"))
    native.dense_gemm_bf16(w, x, out, native.make_pool(2))
    _check(out, w, x)


@needs_gemm
@pytest.mark.parametrize("tiles, N, K, T", [("vector", 70, 40, 20), ("emulated", 64, 64, 32), ("auto", 70, 40, 33)])
def test_special_values_propagate(tiles, N, K, T):
    """Inf and NaN weights reach their outputs on every path; the zero padding past K and N adds nothing (vector: K = 40
    and N = 70 inside one panel; the tiles: a whole 64-row block)."""
    w = torch.ones(N, K, dtype=torch.bfloat16)
    w[1, 3], w[2, K - 1], w[N - 1, 0] = float("inf"), float("nan"), float("-inf")
    x = torch.ones(T, K)
    out = torch.zeros(T, N)
    native.dense_gemm_bf16(w, x, out, native.make_pool(2), tiles)
    assert out[:, 0].eq(float(K)).all() and out[:, 3:N - 1].eq(float(K)).all()
    assert torch.isposinf(out[:, 1]).all() and torch.isnan(out[:, 2]).all() and torch.isneginf(out[:, N - 1]).all()


@needs_gemm
def test_argument_errors_name_the_argument():
    check_argument_errors(native.dense_gemm_bf16, [
        ((W.half(), X, OUT), TypeError, "w: the bf16 GEMM takes bfloat16 weights, got float16"),
    ])


def test_isa_cap_turns_it_off_with_a_clear_error():  # the Linear takes the widening GEMM (test_dense_gemm_f32.py)
    assert run_capped(capped_kernel_script("dense_gemm_bf16", "GEMM_AVAILABLE", "avx512_bf16"), "avx2") == ["ok"]


# ------------------------------------------------------------------------------------------------------------ Linear


@needs_gemm
def test_linear_uses_the_gemm_from_its_threshold_on(monkeypatch):
    g = torch.Generator().manual_seed(14)
    w = torch.randn(33, 70, generator=g).to(torch.bfloat16)
    calls = check_linear_threshold(monkeypatch, "dense_gemm_bf16", w, _check, seed=15)
    f16 = dense.Linear(w.half(), "cpu", "q_proj")  # f16 weights: never this GEMM (dense_gemm_f32 past the threshold)
    x = torch.randn(20, 70, generator=g)
    torch.testing.assert_close(f16(x), x @ w.half().float().T, rtol=1e-5, atol=1e-5)
    assert calls == [dense.GEMM_MIN_TOKENS, dense.NATIVE_MAX_TOKENS + 3]


# ------------------------------------------------------------------------------------------------------- end to end


@needs_gemm
def test_bf16_model_prefill_through_the_gemm_matches_the_f32_path(monkeypatch):
    """A bf16 model's 24-token prefill (every dense weight through the GEMM) against the same weights upcast to f32 in
    torch. The only differences are the activations' rounding to bf16 (relative 2^-9 per value) and f32 summation
    order, so the logits agree within 2 % of their range; a wrong panel, row or token in the GEMM moves logits by
    their own scale."""
    from hf_reference import CONFIGS, canonical_weights, hf_model

    from tessera.engine.experts import TorchExperts
    from tessera.engine.model import Qwen3MoeModel, layer_experts

    ref = hf_model(CONFIGS["dense_layers"], seed=4)

    def weights(dtype):
        w = canonical_weights(ref)
        w.tensors = {name: t.to(torch.bfloat16).to(dtype) for name, t in w.tensors.items()}
        return w

    w16, w32 = weights(torch.bfloat16), weights(torch.float32)
    new = Qwen3MoeModel(w16, TorchExperts(layer_experts(w16.config, w16.tensors)))
    with monkeypatch.context() as m:
        m.setattr(dense, "_bf16_exact", lambda w: False)
        old = Qwen3MoeModel(w32, TorchExperts(layer_experts(w32.config, w32.tensors)))
    assert {lin.path for lin in new.linears} == {"native"} and {lin.path for lin in old.linears} == {"torch-f32"}
    calls = []
    real = native.dense_gemm_bf16
    monkeypatch.setattr(native, "dense_gemm_bf16", lambda *a: (calls.append(1), real(*a)))
    ids = torch.randint(0, ref.config.vocab_size, (24,), generator=torch.Generator().manual_seed(6))
    a = new.forward(ids, new.new_cache(32), last_only=False)  # [24, V]
    b = old.forward(ids, old.new_cache(32), last_only=False)
    assert len(calls) >= len(new.linears)  # every dense weight went through the GEMM at least once
    scale = float(b.max() - b.min())
    assert scale > 1.0
    assert float((a - b).abs().max()) <= 0.02 * scale
