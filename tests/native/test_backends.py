"""Every compiled backend against the Reference: NaN-prefilled outputs, NMSE per precision, odd shapes, T = 1, 3, 64,
513 (T >= 16 takes the bf16-activation prefill tiles where a backend has them), k = 1, 2, 8, experts with no tokens, one
expert with every token, skipped slots (negative ids)."""

import pytest
import torch
from native_cases import F32_DECODE, NMSE_TOL, native_backends, nmse, precision_of, random_layer

import tessera.engine.native as N
from tessera.engine import _native

# (E, H, I): real-ish tile multiples, and shapes that are multiples of no tile or vector width.
SHAPES = [(12, 64, 48), (9, 37, 19), (10, 130, 70)]


def run(name, blob, x, ids, w, pool):
    out = torch.full_like(x, float("nan"))  # [T, H]: every element must be written
    _native.backend(name).forward(blob, ids, w, x, out, pool)
    return out


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: "E{}xH{}xI{}".format(*s))
def layer(request, pool):
    E, H, I = request.param
    experts = random_layer(E, H, I, seed=E)
    ref = N.pack_layer("Reference", experts, pool)
    return request.param, experts, ref


def tolerance(name: str, T: int) -> float:
    prec = precision_of(name)
    if name in F32_DECODE and T < 16:
        return NMSE_TOL["exact"]  # f32 activations, exact bf16 weights: only the summation order differs
    return NMSE_TOL[prec]


@pytest.mark.parametrize("name", native_backends())
@pytest.mark.parametrize("T", [1, 3, 64, 513])
@pytest.mark.parametrize("k", [1, 2, 8])
def test_backend_matches_reference(name, T, k, layer, pool):
    (E, H, I), experts, ref_blob = layer
    assert k < E  # every shape has more experts than slots, so expert E-1 can stay idle
    g = torch.Generator().manual_seed(T * 31 + k)
    blob = N.pack_layer(name, experts, pool)
    x = torch.randn(T, H, generator=g)  # [T, H]
    ids = torch.stack([torch.randperm(E - 1, generator=g)[:k] for _ in range(T)])  # [T, k]: expert E-1 gets no token
    w = torch.rand(T, k, generator=g)  # [T, k]
    y = run(name, blob, x, ids, w, pool)
    ref = run("Reference", ref_blob, x, ids, w, pool)
    assert not torch.isnan(y).any()
    assert nmse(y, ref) <= tolerance(name, T), f"{name} T={T} k={k} nmse={nmse(y, ref):.3g}"


@pytest.mark.parametrize("name", native_backends())
def test_one_expert_gets_every_token_and_skipped_slots(name, layer, pool):
    (E, H, I), experts, ref_blob = layer
    T, k = 513, 2
    g = torch.Generator().manual_seed(5)
    blob = N.pack_layer(name, experts, pool)
    x = torch.randn(T, H, generator=g)
    ids = torch.full((T, k), -1, dtype=torch.int64)
    ids[:, 0] = 3  # every token -> expert 3; slot 1 skipped (served elsewhere)
    w = torch.rand(T, k, generator=g)
    y = run(name, blob, x, ids, w, pool)
    ref = run("Reference", ref_blob, x, ids, w, pool)
    assert not torch.isnan(y).any()
    assert nmse(y, ref) <= tolerance(name, T)
    # Only expert 3, once: equals the single-slot call.
    y1 = run(name, blob, x, ids[:, :1].contiguous(), w[:, :1].contiguous(), pool)
    assert torch.equal(y, y1)


@pytest.mark.parametrize("name", ["Reference"] + native_backends())
def test_all_slots_skipped_gives_zeros(name, layer, pool):
    (E, H, I), experts, _ = layer
    blob = N.pack_layer(name, experts, pool)
    x = torch.randn(3, H)
    ids = torch.full((3, 2), -1, dtype=torch.int64)
    y = run(name, blob, x, ids, torch.ones(3, 2), pool)
    assert torch.equal(y, torch.zeros_like(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["Reference"] + native_backends())
def test_pack_unpack_round_trip(name, dtype, pool):
    E, H, I = 3, 37, 19
    experts = random_layer(E, H, I, dtype=dtype, seed=1)
    blob = N.pack_layer(name, experts, pool)
    for e in range(E):
        g, u, d = (torch.from_numpy(a) for a in _native.backend(name).unpack(blob, e))
        for got, want in ((g, experts.gate_proj[e]), (u, experts.up_proj[e]), (d, experts.down_proj[e])):
            want = want.float()
            if name == "Reference":
                assert torch.equal(got, want)
            elif precision_of(name) == "bf16":
                assert torch.equal(got, want.bfloat16().float())  # bf16 layouts: exact up to bf16 rounding
            else:
                assert nmse(got, want) < 1e-3  # int8: quantization error only


@pytest.fixture
def int8_tiles_only():
    """AMXInt8's large pieces on its int8 tiles (not bf16 tiles over dequantized weights, whose bf16 rounding makes a
    token's result depend on how many rows its expert has: tests/native/test_amx_backends.py covers that path)."""
    before = _native.set_amx_int8_bf16_min_rows(0)
    yield
    _native.set_amx_int8_bf16_min_rows(before)


@pytest.mark.parametrize("name", native_backends())
def test_long_prompt_is_chunked_consistently(name, pool, int8_tiles_only):
    """T above the kernels' internal chunk (1024 tokens): same result as running the halves separately."""
    E, H, I = 9, 37, 19
    experts = random_layer(E, H, I, seed=11)
    blob = N.pack_layer(name, experts, pool)
    ref_blob = N.pack_layer("Reference", experts, pool)
    g = torch.Generator().manual_seed(2)
    T, k = 2100, 2
    x = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    w = torch.rand(T, k, generator=g)
    y = run(name, blob, x, ids, w, pool)
    assert nmse(y, run("Reference", ref_blob, x, ids, w, pool)) <= tolerance(name, T)
    halves = torch.cat([run(name, blob, x[a:b].contiguous(), ids[a:b].contiguous(), w[a:b].contiguous(), pool)
                        for a, b in ((0, 1024), (1024, 2048), (2048, T))])
    assert torch.equal(y, halves)
