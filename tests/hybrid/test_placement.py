"""Placement rules parse to the expected plans; bad rules give errors naming the rule and the key."""

from pathlib import Path

import pytest
import torch

from tessera.engine.errors import TesseraError
from tessera.engine.placement import (
    check_cuda_available,
    load_plan,
    parse_rules,
    plan_from_rules,
    plan_from_settings,
)

RESOURCES = Path(__file__).resolve().parents[2] / "tessera" / "resources" / "placement"

# The example from the product's original description.
ORIGINAL_EXAMPLE = r'''
- match:
    name: "^model\\.layers\\..*\\.mlp\\.experts$"
  replace:
    class: ktransformers.operators.experts.KTransformersExpertsV2
    kwargs:
      backend: "AMXInt8"
      prefill_device: "cuda"
      generate_device: "cpu"
'''


def plan(text, layers=3, moe=None, **kw):
    moe = moe or [True] * layers
    return plan_from_rules(parse_rules(text, "rules.yaml"), layers, moe, source="rules.yaml", **kw)


def test_original_example_resolves_to_amxint8_experts_prefilled_on_cuda():
    p = plan(ORIGINAL_EXAMPLE)
    assert p.experts_backend == "AMXInt8"
    for i in range(3):
        experts = p.parts[f"model.layers.{i}.mlp.experts"]
        assert (experts.prefill_device, experts.generate_device) == ("cuda", "cpu")
        assert experts.rule == "rule 1 (line 2)"
        assert p.parts[f"model.layers.{i}.self_attn"].generate_device == "cpu"  # unmatched parts stay on the CPU
    assert p.needs_cuda()
    assert "AMXInt8" in p.explain(128)


def test_first_matching_rule_wins_and_layers_can_differ():
    text = r'''
- match: {name: "^model\\.layers\\.0\\.self_attn$"}
  replace: {class: default, kwargs: {generate_device: "cpu", prefill_device: "cpu"}}
- match: {name: "self_attn$"}
  replace: {class: KQwen3MoeAttention, kwargs: {generate_device: "cuda:0", prefill_device: "cuda:0"}}
'''
    p = plan(text, layers=4)
    assert p.parts["model.layers.0.self_attn"].generate_device == "cpu"
    assert [p.parts[f"model.layers.{i}.self_attn"].generate_device for i in (1, 2, 3)] == ["cuda:0"] * 3
    rows = {r[0]: r for r in p.rows()}
    assert rows["model.layers.{1-3}.self_attn"][2] == "cuda:0"
    assert p.accelerator == "cuda:0"


def test_dense_layers_have_no_experts_part():
    p = plan(ORIGINAL_EXAMPLE, layers=3, moe=[False, True, True])
    assert "model.layers.0.mlp.experts" not in p.parts
    assert "model.layers.1.mlp.experts" in p.parts


def test_gpu_expert_budget_from_rules():
    text = ORIGINAL_EXAMPLE.replace('generate_device: "cpu"', 'generate_device: "cpu"\n      gpu_experts: 5')
    assert plan(text).resolve_gpu_experts(128) == 5
    text = ORIGINAL_EXAMPLE.replace('generate_device: "cpu"', 'generate_device: "cpu"\n      gpu_experts_ratio: 0.25')
    assert plan(text).resolve_gpu_experts(128) == 32


def test_shipped_rules_parse():
    hybrid = load_plan(RESOURCES / "hybrid-cuda.yaml", 4, [True] * 4)
    assert hybrid.parts["model.layers.2.self_attn"].generate_device == "cuda"
    assert hybrid.parts["model.embed_tokens"].generate_device == "cpu"
    assert hybrid.resolve_gpu_experts(128) == 32
    cpu = load_plan(RESOURCES / "cpu-only.yaml", 4, [True] * 4)
    assert not cpu.needs_cuda() and cpu.accelerator == "cpu"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("- match: {name: x}\n  replace: {class: default}\n  priority: 3\n", "rule 1 (line 1): unknown key 'priority'"),
        ("- match: {name: '^lm_head$'}\n  replace: {class: default, kwargs: {device: cuda}}\n", "unknown key 'device'"),
        ("- match: {name: '^lm_head$'}\n  replace: {class: KExpertsCPU}\n",
         "class 'KExpertsCPU' cannot replace lm_head"),
        ("- match: {name: 'experts$'}\n  replace: {class: Experts, kwargs: {backend: AMX}}\n", "unknown backend 'AMX'"),
        ("- match: {name: 'experts$'}\n  replace: {class: Experts, kwargs: {generate_device: cuda}}\n",
         "generated on the CPU backend"),
        ("- match: {name: '('}\n  replace: {class: default}\n", "not a valid regular expression"),
        ("- match: {name: 'x'}\n", "`replace` is missing"),
        ("match: {name: 'x'}\n", "must be a YAML list"),
        ("- match: {name: 'attn$'}\n  replace: {class: default, kwargs: {prefill_device: tpu}}\n",
         "unknown device 'tpu'"),
        ("- match: {name: 'x', class: foo.Bar}\n  replace: {class: default}\n", "match.class 'foo.Bar'"),
        ("- [unclosed\n", "not valid YAML"),
        ("\n- match: {name: x}\n  replace: {class: default}\n"
         "- match: {name: y}\n  replace: {class: default}\n  when: 1\n",
         "rule 2 (line 4)"),
    ],
)
def test_bad_rules_name_the_rule_and_problem(text, needle):
    with pytest.raises(TesseraError) as e:
        plan(text)
    assert needle in str(e.value)
    assert "rules.yaml" in str(e.value)


def test_choosing_cuda_without_cuda_is_a_clear_error_unless_twin():
    p = plan(ORIGINAL_EXAMPLE)
    if torch.cuda.is_available():
        check_cuda_available(p)  # nothing to say on a GPU machine
    else:
        with pytest.raises(TesseraError, match="no CUDA device is available"):
            check_cuda_available(p)
    twin = plan(ORIGINAL_EXAMPLE)
    twin.twin = True  # as engine.load(twin=True) sets it
    check_cuda_available(twin)  # the CPU twin never needs CUDA


def test_settings_plan():
    p = plan_from_settings(2, [True, True], device="cuda", backend="AVX512", gpu_experts_per_layer=4)
    assert p.parts["model.layers.1.mlp.experts"].generate_device == "cpu"
    assert p.parts["lm_head"].generate_device == "cuda"
    assert p.experts_backend == "AVX512" and p.resolve_gpu_experts(3) == 3
    with pytest.raises(TesseraError, match="unknown device"):
        plan_from_settings(2, [True, True], device="gpu")


def test_experts_prefill_on_cuda_sets_layerwise_prefill_threshold():
    assert plan(ORIGINAL_EXAMPLE).gpu_prefill_threshold == 128
    text = ORIGINAL_EXAMPLE.replace('generate_device: "cpu"', 'generate_device: "cpu"\n      gpu_prefill_threshold: 32')
    assert plan(text).gpu_prefill_threshold == 32
    assert "prefill of 32+ tokens" in plan(text).explain(8)
    cpu_only = ORIGINAL_EXAMPLE.replace('prefill_device: "cuda"', 'prefill_device: "cpu"')
    assert plan(cpu_only).gpu_prefill_threshold is None


def test_attention_cannot_switch_device_between_phases():
    text = ("- match: {name: 'self_attn$'}\n"
            "  replace: {class: default, kwargs: {prefill_device: cuda, generate_device: cpu}}\n")
    with pytest.raises(TesseraError, match="only the routed experts may prefill on another device"):
        plan(text)
