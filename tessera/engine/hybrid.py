"""From a placement plan to a running model: which device each dense part gets, which CPU backend computes the routed
experts, and whether they go through the hot-expert cache. The one place where the plan meets the model (`build`);
tessera/engine/model.py only receives devices and an ExpertBackend.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tessera.engine.errors import TesseraError
from tessera.engine.events import ProgressEvent
from tessera.engine.expert_cache import HotExpertCache
from tessera.engine.experts import ExpertBackend, LayerExperts
from tessera.engine.model import ModelDevices
from tessera.engine.placement import PlacementPlan, check_cuda_available, load_plan, part_names, plan_from_settings


@dataclass(frozen=True)
class PlacementSettings:
    """The settings panel's placement: dense parts on `device`, a hot-expert cache of `gpu_experts_per_layer` experts.
    Whether the GPU half runs on its CPU twin is `engine.load(twin=...)`, the one twin flag."""

    device: str = "cpu"
    gpu_experts_per_layer: int = 0


PlacementArg = PlacementPlan | PlacementSettings | str | os.PathLike | None


def resolve_plan(placement: PlacementArg, config, *, backend: str = "Auto", twin: bool = False) -> PlacementPlan:
    """The plan for this model: from a rules file, a ready plan, or (None) everything on the CPU.

    A backend named explicitly (not Auto) overrides the rules' backend; `twin` (the one twin flag; it replaces a ready
    plan's) runs every accelerator part on the CPU with the same code path. Raises a TesseraError when the plan needs
    CUDA that this machine lacks (unless twin).
    """
    n, moe = config.num_hidden_layers, [config.is_moe_layer(i) for i in range(config.num_hidden_layers)]
    if placement is None:
        plan = plan_from_settings(n, moe, device="cpu", backend=backend)
    elif isinstance(placement, PlacementSettings):
        plan = plan_from_settings(n, moe, device=placement.device, backend=backend,
                                  gpu_experts_per_layer=placement.gpu_experts_per_layer)
    elif isinstance(placement, PlacementPlan):
        plan = placement
        missing = [name for name, _kind in part_names(n, moe) if name not in plan.parts]
        if missing:
            raise TesseraError("placement", f"the plan does not place {missing[0]} of this model")
    else:
        plan = load_plan(Path(placement), n, moe)
    plan.twin = twin
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


@dataclass(frozen=True)
class ModelParts:
    """What the model is built from, besides its weights: where the dense parts run and what computes the experts."""

    devices: ModelDevices
    experts: ExpertBackend  # the plan's CPU backend, inside the hot-expert cache when the plan has one
    backend_name: str  # the CPU backend that runs ("AVX512", "Torch"): "Auto" resolved
    backend_reason: str  # why it runs: the registry's reason, or why Auto picked it


def build(plan: PlacementPlan, layers: dict[int, LayerExperts], config, *, threads: int | None, model_id: str,
          progress: Callable[[ProgressEvent], None] | None = None, sources: tuple = ()) -> ModelParts:
    """The one call from a plan to the parts of a model: devices of the dense parts, the CPU backend (packed through
    the packed-weight cache; engine.backends resolves its name) and the hot-expert cache around it when the plan
    uses one. `sources`: the mapped file parts the layers are views of (engine.source_digest.SourceFile), so an
    unchanged file's layer digests are not computed again. A first load returns before its packs are all written to
    the cache (engine.pack_store)."""
    from tessera.engine import native, tuned
    from tessera.engine.backends import resolve
    from tessera.engine.pack_cache import default_root

    concrete, _ = resolve(plan.experts_backend)
    if concrete != "Torch":  # this CPU's measured kernel knobs (or, once, a short calibration) before packing
        tuned.prepare_for_load(concrete, config.num_experts, config.hidden_size, config.moe_intermediate_size,
                               config.num_experts_per_tok, threads=threads, progress=progress)
    cpu = native.make_backend(plan.experts_backend, layers, threads=threads, cache_dir=default_root(),
                              model_id=model_id, progress=progress, sources=sources, store_in_background=True)
    return ModelParts(model_devices(plan, config), wrap_experts(plan, cpu, layers, config), cpu.name, cpu.reason)
