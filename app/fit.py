"""Will a model fit? A pre-flight estimate from header facts against free memory.

`info` is engine.inspect_model's ModelInfo as the worker hands it over (a dict of its fields, docs/INTERFACES.md):
`loaded_bytes`, `num_hidden_layers`, `num_key_value_heads` and `head_dim` are read by those names.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1024**3


@dataclass(frozen=True)
class FitEstimate:
    weights_bytes: int
    kv_bytes: int
    needed_bytes: int
    ram_available: int
    vram_free: int
    verdict: str  # "fits" | "tight" | "won't fit"

    @property
    def text(self) -> str:
        need = f"needs about {self.needed_bytes / GiB:.2f} GiB"
        detail = f"(weights {self.weights_bytes / GiB:.2f} GiB + KV cache {self.kv_bytes / GiB:.2f} GiB)"
        have = f"{self.ram_available / GiB:.1f} GiB RAM free"
        if self.vram_free:
            have += f", {self.vram_free / GiB:.1f} GiB VRAM free"
        return f"{self.verdict.capitalize()}: {need} {detail}; {have}"


def kv_cache_bytes(info: dict, context_length: int, bytes_per_value: int = 2) -> int:
    """Keys and values of every layer for `context_length` positions (bfloat16, as engine.kv_cache stores them)."""
    per_position = 2 * info["num_hidden_layers"] * info["num_key_value_heads"] * info["head_dim"] * bytes_per_value
    return per_position * context_length


def estimate(info: dict, context_length: int, ram_available: int, vram_free: int = 0) -> FitEstimate:
    """RAM+VRAM must hold the weights as loaded (quantized files are expanded), the KV cache and ~10 % slack."""
    weights = info["loaded_bytes"]
    kv = kv_cache_bytes(info, context_length)
    needed = int((weights + kv) * 1.1)
    available = ram_available + vram_free
    if needed <= 0.8 * available:
        verdict = "fits"
    elif needed <= available:
        verdict = "tight"
    else:
        verdict = "won't fit"
    return FitEstimate(weights, kv, needed, ram_available, vram_free, verdict)


def ram_available() -> int:
    import psutil

    return int(psutil.virtual_memory().available)
