"""Helpers for the native kernel tests: backend lists (emulated AMX included), random layers, NMSE tolerances."""

import torch

import tessera.engine.backends as B
from tessera.engine.experts import LayerExperts

# Tolerances as NMSE = |y - ref|^2 / |ref|^2 against the Reference backend (double accumulation, weights as loaded).
# f32-activation bf16 paths differ only in summation order; bf16-activation (prefill) paths round x and the
# intermediate activation to bf16 (relative step 2^-8, NMSE ~1e-5); int8 paths quantize weights and activations.
NMSE_TOL = {"exact": 1e-9, "bf16": 1e-4, "int8": 1e-3}


# Backends whose small-T path (T < 16) keeps activations in f32 with exact bf16 weights.
F32_DECODE = {"AVX512", "AVX2"}


def precision_of(name: str) -> str:
    return "int8" if "Int8" in name else "bf16"


def native_backends() -> list[str]:
    return [n for n in B.available_names(include_emulated=True) if n != "Reference"]


def random_layer(E: int, H: int, I: int, dtype=torch.bfloat16, seed: int = 0) -> LayerExperts:
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(dtype)

    return LayerExperts(gate_proj=w(E, I, H), up_proj=w(E, I, H), down_proj=w(E, H, I))


def nmse(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((y.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)) ** 2)
