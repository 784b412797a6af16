"""Hardware validation: one implementation behind `tessera-cli check` and the app's hardware wizard.

`probe(...)` returns the report as a plain JSON-able dict:
  cpu: {model, vendor, sockets, physical_cores, logical_cores, numa_nodes, allowed_cpus, flags: {name: bool},
        other_flags, xcr0, xcr0_state, amx: {usable, reason}, source}
  memory: {total_gb, available_gb, read_bandwidth_gbs, read_bandwidth_1t_gbs, bandwidth_threads, bandwidth_source,
           thp_enabled, thp_defrag, hugepages_total, hugepages_free, hugepage_size_kb}
  gpus: [{name, vram_total_gb, vram_free_gb, compute_capability, h2d_gbs, d2h_gbs, driver_version, cuda_runtime, ...}]
  gpu_status: str            ("no CUDA device: ..." is a normal answer)
  backends: {NAME: {available, reason, description, weights}} (engine.backends), auto_backend, auto_reason
  quant_kernels: [{name, available, reason, avx_vnni}]: the kernels that read GGUF quantized blocks (best first)
  tuning: engine.tuned.status(): {cpu, build, path, stored, measured_at, backend, seconds, message,
          knobs: {NAME: {value, source: measured|environment|default}}}
  model: {...fit and roofline...} (only when a model or preset was given; also type_mix, ram
         (engine.model_info.RamEstimate with total_bytes) and ram_text: the load the app's model panel sizes, for a
         preset the file of preset_dtype on paper)
  remedies: [{topic, problem, remedy}]
Progress arrives as `ProgressEvent(stage, done, total, detail)` with done/total over the whole probe; `cancel` (a
threading.Event) is checked between steps and raises `engine.errors.Cancelled`.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Callable

from tessera.engine.events import ProgressEvent
from tessera.engine.hardware.cpu import probe_cpu
from tessera.engine.hardware.gpu import probe_gpus
from tessera.engine.hardware.memory import SLICES_PER_RUN, probe_memory
from tessera.engine.hardware.render import to_json, to_markdown
from tessera.engine.hardware.verdict import (
    backends,
    estimate,
    model_load,
    model_shape,
    preset_load,
    quant_kernels,
    remedies,
)

__all__ = ["DEFAULT_SECONDS", "MODEL_CONTEXT", "QUICK_SECONDS", "probe", "to_json", "to_markdown"]

DEFAULT_SECONDS = 3.0  # multi-threaded bandwidth measurement; the single-thread one takes half
QUICK_SECONDS = 0.4
MODEL_CONTEXT = 4096  # tokens of KV cache a model's RAM is sized for: the app's default context length setting


def probe(*, seconds: float = DEFAULT_SECONDS, threads: int | None = None, model: str | None = None,
          preset: str | None = None, gpu: bool = True, context_length: int = MODEL_CONTEXT, backend: str = "Auto",
          preset_dtype: str = "bf16", kv_cache_type: str = "bf16",
          progress: Callable[[ProgressEvent], None] | None = None,
          cancel: threading.Event | None = None) -> dict:
    """Run every probe and return the report. `threads` defaults to the physical cores this process may use. A model
    file's RAM is sized for a load with expert backend `backend` and `context_length` tokens of context, as the app
    sizes it with the same settings; a preset's is sized on paper for the GGUF `--dtype preset_dtype` would write
    (default bf16, the published checkpoint's type). Both size a KV cache of `kv_cache_type` (bf16 or q8_0)."""
    # Resolve the model first: a bad path, preset or backend is an error before any seconds are spent measuring.
    shape = model_shape(model, preset) if (model or preset) else None
    load = None
    if model:
        load = model_load(model, context_length=context_length, backend=backend, kv_cache_type=kv_cache_type)
    elif preset:
        load = preset_load(preset, preset_dtype, context_length=context_length, backend=backend,
                           kv_cache_type=kv_cache_type)
    total = 2 + 2 * SLICES_PER_RUN + 1  # cpu, two bandwidth runs, gpu, verdict
    done = 0

    def step(stage: str, detail: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(ProgressEvent(stage, done, total, detail))

    def inner(ev: ProgressEvent) -> None:
        step(ev.stage, ev.detail)

    t0 = time.perf_counter()
    if progress is not None:
        progress(ProgressEvent("cpu", 0, total, "reading CPUID, XCR0 and the AMX permission"))
    cpu = probe_cpu()
    step("cpu", f"{cpu['model']}: {cpu['physical_cores']} cores")
    n = threads or min(cpu["physical_cores"], cpu["allowed_cpus"])
    memory = probe_memory(n, seconds, progress=inner, cancel=cancel)
    gpus, gpu_status = probe_gpus(cancel=cancel) if gpu else ([], "GPU probe skipped (--no-gpu)")
    step("gpu", gpu_status)
    report = {
        "tessera_report": 1,
        "host": platform.node(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpu": cpu,
        "memory": memory,
        "gpus": gpus,
        "gpu_status": gpu_status,
    }
    table, auto, auto_reason = backends()
    report.update(backends=table, auto_backend=auto, auto_reason=auto_reason, quant_kernels=quant_kernels())
    from tessera.engine import tuned

    report["tuning"] = tuned.status()  # this CPU's measured kernel knobs, or that defaults are in use
    if shape is not None:
        sized_for = load["ram"]["backend"] if load is not None else auto
        report["model"] = estimate(*shape, auto=sized_for, memory=memory, gpus=gpus, load=load)
    report["remedies"] = remedies(report)
    report["probe_seconds"] = round(time.perf_counter() - t0, 2)
    step("verdict", f"Auto picks {auto}")
    return report
