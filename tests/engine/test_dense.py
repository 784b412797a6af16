"""Dense layers with weights kept as stored: the native bf16/f16 x f32 mat-vec against a float64 reference (every ISA
kernel this CPU has), its argument checks, `engine.dense.Linear`'s path choice, and a bf16 model's logits through the
new path against the old f32-upcast path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hf_reference import CONFIGS, canonical_weights, hf_model

from tessera.engine import dense, native
from tessera.engine.errors import TesseraError
from tessera.engine.experts import TorchExperts
from tessera.engine.model import Qwen3MoeModel, layer_experts
from tests.engine.dense_cases import OUT, W, X, check_argument_errors, run_capped

# Odd shapes: N and K not multiples of 4 rows, 16 or 32 lanes; one matrix large enough to be split over the pool.
SHAPES = [(1, 1), (3, 5), (37, 45), (64, 32), (129, 1000), (17, 2049), (1031, 257)]


def _check(out: torch.Tensor, w: torch.Tensor, x: torch.Tensor, rel: float) -> None:
    ref = x.double() @ w.double().T  # [T, N]
    bound = rel * (x.double().abs() @ w.double().abs().T) + 1e-30  # [T, N] f32 summation error bound
    assert not torch.isnan(out).any(), "output rows left unwritten (NaN prefill survived)"
    err = (out.double() - ref).abs()
    assert bool((err <= bound).all()), f"max err {float(err.max())}, max allowed {float(bound.min())}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reference", [False, True], ids=["kernel", "reference"])
def test_matvec_matches_float64(dtype, reference):
    g = torch.Generator().manual_seed(7)
    pool = native.make_pool(2)
    for N, K in SHAPES:
        w = torch.randn(N, K, generator=g).to(dtype)  # [N, K]
        for T in (1, 2, 3, 4, 5, 9):
            x = torch.randn(T, K, generator=g)  # [T, K]
            out = torch.full((T, N), float("nan"))  # [T, N]
            native.dense_matvec(w, x, out, pool, reference=reference)
            # f32 accumulation: worst case K * 2^-24 of sum |w x|; the double reference: one rounding.
            _check(out, w, x, 1e-6 if reference else K * 6e-8)


@pytest.mark.parametrize("threads", [1, 3])
def test_matvec_any_pool_size(threads):
    g = torch.Generator().manual_seed(8)
    w = torch.randn(1031, 257, generator=g).to(torch.bfloat16)  # 530 kB: split over the pool
    x = torch.randn(3, 257, generator=g)
    out = torch.full((3, 1031), float("nan"))
    native.dense_matvec(w, x, out, native.make_pool(threads))
    _check(out, w, x, 257 * 6e-8)


def test_special_values_propagate():
    w = torch.ones(5, 40, dtype=torch.bfloat16)
    w[1, 3], w[2, 39] = float("inf"), float("nan")
    x = torch.ones(2, 40)
    out = torch.zeros(2, 5)
    native.dense_matvec(w, x, out, native.make_pool(1))
    assert out[:, 0].tolist() == [40.0, 40.0]
    assert torch.isinf(out[:, 1]).all() and torch.isnan(out[:, 2]).all()
    assert out[:, 3:].eq(40.0).all()  # the padding of a 40-wide row (not a multiple of 32) adds nothing


def test_matvec_argument_errors_name_the_argument():
    check_argument_errors(native.dense_matvec, [
        ((W, torch.zeros(10, 2).T, OUT), ValueError, "x: must be C-contiguous"),
        ((torch.zeros(6, 10, 1, dtype=torch.bfloat16), X, OUT), ValueError, "w: expected a non-empty 2-D"),
    ])


@pytest.mark.parametrize("cap", ["avx2", "reference"])
def test_isa_capped_kernels(cap):
    """Each lower kernel, selected with TESSERA_MAX_ISA in a fresh process, against float64 on odd shapes."""
    script = textwrap.dedent("""
        import torch
        from tessera.engine import native
        pool = native.make_pool(2)
        g = torch.Generator().manual_seed(5)
        print(native.dense_kernel())
        for dtype in (torch.bfloat16, torch.float16):
            for N, K in [(3, 5), (37, 45), (129, 1000), (1031, 257)]:
                w = torch.randn(N, K, generator=g).to(dtype)
                for T in (1, 2, 3, 5):
                    x = torch.randn(T, K, generator=g)
                    out = torch.full((T, N), float("nan"))
                    native.dense_matvec(w, x, out, pool)
                    ref = x.double() @ w.double().T
                    bound = K * 6e-8 * (x.double().abs() @ w.double().abs().T) + 1e-30
                    assert bool(((out.double() - ref).abs() <= bound).all()), (dtype, N, K, T)
        print("ok")
    """)
    kernel, ok = run_capped(script, cap)
    assert ok == "ok"
    assert kernel == {"avx2": "AVX2", "reference": "Reference"}[cap] or (cap == "avx2" and kernel == "Reference")


# ------------------------------------------------------------------------------------------------------------ Linear


def test_linear_keeps_16_bit_weights_without_a_copy():
    for dtype in (torch.bfloat16, torch.float16):
        w = torch.randn(33, 70).to(dtype)
        lin = dense.Linear(w, "cpu", "q_proj")
        assert lin.weight.dtype == dtype and lin.weight.data_ptr() == w.data_ptr()
        assert lin.path == "native"
        x = torch.randn(2, 70)
        y = lin(x)
        assert y.dtype == torch.float32 and y.shape == (2, 33)
        torch.testing.assert_close(y, x @ w.float().T, rtol=1e-5, atol=1e-5)


def test_linear_f32_is_exactly_torch():
    w, x = torch.randn(21, 30), torch.randn(4, 30)
    lin = dense.Linear(w, "cpu", "o_proj")
    assert lin.path == "torch-f32"
    assert torch.equal(lin(x), x @ w.T)


def test_linear_f32_holding_bf16_values_is_stored_bf16():
    """GGUF keeps a bf16 model's routers in f32: same values, so the same (native) path as the bf16 tensor."""
    w16 = torch.randn(9, 70).to(torch.bfloat16)
    as32, from16 = dense.Linear(w16.float(), "cpu", "router"), dense.Linear(w16, "cpu", "router")
    assert as32.weight.dtype == torch.bfloat16
    x = torch.randn(3, 70)
    assert torch.equal(as32(x), from16(x))
    nearly = w16.float()
    nearly[4, 5] = nearly[4, 5].item() * (1 + 2**-20)  # one value bf16 cannot hold: stays f32 and exact torch
    lin = dense.Linear(nearly, "cpu", "router")
    assert lin.path == "torch-f32" and torch.equal(lin(x), x @ nearly.T)


def test_linear_long_inputs_and_empty_input():
    w = torch.randn(19, 40).to(torch.float16)  # f16 (bf16 takes the GEMM at every long T: test_dense_gemm.py)
    lin = dense.Linear(w, "cpu", "lm_head")
    x = torch.randn(dense.NATIVE_MAX_TOKENS + 3, 40)  # beyond the native threshold: torch on an upcast
    torch.testing.assert_close(lin(x), x @ w.float().T, rtol=1e-5, atol=1e-5)
    assert lin(torch.zeros(0, 40)).shape == (0, 19)


def test_linear_on_an_accelerator_uses_torch_in_the_weight_dtype():
    """No GPU here: the "meta" device stands in for CUDA (same branch: not the CPU), checking path, dtype and shape."""
    lin = dense.Linear(torch.zeros(5, 7, dtype=torch.bfloat16), "meta", "q_proj")
    assert lin.path == "torch-device" and lin.weight.dtype == torch.bfloat16 and lin.weight.device.type == "meta"
    y = lin(torch.zeros(2, 7, device="meta"))
    assert y.dtype == torch.float32 and y.shape == (2, 5)
    assert dense.Linear(torch.zeros(5, 7), "meta", "router").path == "torch-f32"  # f32 stays f32, off the CPU too


def test_linear_errors_name_the_tensor():
    with pytest.raises(TesseraError, match="tensor lm_head: expected a 2-D"):
        dense.Linear(torch.zeros(2, 3, 4), "cpu", "lm_head")
    with pytest.raises(TesseraError, match="tensor router: dtype torch.int32"):
        dense.Linear(torch.zeros(2, 3, dtype=torch.int32), "cpu", "router")


@pytest.mark.parametrize("knob", ["TESSERA_DENSE_NATIVE_MAX_T", "TESSERA_DENSE_QUANT_MAX_T"])
def test_threshold_env_is_validated(knob):
    r = subprocess.run([sys.executable, "-c", "import tessera.engine.dense"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, **{knob: "many"}))
    assert r.returncode != 0 and knob in r.stderr


# ------------------------------------------------------------------------------------------------------- end to end


def _weights(ref, dtype):
    w = canonical_weights(ref)
    w.tensors = {name: t.to(dtype) for name, t in w.tensors.items()}
    return w


@pytest.mark.parametrize("name", ["dense_layers", "tied"])
def test_bf16_model_matches_f32_upcast_path(name, monkeypatch):
    """The same bf16 weights: kept bf16 (native mat-vecs) vs upcast to f32 at load (the old path). bf16 -> f32 is
    exact, so only the f32 summation order differs: logits agree within 1e-5 of their range."""
    ref = hf_model(CONFIGS[name], seed=4)
    w16 = _weights(ref, torch.bfloat16)
    w32 = _weights(ref, torch.bfloat16)
    w32.tensors = {k: t.float() for k, t in w32.tensors.items()}
    new = Qwen3MoeModel(w16, TorchExperts(layer_experts(w16.config, w16.tensors)))
    with monkeypatch.context() as m:  # the old path: f32 weights in torch, even though they hold bf16 values
        m.setattr(dense, "_bf16_exact", lambda w: False)
        old = Qwen3MoeModel(w32, TorchExperts(layer_experts(w32.config, w32.tensors)))
    assert {lin.path for lin in old.linears} == {"torch-f32"}
    ids = torch.randint(0, ref.config.vocab_size, (13,), generator=torch.Generator().manual_seed(3))
    c_new, c_old = new.forward, old.forward
    cn, co = new.new_cache(16), old.new_cache(16)
    a = [c_new(ids[:9], cn, last_only=False)] + [c_new(ids[i : i + 1], cn) for i in range(9, 13)]  # prefill + decode
    b = [c_old(ids[:9], co, last_only=False)] + [c_old(ids[i : i + 1], co) for i in range(9, 13)]
    a, b = torch.cat(a), torch.cat(b)  # [13, V]
    scale = float(b.max() - b.min())
    assert scale > 1.0
    assert float((a - b).abs().max()) <= 1e-5 * scale
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    # No f32 copy of any 2-D dense weight is held; a tied lm_head is the embedding table itself.
    assert len(new.linears) == 1 + sum(4 + (1 if blk.mlp.__class__.__name__ == "MoE" else 3) for blk in new.layers)
    assert all(lin.weight.dtype == torch.bfloat16 for lin in new.linears)
    if ref.config.tie_word_embeddings:
        assert new.lm_head.weight.data_ptr() == new.embed_tokens.data_ptr()



def test_step_threads_one_torch_thread_only_when_all_native():
    from tessera.engine.experts import TorchExperts

    class PoolExperts(TorchExperts):  # an ExpertBackend running on a native pool
        pool = object()

    w16 = torch.zeros(8, 8, dtype=torch.bfloat16)
    native_lins = [dense.Linear(w16, "cpu", "a"), dense.Linear(w16, "cpu", "b")]
    assert dense.step_torch_threads(native_lins, PoolExperts({})) == 1
    big32 = dense.Linear(torch.randn(8, 64), "cpu", "f32 weights: 2 KiB of 2.25 KiB")
    for lins, experts in [(native_lins, TorchExperts({})), (native_lins + [big32], PoolExperts({})),
                          ([], PoolExperts({}))]:
        assert dense.step_torch_threads(lins, experts) is None
    small32 = dense.Linear(torch.randn(1, 4), "cpu", "router kept f32 by GGUF: 16 B of 272 B")
    assert dense.step_torch_threads(native_lins + [small32], PoolExperts({})) == 1

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with dense.torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with dense.torch_threads(None):
            assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), dense.torch_threads(1):
            raise RuntimeError("step failed")
        assert torch.get_num_threads() == 2  # restored on errors too
    finally:
        torch.set_num_threads(before)
