"""Tessera's forward against transformers' Qwen3MoeForCausalLM on the same tiny random weights (fp32)."""

from __future__ import annotations

import pytest
import torch

from engine.experts import TorchExperts
from engine.model import Qwen3MoeModel, RoutingStats, layer_experts
from hf_reference import CONFIGS, canonical_weights, hf_model, single_thread  # noqa: F401

pytest.importorskip("transformers")


def build(name: str, seed: int = 0):
    ref = hf_model(CONFIGS[name], seed)
    w = canonical_weights(ref)
    model = Qwen3MoeModel(w, TorchExperts(layer_experts(w.config, w.tensors)))
    return ref, model


def assert_close_logits(ours: torch.Tensor, theirs: torch.Tensor):
    scale = float(theirs.max() - theirs.min())
    diff = float((ours - theirs).abs().max())
    assert diff <= 1e-4 * max(scale, 1.0), f"max abs diff {diff} vs logit range {scale}"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_equal_transformers(name):
    ref, model = build(name)
    ids = torch.randint(0, ref.config.vocab_size, (23,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = ref(ids[None]).logits[0]  # [T, V]
    ours = model.forward(ids, model.new_cache(8), last_only=False)  # [T, V]
    assert ours.shape == theirs.shape
    assert float(theirs.std()) > 0.1  # the weights are big enough for the logits to mean something
    assert_close_logits(ours, theirs)


@pytest.mark.parametrize("name", ["odd_sizes", "dense_layers"])
def test_incremental_decode_matches_full_forward(name):
    ref, model = build(name, seed=3)
    ids = torch.randint(0, ref.config.vocab_size, (20,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = ref(ids[None]).logits[0]  # [T, V]
    cache = model.new_cache(4)  # small capacity: the cache must grow while decoding
    first = model.forward(ids[:11], cache, last_only=False)  # [11, V]
    steps = [model.forward(ids[i : i + 1], cache) for i in range(11, 20)]  # 9 x [1, V]
    assert cache.length == 20 and cache.tokens == ids.tolist()
    assert_close_logits(torch.cat([first, *steps]), theirs)


def test_routing_stats_count_token_expert_pairs():
    ref, model = build("dense_layers")
    stats = RoutingStats()
    model.forward(torch.arange(6), model.new_cache(8), stats=stats)
    moe_layers = [i for i in range(model.config.num_hidden_layers) if model.config.is_moe_layer(i)]
    assert sorted(stats.counts) == moe_layers == [1, 3]
    assert stats.pairs == 6 * model.config.num_experts_per_tok * len(moe_layers)
    assert all(int(c.sum()) == 6 * model.config.num_experts_per_tok for c in stats.counts.values())
    assert 0 < stats.experts_hit() <= len(moe_layers) * model.config.num_experts


def test_greedy_32_tokens_identical_to_transformers_generate():
    ref, model = build("odd_sizes", seed=5)
    prompt = torch.tensor([3, 17, 42, 99, 7, 64])
    with torch.no_grad():
        out = ref.generate(prompt[None], max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
    theirs = out[0, len(prompt):].tolist()
    cache, ids, ours = model.new_cache(8), prompt, []
    for _ in range(32):
        nxt = int(model.forward(ids, cache)[0].argmax())
        ours.append(nxt)
        ids = torch.tensor([nxt])
    assert len(theirs) == 32
    assert ours == theirs
