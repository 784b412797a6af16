"""Will a model fit? A pre-flight estimate from header facts (engine.inspect_model's numbers) against free memory."""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1024**3


def _first(info: dict, *keys, default=0):
    for k in keys:
        v = info.get(k)
        if v:
            return v
    return default


@dataclass(frozen=True)
class FitEstimate:
    weights_bytes: int
    kv_bytes: int
    needed_bytes: int
    ram_available: int
    vram_free: int
    verdict: str  # "fits" | "tight" | "won't fit" | "unknown"

    @property
    def text(self) -> str:
        if self.verdict == "unknown":
            return "Fit: unknown (the file does not say how large its weights are)"
        need = f"needs about {self.needed_bytes / GiB:.2f} GiB"
        detail = f"(weights {self.weights_bytes / GiB:.2f} GiB + KV cache {self.kv_bytes / GiB:.2f} GiB)"
        have = f"{self.ram_available / GiB:.1f} GiB RAM free"
        if self.vram_free:
            have += f", {self.vram_free / GiB:.1f} GiB VRAM free"
        return f"{self.verdict.capitalize()}: {need} {detail}; {have}"


def kv_cache_bytes(info: dict, context_length: int, bytes_per_value: int = 4) -> int:
    layers = int(_first(info, "num_hidden_layers", "layers", "block_count"))
    kv_heads = int(_first(info, "num_key_value_heads", "kv_heads", "head_count_kv"))
    head_dim = int(_first(info, "head_dim", "key_length"))
    return 2 * layers * kv_heads * head_dim * int(context_length) * bytes_per_value


def estimate(info: dict, context_length: int, ram_available: int, vram_free: int = 0) -> FitEstimate:
    """RAM+VRAM must hold the weights as loaded (quantized files are expanded), the KV cache and ~10 % slack."""
    weights = int(_first(info, "loaded_bytes", "memory_bytes", "total_bytes", "size_bytes"))
    kv = kv_cache_bytes(info, context_length)
    needed = int((weights + kv) * 1.1)
    available = ram_available + vram_free
    if weights <= 0:
        verdict = "unknown"
    elif needed <= 0.8 * available:
        verdict = "fits"
    elif needed <= available:
        verdict = "tight"
    else:
        verdict = "won't fit"
    return FitEstimate(weights, kv, needed, ram_available, vram_free, verdict)


def ram_available() -> int:
    import psutil

    return int(psutil.virtual_memory().available)
