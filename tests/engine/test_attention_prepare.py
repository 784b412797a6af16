"""The native step of engine.model.Attention at any T (engine.attention.prepare_attend_native): attention_prepare (per
head RMSNorm and RoPE of q and k, the bf16 append of k and v into the tiled cache) against the torch code it replaces
(engine.model.rms_norm, Rope.apply, KVCache.write), the kernels' token-major q layout against the head-major one, and
the module's native path against its torch path. The end-to-end check against transformers is test_attention.py's
test_long_context_matches_transformers (bf16 cache: this path)."""

from __future__ import annotations

import pytest
import torch

from tessera.engine import native
from tessera.engine.attention import attend, prepare_attend_native
from tessera.engine.kv_cache import KVCache
from tessera.engine.model import Rope, rms_norm
from tessera.engine.native import make_pool

NATIVE = native.attention_kernel(32) != "Reference"
EPS = 1e-6


def projections(T: int, nh: int, nkv: int, hd: int, seed: int, strided: bool):
    """q [T, nh*hd], k, v [T, nkv*hd] as projections leave them; strided: column slices of one [T, (nh+2nkv)*hd]
    output (rows contiguous, row stride wider than the row), as a fused projection would give."""
    g = torch.Generator().manual_seed(seed)
    if strided:
        fused = 3 * torch.randn(T, (nh + 2 * nkv) * hd, generator=g)
        return fused[:, : nh * hd], fused[:, nh * hd : (nh + nkv) * hd], fused[:, (nh + nkv) * hd :]
    return (3 * torch.randn(T, n * hd, generator=g) for n in (nh, nkv, nkv))


def torch_prepare(q, k, v, q_norm, k_norm, cos, sin, nh, nkv, hd):
    """What engine.model.Attention does in torch: q [nh, T, hd] normed and rotated, k the same, v [nkv, T, hd]."""
    T = q.shape[0]
    qn = rms_norm(q.reshape(T, nh, hd), q_norm, EPS).transpose(0, 1)  # [nh, T, hd]
    kn = rms_norm(k.reshape(T, nkv, hd), k_norm, EPS).transpose(0, 1)  # [nkv, T, hd]
    return Rope.apply(qn, cos, sin), Rope.apply(kn, cos, sin), v.reshape(T, nkv, hd).transpose(0, 1)


def cache_with(nkv: int, hd: int, start: int, capacity: int, seed: int) -> KVCache:
    """A one-layer bf16 cache of `capacity` positions, `start` of them committed (random), the rest NaN."""
    g = torch.Generator().manual_seed(seed)
    cache = KVCache(1, nkv, hd, capacity)
    cache.k[0].fill_(float("nan"))
    cache.v[0].fill_(float("nan"))
    if start:
        cache.write(0, torch.randn(nkv, start, hd, generator=g), torch.randn(nkv, start, hd, generator=g))
        cache.commit(list(range(start)))
    return cache


@pytest.mark.skipif(not NATIVE, reason="no native attention kernel on this CPU")
@pytest.mark.parametrize("nh,nkv,hd,start,T,strided", [
    (32, 4, 128, 0, 1, False), (32, 4, 128, 0, 70, False), (32, 4, 128, 45, 19, True), (8, 2, 64, 31, 33, True),
    (6, 2, 96, 64, 1, False), (4, 4, 32, 1000, 300, False),
])
@pytest.mark.parametrize("threads", [1, 3])
def test_prepare_equals_torch_norm_rope_and_write(nh, nkv, hd, start, T, strided, threads):
    q, k, v = projections(T, nh, nkv, hd, seed=T + start, strided=strided)
    g = torch.Generator().manual_seed(1)
    q_norm, k_norm = 1 + 0.2 * torch.randn(hd, generator=g), 1 + 0.2 * torch.randn(hd, generator=g)
    cos, sin = Rope(hd, 1e6).cos_sin(torch.arange(start, start + T))  # [T, hd] x 2
    want_q, want_k, want_v = torch_prepare(q, k, v, q_norm, k_norm, cos, sin, nh, nkv, hd)
    ours, theirs = (cache_with(nkv, hd, start, start + T + 40, seed=2) for _ in range(2))
    theirs.write(0, want_k, want_v)
    q_in = q.clone()
    native.attention_prepare(q_in, k, v, q_norm, k_norm, cos, sin, EPS, ours.k[0], ours.v[0], start, make_pool(threads))
    # q: the norm's sum of squares is double here, f32 in torch: a few ulp
    got_q = q_in.reshape(T, nh, hd).transpose(0, 1)
    assert torch.allclose(got_q, want_q, rtol=1e-5, atol=1e-5 * float(want_q.abs().max()))
    # the cache: every position outside [start, start+T) untouched (NaN stays NaN, the committed prefix equal),
    # inside it the same bf16 up to one bf16 ulp where the f32 results straddle a rounding boundary
    S = start + T
    k_ours, v_ours = ours.keys_values(0, ours.capacity)
    k_theirs, v_theirs = theirs.keys_values(0, theirs.capacity)
    assert torch.equal(k_ours[:, :start], k_theirs[:, :start]) and torch.equal(v_ours[:, :start], v_theirs[:, :start])
    assert k_ours[:, S:].isnan().all() and v_ours[:, S:].isnan().all()
    assert torch.equal(v_ours[:, start:S], v_theirs[:, start:S])  # v: one rounding of the same f32 values
    ulp = 2.0**-7 * k_theirs[:, start:S].abs()
    assert bool(((k_ours[:, start:S] - k_theirs[:, start:S]).abs() <= ulp).all())
    assert float((k_ours[:, start:S] != k_theirs[:, start:S]).float().mean()) < 1e-3


@pytest.mark.skipif(not NATIVE, reason="no native attention kernel on this CPU")
@pytest.mark.parametrize("kernel", ["AMX_BF16", "AMX_BF16-emulated", "AVX512_BF16", "AVX512", "Reference"])
@pytest.mark.parametrize("start,T", [(0, 1), (0, 130), (300, 19), (2000, 1)])
def test_token_major_q_gives_the_same_bits(kernel, start, T):
    nh, nkv, hd = 8, 2, 64
    g = torch.Generator().manual_seed(T)
    cache = KVCache(1, nkv, hd, start + T)
    cache.write(0, torch.randn(nkv, start + T, hd, generator=g), torch.randn(nkv, start + T, hd, generator=g))
    q = torch.randn(nh, T, hd, generator=g)  # [nh, T, hd]
    pool = make_pool(2)
    heads, tokens = torch.empty(T, nh * hd), torch.empty(T, nh * hd)
    try:
        native.attention_bf16(q, cache.k[0], cache.v[0], start, hd**-0.5, heads, pool, kernel=kernel)
    except ValueError:
        pytest.skip(f"no {kernel} attention kernel on this CPU")
    native.attention_bf16(q.transpose(0, 1).contiguous(), cache.k[0], cache.v[0], start, hd**-0.5, tokens, pool,
                          kernel=kernel, token_major=True)
    assert torch.equal(heads, tokens)


@pytest.mark.skipif(not NATIVE, reason="no native attention kernel on this CPU")
@pytest.mark.parametrize("start,T", [(0, 1), (0, 77), (33, 40)])
def test_native_step_equals_torch_step(start, T):
    """prepare_attend_native against the module's torch code (norms, RoPE, KVCache.write, attend) on the same cache."""
    nh, nkv, hd = 8, 2, 32
    q, k, v = projections(T, nh, nkv, hd, seed=5, strided=False)
    g = torch.Generator().manual_seed(6)
    q_norm, k_norm = 1 + 0.2 * torch.randn(hd, generator=g), 1 + 0.2 * torch.randn(hd, generator=g)
    cos, sin = Rope(hd, 1e6).cos_sin(torch.arange(start, start + T))
    ours, theirs = cache_with(nkv, hd, start, start + T, seed=7), cache_with(nkv, hd, start, start + T, seed=7)
    got = prepare_attend_native(q.clone(), k, v, q_norm, k_norm, EPS, cos, sin, ours, 0, make_pool(2))
    want_q, want_k, want_v = torch_prepare(q, k, v, q_norm, k_norm, cos, sin, nh, nkv, hd)
    theirs.write(0, want_k, want_v)
    want = attend(want_q, theirs, 0, start, None, make_pool(2))  # [T, nh*hd]
    assert torch.allclose(got, want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))


def test_prepare_bad_arguments_name_the_argument():
    nh, nkv, hd, T = 4, 2, 32, 3
    cache = KVCache(1, nkv, hd, 8)
    q, k, v = projections(T, nh, nkv, hd, seed=0, strided=False)
    w, cos = torch.ones(hd), torch.ones(T, hd)
    pool = make_pool(1)

    def call(**over):
        a = dict(q=q, k=k, v=v, q_norm=w, k_norm=w, cos=cos, sin=cos, eps=EPS, kt=cache.k[0], vc=cache.v[0], start=0,
                 pool=pool)
        a.update(over)
        native.attention_prepare(**a)

    with pytest.raises(ValueError, match="start"):
        call(start=6)
    with pytest.raises(ValueError, match="k: expected shape"):
        call(k=torch.randn(T, 3 * hd))
    with pytest.raises(ValueError, match="cos: expected shape"):
        call(cos=torch.ones(T + 1, hd))
    with pytest.raises(ValueError, match="q: each row must be contiguous"):
        call(q=torch.randn(nh * hd, T).t())
    with pytest.raises(TypeError, match="v: expected float32"):
        call(v=v.double())
    with pytest.raises(ValueError, match="capacity"):
        q9, k9, v9 = projections(9, nh, nkv, hd, seed=0, strided=False)  # 9 positions in a cache of 8
        prepare_attend_native(q9, k9, v9, w, w, EPS, torch.ones(9, hd), torch.ones(9, hd), cache, 0, pool)


@pytest.mark.skipif(not NATIVE, reason="no native attention kernel on this CPU")
@pytest.mark.parametrize("start,T", [(0, 1), (500, 1), (0, 2), (0, 200), (100, 33)])
def test_default_kernel_is_the_named_one_per_phase(start, T):
    """Decode (T = 1) runs attention_kernel's kernel, prefill (T > 1) attention_prefill_kernel's: the same bits."""
    nh, nkv, hd = 8, 2, 128
    g = torch.Generator().manual_seed(T)
    cache = KVCache(1, nkv, hd, start + T)
    cache.write(0, torch.randn(nkv, start + T, hd, generator=g), torch.randn(nkv, start + T, hd, generator=g))
    q = torch.randn(nh, T, hd, generator=g)
    pool = make_pool(2)
    default, named = torch.empty(T, nh * hd), torch.empty(T, nh * hd)
    native.attention_bf16(q, cache.k[0], cache.v[0], start, hd**-0.5, default, pool)
    kernel = native.attention_kernel(hd) if T == 1 else native.attention_prefill_kernel(hd)
    native.attention_bf16(q, cache.k[0], cache.v[0], start, hd**-0.5, named, pool, kernel=kernel)
    assert torch.equal(default, named)
