"""The GPU section: CUDA devices through torch, with measured pinned host<->device copy bandwidth.

No CUDA device (CPU-only torch, no driver, no GPU) is a normal answer: an empty list and a plain-words `status`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tessera.engine.errors import Cancelled
from tessera.engine.events import ProgressEvent

GB = 1e9
COPY_BYTES = 256 << 20  # per copy; large enough that launch latency is noise
COPY_REPEATS = 5


def _copy_gbs(torch, src, dst, repeats: int) -> float:
    """GB/s of the best of `repeats` copies src -> dst, timed after a warm-up."""
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return src.numel() * src.element_size() / best / GB


def driver_version(torch) -> str | None:
    try:
        v = int(torch._C._cuda_getDriverVersion())  # e.g. 12040 -> "12.4"
        return f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:  # noqa: BLE001 - private API; absent on some builds
        return None


def probe_gpus(*, copy_bytes: int = COPY_BYTES, progress: Callable[[ProgressEvent], None] | None = None,
               cancel: threading.Event | None = None) -> tuple[list[dict], str]:
    """([{name, vram_total_gb, vram_free_gb, compute_capability, h2d_gbs, d2h_gbs, ...}], status line)."""
    try:
        import torch  # heavy; only when the GPU section is probed
    except ImportError as e:
        return [], f"no CUDA device: torch is not installed ({e})"
    if torch.version.cuda is None:
        return [], f"no CUDA device: this torch build ({torch.__version__}) has no CUDA support"
    if not torch.cuda.is_available():
        return [], f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable GPU/driver"
    gpus = []
    count = torch.cuda.device_count()
    for i in range(count):
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        props = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        with torch.cuda.device(i):
            n = copy_bytes // 4
            host = torch.ones(n, dtype=torch.float32).pin_memory()  # [n]
            dev = torch.empty(n, dtype=torch.float32, device=f"cuda:{i}")  # [n]
            h2d = _copy_gbs(torch, host, dev, COPY_REPEATS)
            d2h = _copy_gbs(torch, dev, host, COPY_REPEATS)
            del host, dev
            torch.cuda.empty_cache()
        gpus.append({
            "index": i,
            "name": props.name,
            "vram_total_gb": round(total / GB, 2),
            "vram_free_gb": round(free / GB, 2),
            "compute_capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "h2d_gbs": round(h2d, 2),
            "d2h_gbs": round(d2h, 2),
            "driver_version": driver_version(torch),
            "cuda_runtime": torch.version.cuda,
        })
        if progress is not None:
            progress(ProgressEvent("gpu", i + 1, count, f"{props.name}: H2D {h2d:.1f} GB/s, D2H {d2h:.1f} GB/s"))
    return gpus, f"{count} CUDA device(s), torch {torch.__version__}, CUDA runtime {torch.version.cuda}"
