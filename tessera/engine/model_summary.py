"""A model's type mix and the RAM one load of it takes, in words, for people: the model panel (through
tessera/app/worker.py), the fit estimate (tessera/app/fit.py) and `tessera-cli check --model` / the hardware wizard all
show these texts, so they show the same numbers. The numbers themselves come from engine.model_info (`inspect_model` /
`estimate_ram`, the estimate the loader is sized by); nothing here recomputes them. Plain Python: no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import os

    from tessera.engine.config import ModelConfig
    from tessera.engine.model_info import ModelInfo, RamEstimate
    from tessera.engine.weights import ModelFile

# A load "fits" when it needs at most this share of the free RAM (+ free VRAM): the rest is for the OS, other programs
# and activations. The one margin: `check`/the hardware wizard (engine.hardware.verdict) and the app's fit line
# (tessera/app/fit.py, which reads it from `facts`) judge with it, so they never disagree near the edge.
FIT_SHARE = 0.9

_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def unit_for(sizes: Iterable[int]) -> tuple[str, float]:
    """(unit, bytes per unit) for showing `sizes` side by side in one unit: the largest decimal unit the biggest of
    them reaches (GB, MB or kB; B below that)."""
    top = max(sizes, default=0)
    return next(((u, s) for u, s in _UNITS if top >= s), ("B", 1.0))


def in_unit(n: int, unit: tuple[str, float]) -> str:
    """`n` bytes in `unit` (unit_for): two decimals under 10 of the unit, one under 100, none above."""
    name, size = unit
    v = n / size
    if name == "B":
        return f"{int(n)} B"
    digits = 2 if v < 10 else 1 if v < 100 else 0
    return f"{v:.{digits}f} {name}"


def size_text(n: int) -> str:
    """Bytes, readably, in the unit they reach (18.6 GB, 3.51 MB)."""
    return in_unit(n, unit_for([n]))


def type_mix(type_bytes: Mapping[str, int]) -> str:
    """The file's types by their share of the stored bytes, largest first: "Q4_K 76 %, Q6_K 23 %, F32 1 %" (a share
    under half a percent reads "<1 %")."""
    total = sum(type_bytes.values())
    if total <= 0:
        return ""
    parts = []
    for name, b in sorted(type_bytes.items(), key=lambda kv: (-kv[1], kv[0])):
        share = 100 * b / total
        parts.append(f"{name} {round(share)} %" if share >= 0.5 else f"{name} <1 %")
    return ", ".join(parts)


def ram_parts(ram: Mapping[str, int | str]) -> list[tuple[str, int]]:
    """The named parts of a load's RAM (engine.model_info.RamEstimate as a mapping), those above zero."""
    parts = [
        ("weights", int(ram["weights_bytes"])),
        (f"packed experts for {ram['backend']}", int(ram["packed_bytes"])),
        (f"KV cache for {int(ram['context_length']):,} tokens", int(ram["kv_bytes"])),
        ("loading peak", int(ram["transient_bytes"])),
        ("prefill buffers", int(ram["prefill_bytes"])),
    ]
    return [(label, n) for label, n in parts if n > 0]


def ram_text(ram: Mapping[str, int | str]) -> str:
    """What one load takes, in one unit: "about 19.95 GB: weights 18.60 GB + packed experts for AVX512Int8 0.40 GB +
    KV cache for 4,096 tokens 0.45 GB + loading peak 0.50 GB". `ram` needs `total_bytes` (facts() adds it)."""
    total = int(ram["total_bytes"])
    unit = unit_for([total])
    detail = " + ".join(f"{label} {in_unit(n, unit)}" for label, n in ram_parts(ram))
    return f"about {in_unit(total, unit)}: {detail}"


def ram_dict(ram: RamEstimate) -> dict:
    """A RamEstimate as plain data, its total included (dataclasses.asdict leaves properties out)."""
    return {**dataclasses.asdict(ram), "total_bytes": ram.total_bytes}


def facts(info: ModelInfo) -> dict:
    """What the panel, the fit estimate and the hardware check show of an inspected model (`info.ram` sized for the
    load asked for): {"type_mix": str, "ram": dict with total_bytes, "ram_text": str, "fit_share": FIT_SHARE}."""
    if info.ram is None:
        raise ValueError(f"{info.path}: ModelInfo without its RAM estimate (engine.model_info.inspect_model fills it)")
    ram = ram_dict(info.ram)
    return {"type_mix": type_mix(info.type_bytes), "ram": ram, "ram_text": ram_text(ram), "fit_share": FIT_SHARE}


def sized_for_load(
    model: ModelFile | str | os.PathLike[str], *, context_length: int | None = None, backend: str = "Auto",
    kv_cache_type: str = "bf16",
) -> ModelInfo:
    """engine.model_info.inspect_model with `ram` sized for the load `engine.load(model, backend=backend,
    context_length=context_length, kv_cache_type=kv_cache_type)` makes: the context a wish clamped to the model's
    trained one, as the Session does.
    An unknown or unavailable backend raises the engine's named error, as loading would."""
    from tessera.engine.model_info import estimate_ram, inspect_model

    info = inspect_model(model, backend=backend, kv_cache_type=kv_cache_type)
    if context_length is not None:
        ctx = min(context_length, info.context_length)
        if info.ram is None or ctx != info.ram.context_length:
            info = dataclasses.replace(info, ram=estimate_ram(info, ctx, backend, kv_cache_type))
    return info


def paper_info(cfg: ModelConfig, name: str, dtype: str, *, context_length: int | None = None,
               backend: str = "Auto", kv_cache_type: str = "bf16") -> ModelInfo:
    """The ModelInfo a GGUF of config `cfg` written with `--dtype dtype` (bf16, q8_0, q4_k_m, ...: the per-tensor mix
    engine.quant_mix gives make-model and convert) would have, with `ram` from the same estimate_ram a real file gets:
    what a published model needs, on paper, before anything is downloaded."""
    import gguf

    from tessera.engine.checkpoint_layout import gguf_tensors
    from tessera.engine.model_info import _info, estimate_ram
    from tessera.engine.quant_mix import parse_output_type, tensor_types
    from tessera.engine.quantized import held_bytes
    from tessera.engine.quants import nbytes

    types = tensor_types(cfg, parse_output_type(dtype))
    sizes = []  # as engine.model_info.inspect_model collects them from a file's header
    for t in gguf_tensors(cfg):
        qtype, n = types[t.name], 1
        for d in t.shape:
            n *= d
        stored = nbytes(qtype, t.shape)
        held = held_bytes(qtype, n, stored, t.stacked, len(t.shape))
        sizes.append((qtype.name, n, stored, held, t.stacked, t.kind == gguf.MODEL_TENSOR.TOKEN_EMBD))
    info = _info(f"{name} ({dtype}, on paper)", "gguf", name, cfg, sizes)
    ctx = min(context_length or info.context_length, info.context_length)
    return dataclasses.replace(info, ram=estimate_ram(info, ctx, backend, kv_cache_type))
