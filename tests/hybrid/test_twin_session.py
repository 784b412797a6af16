"""The hybrid placement end to end on a tiny model, with the CPU twin standing in for the GPU.

The twin runs the same plan, device mapping, host transfers, concurrent CPU submission and hot-expert cache as the CUDA
path; here its logits must equal the all-CPU engine's, and its hit rate must equal a count made from the router outputs.
"""

import pytest
import torch

from tessera import engine
from tessera.engine.errors import TesseraError
from tessera.engine.hybrid import PlacementSettings
from tessera.engine.model import RoutingStats

TEXT_IDS = [5, 17, 42, 99, 7, 250, 3, 64, 128, 11, 300, 8, 2, 77, 91, 45]  # 16 ids of the tiny vocabulary (437)

ORIGINAL_EXAMPLE = r'''
- match:
    name: "^model\\.layers\\..*\\.mlp\\.experts$"
  replace:
    class: ktransformers.operators.experts.KTransformersExpertsV2
    kwargs: {backend: "AMXInt8", prefill_device: "cuda", generate_device: "cpu", gpu_prefill_threshold: 4}
- match:
    name: "^model\\.layers\\..*\\.(self_attn|mlp|mlp\\.gate)$|^model\\.norm$|^lm_head$"
  replace:
    class: default
    kwargs: {generate_device: "cuda", prefill_device: "cuda"}
'''


def all_logits(session, ids):
    cache = session.model.new_cache(64)
    return session.model.forward(torch.tensor(ids), cache, last_only=False)  # [T, V]


@pytest.fixture(scope="module")
def reference(tiny_gguf_model):
    s = engine.load(tiny_gguf_model, backend="Torch")
    yield s, all_logits(s, TEXT_IDS)
    s.close()


@pytest.mark.parametrize("budget", [0, 2, 6])
def test_twin_logits_equal_all_cpu_for_any_budget(tiny_gguf_model, reference, budget):
    _, expected = reference
    s = engine.load(tiny_gguf_model, backend="Torch",
                    placement=PlacementSettings(device="cuda", gpu_experts_per_layer=budget), twin=True)
    try:
        assert type(s.model.experts).__name__ == "HotExpertCache"
        assert (f"{budget} experts per layer on CPU twin" in s.explain()
                or (budget == 0 and "no GPU expert" in s.explain()))
        torch.testing.assert_close(all_logits(s, TEXT_IDS), expected, rtol=1e-4, atol=1e-4)
    finally:
        s.close()


def test_hit_rate_equals_count_from_router_outputs(tiny_gguf_model):
    s = engine.load(tiny_gguf_model, backend="Torch",
                    placement=PlacementSettings(device="cuda", gpu_experts_per_layer=2), twin=True)
    try:
        cache_backend = s.model.experts
        cache_backend.take_step_stats()
        kv = s.model.new_cache(64)
        hits = pairs = 0
        for chunk in (TEXT_IDS[:9], TEXT_IDS[9:12], [TEXT_IDS[12]], [TEXT_IDS[13]]):
            stats = RoutingStats()
            s.model.forward(torch.tensor(chunk), kv, stats=stats)
            for layer, counts in stats.counts.items():  # [E] tokens routed to each expert, from the router
                resident = cache_backend.resident_experts(layer)
                hits += int(counts[resident].sum())
            pairs += stats.pairs
            step_pairs, step_hits = cache_backend.take_step_stats()
            assert step_pairs == stats.pairs
        assert cache_backend.stats.total_pairs == pairs
        assert cache_backend.stats.total_on_device == hits
        assert 0 < hits < pairs
    finally:
        s.close()


def test_generation_reports_expert_cache_hit_rate(tiny_gguf_model):
    s = engine.load(tiny_gguf_model, backend="Torch",
                    placement=PlacementSettings(device="cuda", gpu_experts_per_layer=3), twin=True)
    try:
        steps = []
        events = list(s.generate(TEXT_IDS, engine.sampling.SamplingParams(temperature=0, max_tokens=5),
                                 on_step=steps.append))
        done = events[-1]
        rate = done.metrics.expert_cache_hit_rate
        on_gpu = sum(m.expert_pairs_on_gpu for m in steps)
        total = sum(m.expert_pairs for m in steps)
        assert rate == pytest.approx(on_gpu / total) and 0 < rate < 1
    finally:
        s.close()


def test_original_rules_example_on_the_twin(tiny_gguf_model, reference, tmp_path):
    _, expected = reference
    rules = tmp_path / "rules.yaml"
    rules.write_text(ORIGINAL_EXAMPLE)
    if not torch.cuda.is_available():
        with pytest.raises(TesseraError, match="no CUDA device is available"):
            engine.load(tiny_gguf_model, placement=str(rules))
    s = engine.load(tiny_gguf_model, backend="Torch", placement=str(rules), twin=True)
    try:
        text = s.explain()
        assert "rule 1 (line 2)" in text and "prefill of 4+ tokens" in text
        torch.testing.assert_close(all_logits(s, TEXT_IDS), expected, rtol=1e-4, atol=1e-4)  # layerwise prefill path
    finally:
        s.close()



def test_warm_up_on_recent_prompts_makes_their_experts_resident(tiny_gguf_model):
    s = engine.load(tiny_gguf_model, backend="Torch",
                    placement=PlacementSettings(device="cuda", gpu_experts_per_layer=2), twin=True)
    try:
        prompts = ["What is 12 + 30?", "Reverse the list 3, 1, 2."]
        counts = {}
        for text in prompts:  # independent count of routing on those prompts
            stats = RoutingStats()
            ids = s.tokenizer.encode(text)
            s.model.forward(torch.tensor(ids), s.model.new_cache(len(ids)), stats=stats)
            for layer, c in stats.counts.items():
                counts[layer] = counts.get(layer, 0) + c
        s.model.experts.counts = {layer: torch.zeros_like(c) for layer, c in s.model.experts.counts.items()}
        resident = s.warm_expert_cache(prompts)
        for layer, c in counts.items():
            top = set(torch.topk(c.double() + 1e-6 * -torch.arange(c.numel()), 2).indices.tolist())
            chosen = set(resident[layer])
            assert sum(int(c[e]) for e in chosen) == sum(int(c[e]) for e in top)  # as good as the true top-2 (ties)
    finally:
        s.close()
