"""The native RMSNorm and residual add over activation rows (native/src/row_norm.cpp), which the decoder layer runs at
prefill on the CPU: against engine.model.rms_norm computed in float64, the fused residual add in place, thread counts,
odd widths, and bad arguments named."""

from __future__ import annotations

import pytest
import torch

from tessera.engine import native
from tessera.engine.model import rms_norm
from tessera.engine.native import make_pool


def _rows(T: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, n, generator=g) * 3, torch.randn(T, n, generator=g), torch.rand(n, generator=g) + 0.5


@pytest.mark.parametrize("T,n", [(1, 2048), (37, 2048), (130, 96), (5, 7)])
@pytest.mark.parametrize("threads", [1, 3])
def test_norm_matches_float64(T, n, threads):
    x, _, w = _rows(T, n, seed=T + n)
    out = torch.full_like(x, float("nan"))
    native.rms_norm_rows(x, w, 1e-6, out, make_pool(threads))
    want = rms_norm(x.double(), w.double(), 1e-6)  # [T, n]
    # f32 products and the f32 rounding of the mean: a few ulps of each value
    assert torch.allclose(out.double(), want, rtol=4e-7, atol=0), float((out.double() - want).abs().max())


def test_residual_add_is_fused_in_place_and_threads_do_not_change_bits():
    x, add, w = _rows(70, 2048, seed=1)
    want_h = x + add  # [T, H]: f32 adds, the same bits torch gives
    h1, h2 = x.clone(), x.clone()
    out1, out2 = torch.empty_like(x), torch.empty_like(x)
    native.rms_norm_rows(h1, w, 1e-6, out1, make_pool(1), add=add)
    native.rms_norm_rows(h2, w, 1e-6, out2, make_pool(3), add=add)
    assert torch.equal(h1, want_h) and torch.equal(h2, want_h)
    assert torch.equal(out1, out2)
    assert torch.allclose(out1.double(), rms_norm(want_h.double(), w.double(), 1e-6), rtol=4e-7, atol=0)


def test_add_rows():
    x, add, _ = _rows(33, 100, seed=2)
    dst = x.clone()
    native.add_rows(dst, add, make_pool(2))
    assert torch.equal(dst, x + add)


def test_bad_arguments_are_named():
    x, add, w = _rows(4, 8, seed=3)
    pool = make_pool(1)
    with pytest.raises(ValueError, match="out"):
        native.rms_norm_rows(x, w, 1e-6, torch.empty(3, 8), pool)
    with pytest.raises(ValueError, match="add"):
        native.rms_norm_rows(x, w, 1e-6, torch.empty(4, 8), pool, add=torch.zeros(4, 9))
    with pytest.raises(TypeError, match="x"):
        native.rms_norm_rows(x.double(), w, 1e-6, torch.empty(4, 8), pool)
    with pytest.raises(ValueError, match="x"):
        native.rms_norm_rows(x.t(), w[:4], 1e-6, torch.empty(8, 4), pool)  # not contiguous
    with pytest.raises(ValueError, match="src"):
        native.add_rows(x, torch.zeros(3), pool)
