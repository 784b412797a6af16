"""AVX512Int8's register tiles (3 rows x up to 4 panels x two activation digits, native/src/moe_avx512_int8.cpp): every
row count and panel count the tiling produces gives each token exactly what that token gets alone.

Why bit-exact is the right check: a token's activations are quantized on their own, each (row, panel) dot is exact in
int32 per group, and the groups' f32 terms are added in the same order whatever tile the row lands in; so a token's
output cannot depend on which other tokens share its expert, its tile or its thread. A tile that mixes up rows,
panels, digits or accumulators (the kind of bug a register-blocking change makes) shows up as a difference, long
before it shows in an NMSE against the Reference (which tests/native/test_backends.py checks as well).
Shapes: experts with 1..13 tokens (every tail of 3-row tiles), odd H and I (panel tails of 1..3 of a 4-panel or
2-panel task, a partial 16-output panel, K not a multiple of 4), T up to 513, pools of 1-3 threads, NaN-prefilled
outputs."""

import pytest
import torch
from native_cases import nmse, random_layer

import tessera.engine.backends as B
import tessera.engine.native as N
from tessera.engine import _native

NAME = "AVX512Int8"
pytestmark = pytest.mark.skipif(NAME not in B.available_names(), reason=f"{NAME} does not run on this CPU")

# (E, H, I): down has ceil(H/16) panels (tasks of 4: tails 1..3), gate/up ceil(I/16) (tasks of 2: tail 1).
SHAPES = [(5, 130, 70), (7, 97, 51), (3, 64, 48), (6, 200, 33)]


def forward(blob, x, ids, w, pool):
    out = torch.full_like(x, float("nan"))  # [T, H]: every element must be written
    _native.backend(NAME).forward(blob, ids, w, x, out, pool)
    return out


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: "E{}xH{}xI{}".format(*s))
def layer(request):
    E, H, I = request.param
    experts = random_layer(E, H, I, seed=H + I)
    pool = N.make_pool(2)
    return request.param, N.pack_layer(NAME, experts, pool), N.pack_layer("Reference", experts, pool)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("T", [2, 5, 13, 40, 513])
def test_each_token_gets_what_it_gets_alone(layer, T, threads):
    (E, H, I), blob, ref_blob = layer
    pool = N.make_pool(threads)
    g = torch.Generator().manual_seed(T * 7 + threads)
    k = min(2, E - 1)
    x = torch.randn(T, H, generator=g)  # [T, H]
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])  # [T, k]
    w = torch.rand(T, k, generator=g)  # [T, k]
    y = forward(blob, x, ids, w, pool)  # [T, H]: the experts' rows go through tiles of 1..3 rows
    alone = torch.cat([forward(blob, x[t : t + 1], ids[t : t + 1], w[t : t + 1], pool) for t in range(T)])
    assert not torch.isnan(y).any()
    assert torch.equal(y, alone), f"T={T} threads={threads}: max diff {float((y - alone).abs().max()):.3g}"
    ref = torch.full_like(x, float("nan"))
    _native.backend("Reference").forward(ref_blob, ids, w, x, ref, pool)
    assert nmse(y, ref) <= 1e-3  # int8 tolerance of tests/native/native_cases.py


@pytest.mark.parametrize("rows", list(range(1, 14)))
def test_one_expert_with_1_to_13_rows(layer, rows):
    """Every token routed to expert 0 (and a second slot to expert 1): the expert's rows are split 3, 3, ..., tail."""
    (E, H, I), blob, ref_blob = layer
    pool = N.make_pool(2)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, H, generator=g)  # [rows, H]
    ids = torch.tensor([[0, 1]] * rows)  # [rows, 2]
    w = torch.rand(rows, 2, generator=g)  # [rows, 2]
    y = forward(blob, x, ids, w, pool)
    alone = torch.cat([forward(blob, x[t : t + 1], ids[t : t + 1], w[t : t + 1], pool) for t in range(rows)])
    assert not torch.isnan(y).any()
    assert torch.equal(y, alone)
