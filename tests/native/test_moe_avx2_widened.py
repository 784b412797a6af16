"""The AVX2 bf16 MoE's widened panels (moe_body.inc widen_panels / f32_panel_tile): an expert with at least
kWideMinRows (12) token slots has each K block of its bf16 pair panels widened to f32 once for all its token chunks
instead of inside every 2-token tile. The same FMAs run in the same order, so a token's output must not change with
the path: every token of a batch routed to one expert (the widened path) equals, bit for bit, the token run alone (one
row: the 2-token tiles). H and I span several 128-pair K blocks (chained through the task's C) and end in partial
blocks and partial panels. Skipped where the AVX2 backend does not run."""

from __future__ import annotations

import pytest
import torch
from native_cases import native_backends, random_layer

import tessera.engine.native as N
from tessera.engine import _native


@pytest.mark.skipif("AVX2" not in native_backends(), reason="the AVX2 backend does not run on this CPU")
@pytest.mark.parametrize("T", [12, 13, 40])
def test_widened_panels_give_the_bits_of_the_two_token_tiles(T, pool):
    E, H, I = 3, 600, 300  # 300 pairs over H (three K blocks, the last partial), 150 over I (two); 300 rows: 19 panels
    experts = random_layer(E, H, I, seed=5)
    blob = N.pack_layer("AVX2", experts, pool)
    g = torch.Generator().manual_seed(T)
    x = torch.randn(T, H, generator=g)  # [T, H]
    ids = torch.ones(T, 1, dtype=torch.int64)  # [T, 1]: every token on expert 1 (T rows: the widened path)
    w = torch.rand(T, 1, generator=g) + 0.5  # [T, 1]
    backend = _native.backend("AVX2")
    batch = torch.full((T, H), float("nan"))
    backend.forward(blob, ids, w, x, batch, pool)
    assert not torch.isnan(batch).any()
    for t in range(T):
        alone = torch.full((1, H), float("nan"))
        backend.forward(blob, ids[t : t + 1], w[t : t + 1].contiguous(), x[t : t + 1].contiguous(), alone, pool)
        assert torch.equal(batch[t : t + 1], alone), f"token {t} of {T}"
