"""Causal attention over the KV cache (tessera/engine/attention.py, native/src/attention*.cpp): the native kernels and
their scalar reference against a naive float64 softmax on odd lengths, cached starts, GQA groups and key splits over 1-3
threads, the torch path against the same, and a long context end to end against transformers' Qwen3MoeForCausalLM (the
oracle)."""

from __future__ import annotations

import pytest
import torch
from hf_reference import BASE, canonical_weights, hf_model, single_thread  # noqa: F401

from tessera.engine import native
from tessera.engine.attention import attend, native_kernel, uses_native
from tessera.engine.dense import dense_pool
from tessera.engine.experts import TorchExperts
from tessera.engine.kv_cache import KVCache
from tessera.engine.model import Qwen3MoeModel, layer_experts
from tessera.engine.native import make_pool

NATIVE = native.attention_kernel(128) != "Reference"


def _runs(kernel: str) -> bool:
    """Whether `kernel` runs on this CPU (for head dims that are multiples of 32)."""
    cache = KVCache(1, 1, 32, 1)
    cache.write(0, torch.zeros(1, 1, 32), torch.zeros(1, 1, 32))
    try:
        native.attention_bf16(torch.zeros(1, 1, 32), cache.k[0], cache.v[0], 0, 1.0, torch.empty(1, 32), dense_pool(),
                              kernel=kernel)
    except ValueError:
        return False
    return True


KERNELS = {kernel: _runs(kernel)
           for kernel in ("AMX_BF16", "AMX_BF16-emulated", "AVX512_BF16", "AVX512", "AVX2", "Reference")}
# The kernels whose products round q and the probabilities to bf16 (held to bf16_products_ok); the AMX ones on tiles.
BF16_PRODUCTS = ("AMX_BF16", "AMX_BF16-emulated", "AVX512_BF16")


def naive(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """q [nh, T, hd], keys/values [nkv, S, hd] -> [T, nh*hd]: float64, full score matrix, explicit causal mask."""
    nh, T, hd = q.shape
    g = nh // keys.shape[0]
    k, v = keys.double().repeat_interleave(g, 0), values.double().repeat_interleave(g, 0)  # [nh, S, hd]
    scores = q.double() @ k.transpose(1, 2) * hd**-0.5  # [nh, T, S]
    seen = torch.arange(keys.shape[1])[None, :] <= torch.arange(start, start + T)[:, None]  # [T, S]
    out = scores.masked_fill(~seen, float("-inf")).softmax(-1) @ v  # [nh, T, hd]
    return out.transpose(0, 1).reshape(T, nh * hd)


def filled_cache(nkv: int, hd: int, start: int, T: int, seed: int, capacity: int = 1):
    """A bf16 cache of one layer holding start + T random positions (written in two steps, as prefill then more)."""
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(2, nkv, start + T, hd, generator=g)  # [nkv, S, hd] each
    cache = KVCache(1, nkv, hd, capacity)
    cache.reserve(start + T)
    if start:
        cache.write(0, k[:, :start], v[:, :start])
        cache.commit(list(range(start)))
    cache.write(0, k[:, start:], v[:, start:])
    return cache, k.bfloat16().float(), v.bfloat16().float()


SHAPES = [  # nh, nkv, hd, start, T: decode, prefill, prefill after a cached prefix, ragged blocks, g = 1 and g = 3
    (32, 4, 128, 0, 1), (32, 4, 128, 0, 37), (32, 4, 128, 300, 1), (32, 4, 128, 45, 19), (8, 2, 64, 0, 130),
    (4, 4, 32, 31, 33), (6, 2, 96, 64, 65), (3, 1, 32, 1, 16),
    # decode at 31 / 32 / 33 / 8191 keys and a few tokens after 1000 cached (the keys split across threads)
    (32, 4, 128, 30, 1), (32, 4, 128, 31, 1), (32, 4, 128, 32, 1), (32, 4, 128, 8190, 1), (32, 4, 128, 1000, 19),
    (16, 2, 64, 4000, 3), (3, 1, 32, 2047, 1),
]


def bf16_products_ok(out: torch.Tensor, q, keys, values, start: int, scale: float) -> tuple[bool, str]:
    """Whether `out` is what the AVX512_BF16 kernel may give: the float64 softmax of the scores of q * scale rounded to
    bf16 (the kernel rounds the query once, then its products are exact), up to the rounding of every probability to
    bf16. With the denominator summing the rounded weights, that error is, per output, sum_j w_j e_j (v_j - out) with
    |e_j| <= 2^-8: held to 6 sigma of it (e_j uniform) per element, and its RMS to 1.2 sigma (a lost or doubled key
    shows up as a bias beyond that even at 8191 keys)."""
    nh, T, hd = q.shape
    g = nh // keys.shape[0]
    k, v = keys.double().repeat_interleave(g, 0), values.double().repeat_interleave(g, 0)  # [nh, S, hd]
    scores = (q * scale).bfloat16().double() @ k.transpose(1, 2)  # [nh, T, S]
    seen = torch.arange(keys.shape[1])[None, :] <= torch.arange(start, start + T)[:, None]  # [T, S]
    w = scores.masked_fill(~seen, float("-inf")).softmax(-1)  # [nh, T, S]
    want = w @ v  # [nh, T, hd]
    w2 = w * w
    spread = (w2 @ (v * v) - 2 * want * (w2 @ v) + want * want * w2.sum(-1, keepdim=True)).clamp(min=0)  # [nh, T, hd]
    sigma = 2.0**-8 / 3**0.5 * spread.sqrt()
    err = (out.reshape(T, nh, hd).transpose(0, 1).double() - want).abs()  # [nh, T, hd]
    floor = 2e-6 * float(values.abs().max())  # f32 sums
    worst = float((err - 6 * sigma - floor).max())
    rms = float(err.square().mean().sqrt()), float(sigma.square().mean().sqrt())
    ok = worst <= 0 and rms[0] <= 1.2 * rms[1] + floor
    return ok, f"max excess over 6 sigma {worst:.3g}, rms error {rms[0]:.3g} vs sigma {rms[1]:.3g}"


@pytest.mark.parametrize("nh,nkv,hd,start,T", SHAPES)
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_native_attention_equals_naive(nh, nkv, hd, start, T, kernel, threads):
    if not KERNELS[kernel]:
        pytest.skip(f"no {kernel} attention kernel on this CPU")
    if kernel == "Reference" and (threads != 2 or start + T > 2048):
        pytest.skip("the scalar reference is checked once per shape, below 2048 positions")
    if kernel == "AMX_BF16-emulated" and threads != 2:
        pytest.skip("the tile emulator is checked once per shape (threads split rows the same way on every kernel)")
    cache, keys, values = filled_cache(nkv, hd, start, T, seed=start + T)
    q = torch.randn(nh, T, hd, generator=torch.Generator().manual_seed(7))  # [nh, T, hd]
    out = torch.full((T, nh * hd), float("nan"))
    native.attention_bf16(q, cache.k[0], cache.v[0], start, hd**-0.5, out, make_pool(threads), kernel=kernel)
    if kernel in BF16_PRODUCTS:
        ok, why = bf16_products_ok(out, q, keys, values, start, hd**-0.5)
        assert ok, why
        return
    want = naive(q, keys, values, start)  # f32 sums: errors scale with the values, not the (averaged, small) outputs
    assert float((out.double() - want).abs().max()) < 2e-6 * float(values.abs().max())


@pytest.mark.skipif(not KERNELS["AMX_BF16"], reason="this CPU does not run AMX tiles")
@pytest.mark.parametrize("nh,nkv,hd,start,T", [(32, 4, 128, 0, 300), (32, 4, 128, 1000, 19), (6, 2, 96, 64, 65),
                                              (3, 1, 32, 1, 16)])
def test_amx_tiles_match_their_emulator_bit_for_bit(nh, nkv, hd, start, T):
    """The real TDPBF16PS and the emulator (which follows the SDM's pseudocode) give the same bits, so the emulated
    kernel's correctness, tested on every CPU with avx512_bf16, is the hardware kernel's."""
    cache, _, _ = filled_cache(nkv, hd, start, T, seed=11)
    q = torch.randn(nh, T, hd, generator=torch.Generator().manual_seed(12))
    hw, emu = torch.empty(T, nh * hd), torch.empty(T, nh * hd)
    native.attention_bf16(q, cache.k[0], cache.v[0], start, hd**-0.5, hw, make_pool(2), kernel="AMX_BF16")
    native.attention_bf16(q, cache.k[0], cache.v[0], start, hd**-0.5, emu, make_pool(2), kernel="AMX_BF16-emulated")
    assert torch.equal(hw, emu)


def test_bf16_kernel_check_catches_a_lost_key():
    """The AVX512_BF16 tolerance is tight enough to see one key of 8191 left out (the kernel's exact twin is used as
    the 'faulty' output, with key 4000's weight removed)."""
    nh, nkv, hd, S = 8, 1, 128, 8191
    cache, keys, values = filled_cache(nkv, hd, S - 1, 1, seed=3)
    q = torch.randn(nh, 1, hd, generator=torch.Generator().manual_seed(9))
    rounded_q = (q * hd**-0.5).bfloat16().float() / hd**-0.5
    keep = torch.ones(S, dtype=torch.bool)
    keep[4000] = False
    lost = naive(rounded_q, keys[:, keep], values[:, keep], S - 2).float()  # [1, nh*hd]: 8190 keys, all seen
    exact = naive(rounded_q, keys, values, S - 1).float()
    assert bf16_products_ok(exact, q, keys, values, S - 1, hd**-0.5)[0]
    assert not bf16_products_ok(lost, q, keys, values, S - 1, hd**-0.5)[0]


def test_unknown_kernel_is_refused_by_name():
    cache, _, _ = filled_cache(1, 32, 0, 2, seed=0)
    with pytest.raises(ValueError, match="kernel: 'AMX'"):
        native.attention_bf16(torch.randn(2, 2, 32), cache.k[0], cache.v[0], 0, 1.0, torch.empty(2, 64), dense_pool(),
                              kernel="AMX")


@pytest.mark.parametrize("start,T", [(0, 1), (0, 50), (70, 1), (70, 29)])
def test_torch_path_equals_naive_and_native(start, T):
    nh, nkv, hd = 8, 2, 32
    cache, keys, values = filled_cache(nkv, hd, start, T, seed=T)
    q = torch.randn(nh, T, hd, generator=torch.Generator().manual_seed(3))
    S = start + T
    mask = torch.arange(S)[None, :] <= torch.arange(start, S)[:, None]  # [T, S]
    want = naive(q, keys, values, start)
    f32 = KVCache(1, nkv, hd, S, dtype=torch.float32)  # a float32 cache always takes the torch path
    f32.write(0, keys, values)
    assert not uses_native(f32, 0)
    assert torch.allclose(attend(q, f32, 0, start, mask).double(), want, atol=1e-5)
    if native_kernel(hd) != "Reference":
        assert uses_native(cache, 0)
        got = attend(q, cache, 0, start, mask)
        if T > 1 and native.attention_prefill_kernel(hd) in BF16_PRODUCTS:  # prefill's default where the CPU has it
            ok, why = bf16_products_ok(got, q, keys, values, start, hd**-0.5)
            assert ok, why
        else:
            assert torch.allclose(got.double(), want, atol=1e-5)


def test_key_tiles_round_trip_through_growth_and_copies():
    cache, keys, values = filled_cache(3, 32, 40, 33, seed=1, capacity=8)
    k, v = cache.keys_values(0, 73)
    assert torch.equal(k, keys) and torch.equal(v, values)
    cache.commit(list(range(40, 73)))
    cache.reserve(1000)
    copy = cache.copy_prefix(50)
    assert torch.equal(cache.keys_values(0, 73)[0], keys)
    k50, v50 = copy.keys_values(0, 50)
    assert torch.equal(k50, keys[:, :50]) and torch.equal(v50, values[:, :50])


def test_bad_arguments_name_the_argument():
    cache, _, _ = filled_cache(2, 32, 0, 4, seed=0)
    q, out = torch.randn(4, 4, 32), torch.empty(4, 128)
    with pytest.raises(ValueError, match="start"):
        native.attention_bf16(q, cache.k[0], cache.v[0], cache.capacity, 1.0, out, dense_pool())
    with pytest.raises(ValueError, match="query heads"):
        native.attention_bf16(torch.randn(3, 4, 32), cache.k[0], cache.v[0], 0, 1.0, torch.empty(4, 96), dense_pool())
    with pytest.raises(TypeError, match="q: expected float32"):
        native.attention_bf16(q.double(), cache.k[0], cache.v[0], 0, 1.0, out, dense_pool())
    with pytest.raises(ValueError, match="out"):
        native.attention_bf16(q, cache.k[0], cache.v[0], 0, 1.0, torch.empty(4, 127), dense_pool())


# GQA with a head dim the native kernel takes (hd 32, 8 query heads on 2 KV heads), long enough for many key blocks.
LONG = dict(BASE, hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=2048)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_long_context_matches_transformers(kv_dtype):
    """700 tokens of prefill, 300 more with 700 cached (a second turn), then 12 decode steps at ~1000 positions.
    A float32 cache (torch path) is held to 1e-4 of the logit range; the bf16 cache (native path where the CPU has
    AVX-512) to the bounds of test_model_vs_hf's bf16 test: median 3e-3 of the range, KL 5e-4, top-1 0.95."""
    ref = hf_model(LONG, seed=4)
    w = canonical_weights(ref)
    model = Qwen3MoeModel(w, TorchExperts(layer_experts(w.config, w.tensors)), kv_dtype=kv_dtype)
    ids = torch.randint(0, ref.config.vocab_size, (1012,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        theirs = ref(ids[None]).logits[0]  # [1012, V]
    cache = model.new_cache(16)
    if kv_dtype == torch.bfloat16:
        assert uses_native(cache, 0) == (native_kernel(32) != "Reference")
    parts = [model.forward(ids[:700], cache, last_only=False), model.forward(ids[700:1000], cache, last_only=False)]
    parts += [model.forward(ids[i : i + 1], cache) for i in range(1000, 1012)]
    ours = torch.cat(parts)  # [1012, V]
    span = float(theirs.max() - theirs.min())
    per_position = (ours - theirs).abs().max(-1).values / span  # [1012]
    if kv_dtype == torch.float32:
        assert float(per_position.max()) <= 1e-4
        return
    kl = torch.nn.functional.kl_div(ours.log_softmax(-1), theirs.log_softmax(-1), log_target=True, reduction="none")
    top1 = float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())
    assert float(per_position.median()) < 3e-3 and float(kl.sum(-1).mean()) < 5e-4 and top1 >= 0.95
