"""From a placement plan to a running model: which device each dense part gets, and whether the routed experts go through
the hot-expert cache. The one place where the plan meets the model; engine/model.py only receives devices and an
ExpertBackend.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import TesseraError
from engine.expert_cache import HotExpertCache
from engine.experts import ExpertBackend, LayerExperts
from engine.model import ModelDevices
from engine.placement import PlacementPlan, check_cuda_available, load_plan, part_names, plan_from_settings



@dataclass(frozen=True)
class PlacementSettings:
    """The settings panel's placement: dense parts on `device`, a hot-expert cache of `gpu_experts_per_layer` experts.
    `twin` runs the GPU half on the CPU with the same code (for tests and for trying the cache without a GPU)."""

    device: str = "cpu"
    gpu_experts_per_layer: int = 0
    twin: bool = False


PlacementArg = PlacementPlan | PlacementSettings | str | os.PathLike | None


def resolve_plan(placement: PlacementArg, config, *, backend: str = "Auto", twin: bool = False) -> PlacementPlan:
    """The plan for this model: from a rules file, a ready plan, or (None) everything on the CPU.

    A backend named explicitly (not Auto) overrides the rules' backend; `twin` runs every accelerator part on the CPU
    with the same code path. Raises a TesseraError when the plan needs CUDA that this machine lacks (unless twin).
    """
    n, moe = config.num_hidden_layers, [config.is_moe_layer(i) for i in range(config.num_hidden_layers)]
    if placement is None:
        plan = plan_from_settings(n, moe, device="cpu", backend=backend, twin=twin)
    elif isinstance(placement, PlacementSettings):
        plan = plan_from_settings(n, moe, device=placement.device, backend=backend,
                                  gpu_experts_per_layer=placement.gpu_experts_per_layer, twin=placement.twin or twin)
    elif isinstance(placement, PlacementPlan):
        plan = placement
        missing = [name for name, _kind in part_names(n, moe) if name not in plan.parts]
        if missing:
            raise TesseraError("placement", f"the plan does not place {missing[0]} of this model")
        plan.twin = plan.twin or twin
    else:
        plan = load_plan(Path(placement), n, moe, twin=twin)
    if backend != "Auto":
        plan.experts_backend = backend
    check_cuda_available(plan)
    return plan


def model_devices(plan: PlacementPlan, config) -> ModelDevices:
    """Devices of the dense parts; the twin maps every accelerator to the CPU."""

    def dev(part: str) -> str:
        d = plan.device_of(part)
        return "cpu" if plan.twin else d

    layers = []
    for i in range(config.num_hidden_layers):
        attn = dev(f"model.layers.{i}.self_attn")
        others = {dev(f"model.layers.{i}.{p}") for p in ("mlp", "mlp.gate") if f"model.layers.{i}.{p}" in plan.parts}
        if others - {attn}:
            raise TesseraError(f"placement layer {i}", "attention, norms and router of a layer must share one device "
                               f"(attention on {attn}, router/MLP on {', '.join(sorted(others))})")
        layers.append(attn)
    head = dev("lm_head")
    if dev("model.norm") != head:
        raise TesseraError("placement", "model.norm and lm_head must share one device")
    return ModelDevices(embed=dev("model.embed_tokens"), layers=tuple(layers), head=head)


def uses_expert_cache(plan: PlacementPlan) -> bool:
    """Whether the routed experts need the cache layer: an accelerator is in play (or its twin was asked for)."""
    return plan.accelerator != "cpu" or plan.twin


def wrap_experts(plan: PlacementPlan, cpu_backend: ExpertBackend, layers: dict[int, LayerExperts], config
                 ) -> ExpertBackend:
    """The CPU backend alone, or the hot-expert cache around it (on the GPU, or on the CPU twin)."""
    if not uses_expert_cache(plan) or not layers:
        return cpu_backend
    return HotExpertCache(
        cpu_backend, layers,
        device="cpu" if plan.twin else plan.accelerator,
        experts_per_layer=plan.resolve_gpu_experts(config.num_experts),
        prefill_threshold=plan.gpu_prefill_threshold,
    )
