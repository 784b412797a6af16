"""The q8_0 KV cache (tessera/engine/kv_q8.py, native/src/attention_q8*.cpp): the block quantizer against float64
maths and against the native one byte for byte, the cache's layout through writes, growth and copies, the native
kernels (AVX512_VNNI, AVX2, Reference: each one this CPU runs) against a float64 softmax on the dequantized cache (odd
lengths 1..8191, GQA groups 1/3/4/8, 1-3 threads, NaN-prefilled outputs), the torch path, and the option's plumbing.
The model-level checks (q8_0 against bf16 logits, the native decode step) are in test_kv_q8_model.py."""

from __future__ import annotations

import pytest
import torch

from tessera.engine import kv_q8, native
from tessera.engine.attention import attend, uses_native
from tessera.engine.dense import dense_pool
from tessera.engine.kv_cache import KVCache, kv_bytes, kv_dtype
from tessera.engine.native import make_pool


def _runs(kernel: str) -> bool:
    cache = KVCache(1, 1, 32, 32, dtype=torch.int8)
    cache.write(0, torch.zeros(1, 1, 32), torch.zeros(1, 1, 32))
    try:
        native.attention_q8(torch.zeros(1, 1, 32), cache.k[0], cache.ks[0], cache.v[0], cache.vs[0], 0, 1.0,
                            torch.empty(1, 32), dense_pool(), kernel=kernel)
    except ValueError:
        return False
    return True


KERNELS = {kernel: _runs(kernel) for kernel in ("AVX512_VNNI", "AVX2", "Reference")}
# The int8 kernels' levels for the weights p_j * dv_j,b (the uint8 step is max / LEVELS): VNNI's vpdpbusd takes
# 0..255; AVX2's vpmaddubsw 0..127, so that no int16 pair sum saturates (native/src/attention_q8_avx2.cpp).
LEVELS = {"AVX512_VNNI": 255, "AVX2": 127}


def _blocks(n: int, seed: int) -> torch.Tensor:
    """[n, 32] float32 blocks of very different sizes: zeros, tiny (f16-subnormal scales), ordinary, huge, one-hot."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g) * torch.logspace(-9, 6, n)[torch.randperm(n, generator=g)].unsqueeze(1)
    x[0] = 0
    x[1] = 0
    x[1, 5] = -3.0
    x[2] = torch.arange(32) - 16.0  # ties: x / d lands on .5 for some
    return x


def test_quantizer_is_the_nearest_multiple_of_the_f16_scale():
    x = _blocks(4000, seed=1)
    q, d = kv_q8.quantize_q8_0(x)
    x64, d64, q64 = x.double(), d.double(), q.double()  # [n, 32], [n, 1], [n, 32]
    amax = x64.abs().amax(1, keepdim=True)
    # d is amax / 127 rounded once to f16 (relative error <= 2^-11, or half an f16 subnormal step)
    assert torch.all((d64 - amax / 127).abs() <= torch.maximum(2.0**-11 * amax / 127, torch.tensor(2.0**-25)))
    assert d.dtype == torch.float16 and q.dtype == torch.int8 and int(q.abs().max()) <= 127
    # q is the nearest integer to x / d in [-127, 127] (0 where d is 0): the stored q * d is the nearest multiple
    ratio = torch.where(d64 > 0, x64 / d64, torch.zeros_like(x64))
    assert torch.all((ratio.clamp(-127, 127) - q64).abs() <= 0.5 + 1e-6)
    err = (q64 * d64 - x64).abs()
    assert torch.all(err <= d64 / 2 + (amax - 127 * d64).clamp(min=0) + 1e-30)  # beyond 127 d: the clamp
    assert torch.equal(kv_q8.dequantize_q8_0(q, d).double(), q64 * d64)  # int8 x f16 products are exact in f32


def test_native_quantizer_writes_the_same_bytes():
    x = _blocks(4000, seed=2).reshape(1000, 128)
    q, d = torch.empty(1000, 128, dtype=torch.int8), torch.empty(1000, 4, dtype=torch.float16)
    native.quantize_q8_0(x, q, d)
    want_q, want_d = kv_q8.quantize_q8_0(x)
    assert torch.equal(q, want_q) and torch.equal(d.view(torch.int16), want_d.view(torch.int16))


def filled_cache(nkv: int, hd: int, start: int, T: int, seed: int, capacity: int = 1):
    """A q8_0 cache of one layer holding start + T random positions (written in two steps), and its dequantized K, V
    [nkv, S, hd] float32 as the quantizer defines them."""
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(2, nkv, start + T, hd, generator=g)  # [nkv, S, hd] each
    v[:, :, : hd // 2] *= 4  # value blocks of different scales
    cache = KVCache(1, nkv, hd, capacity, dtype=torch.int8)
    cache.reserve(start + T)
    if start:
        cache.write(0, k[:, :start], v[:, :start])
        cache.commit(list(range(start)))
    cache.write(0, k[:, start:], v[:, start:])
    deq = [kv_q8.dequantize_q8_0(*kv_q8.quantize_q8_0(x)) for x in (k, v)]
    return cache, deq[0], deq[1]


def naive(q, keys, values, start: int, scale: float) -> torch.Tensor:
    """q [nh, T, hd], keys/values [nkv, S, hd] -> weights [nh, T, S] and out [nh, T, hd], float64, causal."""
    nh, T, hd = q.shape
    g = nh // keys.shape[0]
    k, v = keys.double().repeat_interleave(g, 0), values.double().repeat_interleave(g, 0)  # [nh, S, hd]
    scores = q.double() @ k.transpose(1, 2) * scale  # [nh, T, S]
    seen = torch.arange(keys.shape[1])[None, :] <= torch.arange(start, start + T)[:, None]  # [T, S]
    w = scores.masked_fill(~seen, float("-inf")).softmax(-1)
    return w, w @ v


def quantized_queries(q: torch.Tensor, scale: float) -> torch.Tensor:
    """q * scale as the VNNI kernel holds it: per block of 32 dims, int8 times an f32 scale d = amax / 127, the
    integer rounding x * (1 / d) to nearest even (its exact f32 steps)."""
    x = (q * torch.tensor(scale, dtype=torch.float32)).reshape(*q.shape[:-1], -1, 32)  # [nh, T, nb, 32]
    d = x.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return ((x * inv).round().clamp(-127, 127) * d.double()).reshape(q.shape)


def int8_ok(out, q, keys, values, start: int, scale: float, hd: int, levels: int = 255) -> tuple[bool, str]:
    """Whether `out` is what an int8 kernel (VNNI: levels 255; AVX2: levels 127) may give. Its scores are exact
    (integer dots) for the quantized queries (quantized_queries); what remains is the rounding of w_j = p_j * dv_j,b to
    0..levels per (row, block of 32 keys, block of 32 dims) with step max_j p_j * max_j dv_j,b / levels (the dv maximum
    over the tile's keys up to S: at least the kernel's, so this sigma is never the smaller one): per output
    sum_j e_j v8_j / l with |e_j| <= step / 2, held to 6 sigma of it (e_j uniform) per element and to 1.2 sigma in RMS
    (a lost or doubled key is a bias beyond that)."""
    nh, T, _ = q.shape
    g = nh // keys.shape[0]
    w, want = naive(quantized_queries(q, scale), keys, values, start, 1.0)  # [nh, T, S], [nh, T, hd]
    S = keys.shape[1]
    vq, vd = kv_q8.quantize_q8_0(values)  # [nkv, S, hd] int8, [nkv, S, nb]
    v8 = vq.double().repeat_interleave(g, 0)  # [nh, S, hd]
    dv = vd.double().repeat_interleave(g, 0)  # [nh, S, nb]
    pad = -S % 32
    wb = torch.nn.functional.pad(w, (0, pad)).reshape(nh, T, -1, 32)  # [nh, T, S'/32, 32]: probabilities (l = 1)
    dvb = torch.nn.functional.pad(dv, (0, 0, 0, pad)).reshape(nh, 1, -1, 32, dv.shape[-1])  # [nh, 1, S'/32, 32, nb]
    step = wb.amax(-1).unsqueeze(-1) * dvb.amax(3) / levels  # [nh, T, S'/32, nb]: the step per key and dim block
    var_w = (step.repeat_interleave(32, 2)[:, :, :S] ** 2 / 12)  # [nh, T, S, nb]
    var = torch.einsum("htsb,hsbi->htbi", var_w, (v8 ** 2).reshape(nh, S, -1, 32)).reshape(nh, T, hd)
    sigma = var.sqrt()
    err = (out.reshape(T, nh, hd).transpose(0, 1).double() - want).abs()  # [nh, T, hd]
    floor = 3e-6 * float(values.abs().max())  # f32 sums
    worst = float((err - 6 * sigma - floor).max())
    rms = float(err.square().mean().sqrt()), float(sigma.square().mean().sqrt())
    why = f"excess over 6 sigma {worst:.3g}, rms {rms[0]:.3g} vs {rms[1]:.3g}"
    return worst <= 0 and rms[0] <= 1.2 * rms[1] + floor, why


SHAPES = [  # nh, nkv, hd, start, T: decode, prefill, prefill after a cached prefix, ragged blocks, g = 1, 3, 4, 8
    (32, 4, 128, 0, 1), (32, 4, 128, 0, 37), (32, 4, 128, 300, 1), (32, 4, 128, 45, 19), (8, 2, 64, 0, 130),
    (4, 4, 32, 31, 33), (6, 2, 96, 64, 65), (3, 1, 32, 1, 16), (16, 4, 64, 7, 5),
    (32, 4, 128, 30, 1), (32, 4, 128, 31, 1), (32, 4, 128, 32, 1), (32, 4, 128, 8190, 1), (32, 4, 128, 1000, 19),
    (16, 2, 64, 4000, 3), (3, 1, 32, 2047, 1),
    (8, 2, 512, 700, 1), (8, 2, 160, 333, 3),  # the largest head dim (16 dim blocks) and an odd number of dim blocks
]


@pytest.mark.parametrize("nh,nkv,hd,start,T", SHAPES)
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_native_attention_equals_naive(nh, nkv, hd, start, T, kernel, threads):
    if not KERNELS[kernel]:
        pytest.skip(f"no {kernel} q8_0 attention kernel on this CPU")
    if kernel == "Reference" and (threads != 2 or start + T > 2048):
        pytest.skip("the scalar reference is checked once per shape, below 2048 positions")
    cache, keys, values = filled_cache(nkv, hd, start, T, seed=start + T)
    q = torch.randn(nh, T, hd, generator=torch.Generator().manual_seed(7)) * 3  # [nh, T, hd]: peaked softmaxes too
    out = torch.full((T, nh * hd), float("nan"))
    native.attention_q8(q, cache.k[0], cache.ks[0], cache.v[0], cache.vs[0], start, hd**-0.5, out, make_pool(threads),
                        kernel=kernel)
    if kernel in LEVELS:
        ok, why = int8_ok(out, q, keys, values, start, hd**-0.5, hd, LEVELS[kernel])
        assert ok, why
        return
    _, want = naive(q, keys, values, start, hd**-0.5)  # the reference sums in float64 over the dequantized cache
    want = want.transpose(0, 1).reshape(T, nh * hd)
    assert float((out.double() - want).abs().max()) < 2e-6 * float(values.abs().max())


@pytest.mark.parametrize("kernel", list(LEVELS))
def test_int8_check_catches_a_lost_key(kernel):
    """The statistical bound of int8_ok is tight enough to see one key of 8191 left out (here: the first), for each
    int8 kernel's levels."""
    if not KERNELS[kernel]:
        pytest.skip(f"no {kernel} q8_0 attention kernel on this CPU")
    nh, nkv, hd, S = 8, 1, 64, 8191
    cache, keys, values = filled_cache(nkv, hd, S - 1, 1, seed=3)
    q = torch.randn(nh, 1, hd, generator=torch.Generator().manual_seed(2)) * 0.1  # flat: every key weighs ~1/S
    values[:, 0] += 40.0  # a key whose loss moves the output
    cache.write(0, keys[:, S - 1 :], values[:, S - 1 :])
    full = keys.clone(), values.clone()
    cache2 = KVCache(1, nkv, hd, S, dtype=torch.int8)
    cache2.write(0, *full)
    out = torch.full((1, nh * hd), float("nan"))
    native.attention_q8(q, cache2.k[0], cache2.ks[0], cache2.v[0], cache2.vs[0], S - 1, hd**-0.5, out, dense_pool(),
                        kernel=kernel)
    assert not out.isnan().any()
    keys_d = kv_q8.dequantize_q8_0(*kv_q8.quantize_q8_0(full[0]))
    values_d = kv_q8.dequantize_q8_0(*kv_q8.quantize_q8_0(full[1]))
    assert int8_ok(out, q, keys_d, values_d, S - 1, hd**-0.5, hd, LEVELS[kernel])[0]
    lost = int8_ok(out, q, keys_d[:, 1:], values_d[:, 1:], S - 2, hd**-0.5, hd, LEVELS[kernel])
    assert not lost[0], lost[1]


@pytest.mark.parametrize("start,T", [(0, 1), (0, 45), (70, 1), (70, 9)])
def test_torch_path_equals_naive_and_native(start, T):
    cache, keys, values = filled_cache(2, 32, start, T, seed=9)
    q = torch.randn(8, T, 32, generator=torch.Generator().manual_seed(3))
    mask = torch.arange(start + T)[None, :] <= torch.arange(start, start + T)[:, None]
    _, want = naive(q, keys, values, start, 32**-0.5)
    want = want.transpose(0, 1).reshape(T, 8 * 32)
    k, v = cache.keys_values(0, start + T)  # the torch path's input: the dequantized cache
    assert torch.equal(k, keys) and torch.equal(v, values)
    if uses_native(cache, 0):  # the dispatch's kernel, held to its roundings
        levels = LEVELS[native.attention_q8_kernel(32)]
        ok, why = int8_ok(attend(q, cache, 0, start, mask), q, keys, values, start, 32**-0.5, 32, levels)
        assert ok, why
    saved = cache.quantized
    from tessera.engine import attention

    attention.native_q8_kernel.cache_clear()
    try:
        attention.native.attention_q8_kernel, real = (lambda hd: "Reference"), attention.native.attention_q8_kernel
        attention.native_q8_kernel.cache_clear()
        assert not uses_native(cache, 0) and cache.quantized == saved
        assert torch.allclose(attend(q, cache, 0, start, mask).double(), want, atol=1e-5)
    finally:
        attention.native.attention_q8_kernel = real
        attention.native_q8_kernel.cache_clear()


def test_layout_round_trips_through_growth_and_copies():
    cache, keys, values = filled_cache(3, 64, 40, 33, seed=1, capacity=8)
    assert cache.capacity % 32 == 0
    k, v = cache.keys_values(0, 73)
    assert torch.equal(k, keys) and torch.equal(v, values)
    cache.commit(list(range(40, 73)))
    cache.reserve(1000)
    copy = cache.copy_prefix(50)
    assert torch.equal(cache.keys_values(0, 73)[0], keys) and torch.equal(cache.keys_values(0, 73)[1], values)
    k50, v50 = copy.keys_values(0, 50)
    assert torch.equal(k50, keys[:, :50]) and torch.equal(v50, values[:, :50])
    assert copy.quantized and copy.k[0].dtype == torch.int8 and copy.ks[0].dtype == torch.float16


def test_sizes_count_the_int8_values_and_f16_scales():
    cache = KVCache(3, 2, 128, 300, dtype=torch.int8)
    real = sum(t.nbytes for bufs in (cache.k, cache.ks, cache.v, cache.vs) for t in bufs)
    assert cache.capacity == 320 and cache.nbytes == real == kv_bytes(3, 2, 128, 300, torch.int8)
    assert real == 2 * 3 * 2 * 320 * (128 + 8)  # 1 byte a value, 2 bytes of scale a 32
    assert kv_bytes(48, 4, 128, 8192, torch.int8) / kv_bytes(48, 4, 128, 8192) == pytest.approx(136 / 256)


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="KV cache type 'q4'"):
        kv_dtype("q4")
    with pytest.raises(ValueError, match="head dim that is a multiple of 32.*14"):
        KVCache(1, 2, 14, 32, dtype=torch.int8)
    cache, _, _ = filled_cache(2, 32, 0, 4, seed=0)
    q, out = torch.randn(4, 4, 32), torch.empty(4, 128)
    with pytest.raises(ValueError, match="start"):
        native.attention_q8(q, cache.k[0], cache.ks[0], cache.v[0], cache.vs[0], cache.capacity, 1.0, out,
                            dense_pool())
    with pytest.raises(TypeError, match="k_scales: expected float16"):
        native.attention_q8(q, cache.k[0], cache.ks[0].float(), cache.v[0], cache.vs[0], 0, 1.0, out, dense_pool())
    with pytest.raises(ValueError, match="not a q8_0 attention kernel"):
        native.attention_q8(q, cache.k[0], cache.ks[0], cache.v[0], cache.vs[0], 0, 1.0, out, dense_pool(),
                            kernel="AMX")
