"""The hot-expert cache (CPU twin) computes exactly what the CPU backend alone computes, and counts hits correctly."""

import pytest
import torch

from tessera.engine.expert_cache import HotExpertCache
from tessera.engine.experts import LayerExperts, TorchExperts

H, I, E, K, T = 24, 20, 9, 3, 11  # not powers of two


def make_layers(n_layers=2, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {
        i: LayerExperts(
            gate_proj=(torch.randn(E, I, H, generator=g) * 0.2).to(dtype),
            up_proj=(torch.randn(E, I, H, generator=g) * 0.2).to(dtype),
            down_proj=(torch.randn(E, H, I, generator=g) * 0.2).to(dtype),
        )
        for i in range(n_layers)
    }


def routing(t, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, E, generator=g)
    w, ids = torch.topk(torch.softmax(logits, -1), K)  # [t, K]
    return ids, w / w.sum(-1, keepdim=True)


class NoSkipExperts(TorchExperts):
    """A CPU backend that does not accept -1 ids, like a kernel with a fixed k: exercises compaction and weight-0
    fill."""

    supports_skip = False

    def forward(self, layer, x, topk_ids, topk_weights):
        assert (topk_ids >= 0).all()
        return super().forward(layer, x, topk_ids, topk_weights)


@pytest.mark.parametrize("budget", [0, 1, 4, E])
@pytest.mark.parametrize("backend_cls", [TorchExperts, NoSkipExperts])
@pytest.mark.parametrize("t", [1, T])
def test_twin_equals_cpu_backend_for_any_budget(budget, backend_cls, t):
    layers = make_layers()
    reference = TorchExperts(layers)
    cache = HotExpertCache(backend_cls(layers), layers, device="cpu", experts_per_layer=budget, rebalance_every=0)
    x = torch.randn(t, H, generator=torch.Generator().manual_seed(1))
    for layer in layers:
        ids, w = routing(t, seed=layer + 10)
        torch.testing.assert_close(cache.forward(layer, x, ids, w), reference.forward(layer, x, ids, w),
                                   rtol=1e-5, atol=1e-5)
    cache.close()


def test_hit_rate_equals_independent_count():
    layers = make_layers()
    cache = HotExpertCache(TorchExperts(layers), layers, device="cpu", experts_per_layer=3, rebalance_every=4)
    x = torch.randn(T, H)
    expected_hits = expected_pairs = 0
    for step in range(10):
        for layer in layers:
            resident = set(cache.resident_experts(layer)) if layer != 0 or (step + 1) % 4 else None
            ids, w = routing(T, seed=100 + step * 7 + layer)
            cache.forward(layer, x, ids, w)
            if resident is None:  # a rebalance happened at the start of this step, on layer 0
                resident = set(cache.resident_experts(layer))
            expected_hits += sum(int(e) in resident for e in ids.reshape(-1).tolist())
            expected_pairs += ids.numel()
        pairs, hits = cache.take_step_stats()
        assert pairs == len(layers) * ids.numel()
    assert cache.stats.total_pairs == expected_pairs
    assert cache.stats.total_on_device == expected_hits
    assert cache.take_step_stats() == (0, 0)
    cache.close()


def test_rebalance_makes_the_most_used_experts_resident():
    layers = make_layers(n_layers=1)
    cache = HotExpertCache(TorchExperts(layers), layers, device="cpu", experts_per_layer=2, rebalance_every=0)
    hot = torch.tensor([[7, 5, 0]] * 6 + [[7, 5, 1]] * 6)  # experts 7 and 5 used by every token
    cache.observe(0, hot)
    assert cache.rebalance() == {0: [5, 7]}
    x = torch.randn(12, H)
    cache.forward(0, x, hot, torch.full((12, 3), 1 / 3))
    assert cache.take_step_stats() == (36, 24)
    cache.close()


def test_bf16_weights_on_twin_match_f32_reference():
    layers = make_layers(dtype=torch.bfloat16)
    cache = HotExpertCache(TorchExperts(layers), layers, device="cpu", experts_per_layer=5, rebalance_every=0)
    x = torch.randn(T, H)
    ids, w = routing(T, seed=3)
    torch.testing.assert_close(cache.forward(0, x, ids, w), TorchExperts(layers).forward(0, x, ids, w),
                               rtol=1e-5, atol=1e-5)
    cache.close()


def test_layerwise_prefill_serves_every_pair_on_the_accelerator_and_matches():
    layers = make_layers()
    cache = HotExpertCache(TorchExperts(layers), layers, device="cpu", experts_per_layer=1, rebalance_every=0,
                           prefill_threshold=8)
    x = torch.randn(T, H)
    ids, w = routing(T, seed=5)
    torch.testing.assert_close(cache.forward(1, x, ids, w), TorchExperts(layers).forward(1, x, ids, w),
                               rtol=1e-5, atol=1e-5)
    assert cache.take_step_stats() == (ids.numel(), ids.numel())  # T=11 >= 8: all on the accelerator
    assert cache.resident_experts(1) == [0]  # the cache itself is unchanged by a layerwise prefill
    ids1, w1 = routing(1, seed=6)
    cache.forward(1, x[:1], ids1, w1)
    assert cache.take_step_stats() == (K, int((ids1 == 0).sum()))  # decode uses the resident set only
    cache.close()


def test_twin_over_a_native_backend_uses_its_submit_and_sync(tmp_path):
    from tessera.engine import native

    layers = make_layers()
    cpu = native.make_backend("Reference", layers, threads=1, cache_dir=tmp_path, model_id="twin-test")
    calls = []
    submit = cpu.submit
    cpu.submit = lambda *a: (calls.append(a[0]), submit(*a))[1]
    cache = HotExpertCache(cpu, layers, device="cpu", experts_per_layer=3, rebalance_every=0)
    x = torch.randn(T, H)
    for layer in layers:
        ids, w = routing(T, seed=20 + layer)
        torch.testing.assert_close(cache.forward(layer, x, ids, w), TorchExperts(layers).forward(layer, x, ids, w),
                                   rtol=1e-4, atol=1e-4)
    assert calls == [0, 1]
    cache.close()
