"""engine.dense.FusedLinears: a layer's q/k/v projections in one native call when all three are quantized weights on
the dense pool (one token: quant_matvec_multi; 2..QUANT_NATIVE_MAX_TOKENS tokens: quant_matmul_multi, the tokens
quantized and packed once), bit-identical to calling each Linear (whose arithmetic test_quant_dense.py checks against
gguf.quants.dequantize); every other case calls each Linear as before."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tessera.engine import dense, native
from tessera.engine.quantize import quantize
from tessera.engine.quantized import QuantizedMatrix

Q = gguf.GGMLQuantizationType


def _linear(qtype: Q, n: int, k: int = 512, seed: int = 0) -> dense.Linear:
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.05  # [n, k]
    qm = QuantizedMatrix(quantize(w, qtype, "test weight"), qtype, (n, k), "t.weight")
    return dense.Linear(qm, "cpu", f"w{seed}")


def _qkv() -> list[dense.Linear]:
    return [_linear(Q.Q4_K, 96, seed=1), _linear(Q.Q4_K, 32, seed=2), _linear(Q.Q6_K, 32, seed=3)]  # as a Q4_K_M file


@pytest.mark.parametrize("T, name", [(1, "quant_matvec_multi"), (2, "quant_matmul_multi"),
                                     (12, "quant_matmul_multi"), (129, "quant_matmul_multi")])
def test_one_native_call_equal_to_each_linear(monkeypatch, T, name):
    lins = _qkv()
    fused = dense.FusedLinears(lins)
    assert fused.fused
    calls = []
    monkeypatch.setattr(native, "quant_matmul", lambda *a, **k: calls.append(a) or pytest.fail("per-weight call"))
    real = getattr(native._native, name)
    monkeypatch.setattr(native._native, name, lambda *a: calls.append(a) or real(*a))
    x = torch.randn(T, 512, generator=torch.Generator().manual_seed(T))  # [T, K]
    outs = fused(x)
    assert len(calls) == 1
    monkeypatch.undo()
    for lin, y in zip(lins, outs):
        assert y.shape == (T, lin.out_features) and y.dtype == torch.float32
        assert torch.equal(y, lin(x))


def test_beyond_the_native_token_limit_each_linear_runs(monkeypatch):
    lins = _qkv()
    monkeypatch.setattr(dense, "QUANT_NATIVE_MAX_TOKENS", 4)
    monkeypatch.setattr(native._native, "quant_matmul_multi", lambda *a: pytest.fail("fused call beyond the limit"))
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(1))  # [T, K]
    for lin, y in zip(lins, dense.FusedLinears(lins)(x)):
        assert torch.equal(y, lin(x))


def test_not_fused_unless_every_weight_is_quantized_with_one_input_size():
    f32 = dense.Linear(torch.randn(32, 512), "cpu", "f32.weight")
    assert not dense.FusedLinears([_linear(Q.Q4_K, 32), f32]).fused
    assert not dense.FusedLinears([_linear(Q.Q4_K, 32), _linear(Q.Q4_K, 32, k=768)]).fused
    lins = [_linear(Q.Q8_0, 32), f32]
    for T in (1, 20):
        x = torch.randn(T, 512, generator=torch.Generator().manual_seed(2))  # [T, K]
        for lin, y in zip(lins, dense.FusedLinears(lins)(x)):
            assert torch.equal(y, lin(x))
