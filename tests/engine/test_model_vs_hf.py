"""Tessera's forward against transformers' Qwen3MoeForCausalLM on the same tiny random weights (fp32).

The forward's arithmetic is checked with a float32 KV cache (to 1e-4 of the logit range); the default bfloat16 cache is
checked separately, with tolerances for what rounding K and V to bf16 costs."""

from __future__ import annotations

import pytest
import torch
from hf_reference import CONFIGS, canonical_weights, hf_model, single_thread  # noqa: F401

from tessera.engine.experts import TorchExperts
from tessera.engine.model import Qwen3MoeModel, RoutingStats, layer_experts

pytest.importorskip("transformers")


def build(name: str, seed: int = 0, kv_dtype: torch.dtype = torch.float32):
    ref = hf_model(CONFIGS[name], seed)
    w = canonical_weights(ref)
    model = Qwen3MoeModel(w, TorchExperts(layer_experts(w.config, w.tensors)), kv_dtype=kv_dtype)
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


# Configs whose routers pick at least 2 experts ("tied" routes each token to 1 of 9 experts: there a 1e-3 perturbation
# of
# a near-tied random router swaps a token's whole MoE output, which says nothing about the cache).
TOP_K_2 = sorted(n for n, c in CONFIGS.items() if c.get("num_experts_per_tok", 2) >= 2)


@pytest.mark.parametrize("name", TOP_K_2)
@pytest.mark.parametrize("seed", [0, 3])
def test_bf16_kv_cache_stays_close_to_transformers(name, seed):
    """Prefill of 20 tokens, then 20 decode steps, with the default bf16 cache. Rounding K and V to bf16 (2^-9
    relative) moves the logits by ~1e-3 of their range (measured 2026-12-03 on these configs, seeds 0 and 3: median
    per-position max |dlogit| 0.7-1.3e-3 x range, mean KL <= 7e-5, top-1 agreement >= 0.98; one near-tied routing
    decision can move one position by ~3e-2). Bounds: median 3e-3, KL 5e-4, top-1 0.95."""
    ref, model = build(name, seed, kv_dtype=torch.bfloat16)
    ids = torch.randint(0, ref.config.vocab_size, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = ref(ids[None]).logits[0]  # [T, V]
    cache = model.new_cache(4)
    assert cache.dtype == torch.bfloat16 and cache.k[0].dtype == torch.bfloat16
    first = model.forward(ids[:20], cache, last_only=False)  # [20, V]
    ours = torch.cat([first, *(model.forward(ids[i : i + 1], cache) for i in range(20, 40))])  # [40, V]
    per_position = (ours - theirs).abs().max(-1).values / float(theirs.max() - theirs.min())  # [40]
    kl = torch.nn.functional.kl_div(ours.log_softmax(-1), theirs.log_softmax(-1), log_target=True, reduction="none")
    top1 = float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())
    assert float(per_position.median()) < 3e-3 and float(kl.sum(-1).mean()) < 5e-4 and top1 >= 0.95
    assert float(per_position.median()) > 1e-5  # the cache really is bf16 (an f32 cache gives ~1e-7)
