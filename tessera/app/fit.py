"""Will a model fit? The engine's own RAM estimate for the load the settings ask for, against free memory.

`info` is engine.inspect_model's ModelInfo as the worker hands it over (a dict of its fields, docs/INTERFACES.md) with
what tessera/app/worker.py adds from engine.model_summary: `ram` (engine.model_info.estimate_ram for this backend and
context length: the weights as held, the backend's packed copy of the experts, the KV cache and the loading peak, with
`total_bytes`) and `ram_text` (the same numbers in words). Nothing is recomputed here: the panel, this estimate and
`tessera-cli check --model` show one estimate, the one the loader is sized by.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class FitEstimate:
    needed_bytes: int  # the engine's RamEstimate.total_bytes
    ram_text: str  # the engine's words for it, with its parts
    ram_available: int
    vram_free: int
    verdict: str  # "fits" | "tight" | "won't fit"

    @property
    def text(self) -> str:
        have = f"{self.ram_available / GB:.1f} GB RAM free"
        if self.vram_free:
            have += f", {self.vram_free / GB:.1f} GB VRAM free"
        return f"{self.verdict.capitalize()}: this load needs {self.ram_text}; {have}"


def estimate(info: dict, ram_available: int, vram_free: int = 0) -> FitEstimate:
    """The load fits when the engine's estimate is at most the engine's fit share (`fit_share`, 90 %: the margin
    `tessera-cli check` judges by) of free RAM + VRAM, is tight up to 100 %, and won't fit beyond."""
    needed = int(info["ram"]["total_bytes"])
    available = ram_available + vram_free
    if needed <= float(info["fit_share"]) * available:
        verdict = "fits"
    elif needed <= available:
        verdict = "tight"
    else:
        verdict = "won't fit"
    return FitEstimate(needed, info["ram_text"], ram_available, vram_free, verdict)


def ram_available() -> int:
    import psutil

    return int(psutil.virtual_memory().available)
