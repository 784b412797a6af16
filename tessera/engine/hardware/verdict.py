"""The verdict: which backends can run and which one Auto picks, whether a model fits, the bandwidth roofline for
decode speed, and remedies in plain words for what looks wrong.
"""

from __future__ import annotations

import re
from pathlib import Path

from tessera.engine.config import ModelConfig
from tessera.engine.errors import TesseraError
from tessera.engine.hardware.presets import BYTES_PER_WEIGHT, active_expert_params, dense_params, expert_params, preset
from tessera.engine.model_summary import FIT_SHARE  # the one fit margin, shared with the app's fit line

GB = 1e9


def backends() -> tuple[dict[str, dict], str, str]:
    """({name: {available, reason, description, weights}}, Auto's pick, why) from the one backend list
    (engine.backends: the native registry plus Torch)."""
    from tessera.engine import backends as registry

    table = {b.name: {"available": b.available, "reason": b.reason, "description": b.description,
                      "weights": b.weights} for b in registry.table() if b.name != registry.AUTO}
    auto, auto_reason = registry.auto()
    return table, auto, auto_reason


def quant_kernels() -> list[dict]:
    """The quantized (GGUF blocks) kernel ISAs this CPU runs under TESSERA_MAX_ISA, best first: [{name, available,
    reason, avx_vnni}] (engine.native.quant_isas; avx_vnni: the avx2 prefill GEMM's dots on AVX-VNNI), the emulated
    AMX twin (a test aid, never chosen) left out."""
    from tessera.engine import native

    return [{"name": i["name"], "available": bool(i["available"]), "reason": i["reason"],
             "avx_vnni": bool(i["avx_vnni"])} for i in native.quant_isas() if i["name"] != "amx_int8_emu"]


def expert_format(backend: str, stored: str) -> str:
    """How `backend` keeps the routed-expert weights in RAM ("int8", "bf16"), or `stored` when it keeps them as
    loaded (Reference, Torch)."""
    from tessera.engine import backends as registry

    weights = next((b.weights for b in registry.table() if b.name == backend), "as loaded")
    return weights if weights in BYTES_PER_WEIGHT else stored


def model_shape(model: str | None, preset_name: str | None) -> tuple[ModelConfig, str, str]:
    """(config, name, stored dtype of the routed experts) for --model PATH or --preset NAME. A model is read by the
    engine's own inspector (headers only), so a file the engine cannot load is named here."""
    if preset_name:
        cfg = preset(preset_name)
        return cfg, cfg.source, "bf16"
    from tessera.engine.model_info import inspect_model
    from tessera.engine.weights import open_model

    path = Path(model)
    if not path.exists():
        raise TesseraError(str(path), "no such file or folder")
    opened = open_model(path)
    info = inspect_model(opened)
    stored = info.expert_type.lower()
    return opened.config, info.name, stored if stored in BYTES_PER_WEIGHT else "bf16"


def model_load(model: str, *, context_length: int, backend: str, kv_cache_type: str = "bf16") -> dict:
    """The type mix and the RAM a load of the model file or folder at `model` takes with expert backend `backend` and a
    KV cache of `context_length` tokens: engine.model_summary's facts (the estimate the model panel and the app's fit
    check show, from the loader's own engine.model_info.estimate_ram), with the experts' stored type and the stored
    bytes one token reads (ModelInfo's)."""
    from tessera.engine.model_summary import sized_for_load

    return _load_facts(sized_for_load(model, context_length=context_length, backend=backend,
                                      kv_cache_type=kv_cache_type))


def preset_load(preset_name: str, dtype: str, *, context_length: int, backend: str,
                kv_cache_type: str = "bf16") -> dict:
    """model_load for a published model, on paper: the GGUF make-model / convert would write from it with `--dtype
    dtype` (engine.model_summary.paper_info), sized by the same estimate."""
    from tessera.engine.model_summary import paper_info

    cfg = preset(preset_name)
    return _load_facts(paper_info(cfg, cfg.source, dtype, context_length=context_length, backend=backend,
                                  kv_cache_type=kv_cache_type))


def _load_facts(info) -> dict:
    from tessera.engine.model_summary import facts

    return {**facts(info), "expert_type": info.expert_type,
            "active_expert_bytes_per_token": info.active_expert_bytes_per_token,
            "active_bytes_per_token": info.active_bytes_per_token}


def estimate(cfg: ModelConfig, name: str, stored: str, *, auto: str, memory: dict, gpus: list[dict],
             load: dict | None = None) -> dict:
    """Fit in RAM/VRAM and the decode roofline for the backend `auto` (Auto's pick, or the one asked for). With `load`
    (model_load for a model file, preset_load for a published model on paper) the RAM needed is the engine's estimate
    of that load, the one the app shows; without, the routed experts in the backend's format plus the rest as
    stored."""
    expert_fmt = expert_format(auto, stored)
    dense, experts, active_experts = dense_params(cfg), expert_params(cfg), active_expert_params(cfg)
    embedding = cfg.vocab_size * cfg.hidden_size
    dense_bytes = dense * BYTES_PER_WEIGHT[stored]
    expert_bytes = experts * BYTES_PER_WEIGHT[expert_fmt]
    active = active_experts * BYTES_PER_WEIGHT[expert_fmt]
    # Per token the CPU also reads the non-expert weights when there is no GPU (all but the embedding table's rows).
    dense_per_token = (dense - embedding) * BYTES_PER_WEIGHT[stored]
    gpu = max(gpus, key=lambda g: g["vram_free_gb"]) if gpus else None
    ram_need = expert_bytes + (0 if gpu else dense_bytes)
    if load is not None:  # a file: what it stores, and everything the load holds (engine.model_info.estimate_ram)
        ram_need = load["ram"]["total_bytes"]
        if load["expert_type"].lower() not in BYTES_PER_WEIGHT:  # block-quantized experts (Q4_K, a mix, ...)
            stored = "a mix of block types" if load["expert_type"] == "mixed" else load["expert_type"]
            if load["ram"]["packed_bytes"] == 0:  # the backend reads them as stored: no packed copy
                expert_fmt, active = "as stored", load["active_expert_bytes_per_token"]
        dense_per_token = load["active_bytes_per_token"] - load["active_expert_bytes_per_token"]
    bw = memory["read_bandwidth_gbs"] * GB
    out = {
        "name": name,
        "total_params": dense + experts,
        "active_params": dense - embedding + active_experts,
        "ram_needed_bytes": int(ram_need),
        "active_expert_bytes_per_token": int(active),
        "total_params_b": round((dense + experts) / 1e9, 2),
        "active_params_b": round((dense - embedding + active_experts) / 1e9, 2),
        "stored_dtype": stored,
        "expert_format": expert_fmt,
        "backend": auto,
        "ram_needed_gb": round(ram_need / GB, 2),
        "ram_available_gb": memory["available_gb"],
        "fits_ram": ram_need <= FIT_SHARE * memory["available_gb"] * GB,
        "placement": (f"experts in RAM on the CPU, the rest on {gpu['name']}" if gpu
                      else "everything on the CPU (no CUDA device)"),
        "active_expert_gb_per_token": round(active / GB, 3),
        "decode_tok_s_upper_bound": round(bw / active, 2) if bw > 0 else 0.0,
        "roofline": "upper bound = measured read bandwidth / routed-expert bytes read per token",
    }
    if load is not None:
        out.update(type_mix=load["type_mix"], ram=load["ram"], ram_text=load["ram_text"])
    if gpu:
        # On CUDA a quantized dense weight is widened once to bf16 (tessera/engine/dense.py Linear._init_quantized); f32
        # and 16-bit weights go as stored. So VRAM counts 2 bytes a weight for a Q8_0 file, not its 34/32 in RAM.
        vram_bytes = dense * BYTES_PER_WEIGHT["f32" if stored == "f32" else "bf16"]
        out["vram_needed_gb"] = round(vram_bytes / GB, 2)
        out["vram_free_gb"] = gpu["vram_free_gb"]
        out["fits_vram"] = vram_bytes <= FIT_SHARE * gpu["vram_free_gb"] * GB
    else:
        out["decode_tok_s_upper_bound_cpu_only"] = round(bw / (active + dense_per_token), 2) if bw > 0 else 0.0
    # The one ceiling to headline is the one that applies here. With a CUDA GPU the attention, router and output
    # weights sit in VRAM, so this machine's RAM bandwidth is spent on the routed experts alone: the experts-only
    # bound applies. Without one the CPU also reads those weights for every token, so the lower bound counting
    # everything a token reads is the one to expect, and the experts-only figure would promise too much.
    if gpu:
        out.update(decode_tok_s_ceiling=out["decode_tok_s_upper_bound"], ceiling_bytes_per_token=int(active),
                   ceiling_counts="the routed-expert weights a token reads (the rest is on the GPU)")
    else:
        out.update(decode_tok_s_ceiling=out["decode_tok_s_upper_bound_cpu_only"],
                   ceiling_bytes_per_token=int(active + dense_per_token),
                   ceiling_counts="every weight a token reads: routed experts, attention and output (no GPU)")
    return out


_AMX_GENERATION = re.compile(r"Xeon.*\b(\d[4-9]\d\d[A-Z+]*|w[3579]-[23][4-9]\d\d)", re.IGNORECASE)


def remedies(report: dict) -> list[dict]:
    """What looks wrong, in plain words: [{topic, problem, remedy}]."""
    out = []
    cpu, mem = report["cpu"], report["memory"]

    def add(topic: str, problem: str, remedy: str) -> None:
        out.append({"topic": topic, "problem": problem, "remedy": remedy})

    reason = cpu["amx"]["reason"]
    if cpu["flags"].get("amx_tile") and not cpu["amx"]["usable"]:
        if "too old" in reason or "XCR0" in reason:
            add("AMX", f"The CPU has AMX but it cannot be used: {reason}.",
                "Update to Linux 5.16 or newer (a distribution kernel from 2022 on) and remove any option that "
                "disables AMX from the kernel command line; Tessera uses AVX-512 meanwhile.")
        else:
            add("AMX", f"The CPU has AMX but Linux refused it to this process: {reason}.",
                "Check for a sandbox or seccomp profile that blocks arch_prctl; Tessera uses AVX-512 meanwhile.")
    elif not cpu["flags"].get("amx_tile") and cpu.get("vendor") == "GenuineIntel" and _AMX_GENERATION.search(
            cpu["model"]):
        add("AMX", "This Xeon generation normally has AMX, but the CPU does not report it.",
            "Enable AMX in the BIOS/UEFI setup (often under Processor > Advanced), or ask the hypervisor to pass it "
            "through to this virtual machine.")
    multi, single = mem["read_bandwidth_gbs"], mem["read_bandwidth_1t_gbs"]
    cores = cpu["physical_cores"]
    dimms, peak = mem.get("dimms") or [], mem.get("theoretical_gbs")
    slow = [d for d in dimms if d["rated_mts"] and d["configured_mts"] and d["configured_mts"] < 0.95 * d["rated_mts"]]
    if slow:
        d = slow[0]
        add("Memory speed", f"{len(slow)} memory module(s) run at {d['configured_mts']} MT/s although rated for "
            f"{d['rated_mts']} MT/s.", "Enable the XMP/EXPO memory profile in the BIOS (or set the rated speed): "
            "decode speed follows memory bandwidth.")
    if peak and cores >= 4 and multi < 0.3 * peak:
        add("Memory bandwidth", f"All cores together read {multi:.0f} GB/s, under a third of the {peak:.0f} GB/s that "
            f"{len(dimms)} module(s) give at one module per channel.",
            "Check that the modules sit in different channels (the board manual's slot order, matched pairs), that "
            "the XMP/EXPO profile is on, and that other programs are not busy.")
    elif not peak and cores >= 4 and single > 0 and multi < 1.5 * single:
        add("Memory bandwidth", f"All cores together read only {multi:.0f} GB/s, about what one core reads "
            f"({single:.0f} GB/s).",
            "Decode speed follows memory bandwidth: populate every memory channel (one DIMM per channel, matched "
            "pairs), enable the XMP/EXPO memory profile in the BIOS, and check that other programs are not busy.")
    if cpu.get("allowed_cpus", cores) < cpu["logical_cores"]:
        add("Threads", f"This process may use only {cpu['allowed_cpus']} of {cpu['logical_cores']} CPUs "
            "(CPU affinity or a container limit).",
            "Start Tessera without taskset/cgroup CPU limits, or set threads to the CPUs it may use.")
    if mem.get("bandwidth_threads", cores) < cores:
        add("Threads", f"The probe used {mem['bandwidth_threads']} threads on a CPU with {cores} physical cores.",
            "Set threads to the number of physical cores in Settings (the default) for full bandwidth.")
    if mem.get("thp_enabled") == "never":
        add("Huge pages", "Transparent huge pages are off.",
            "Set them to 'madvise' (echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled): large "
            "weight buffers then need fewer TLB misses.")
    m = report.get("model")
    if m and not m["fits_ram"]:
        add("Model size", f"{m['name']} needs about {m['ram_needed_gb']:.0f} GB of RAM, {m['ram_available_gb']:.0f} GB "
            "is available.", "Close other programs, add RAM, or convert the model to Q8_0 (half the bytes of BF16).")
    if m and m.get("fits_vram") is False:
        add("GPU memory", f"The non-expert weights need about {m['vram_needed_gb']:.1f} GB of VRAM, "
            f"{m['vram_free_gb']:.1f} GB is free.", "Close other GPU programs, or run attention on the CPU too.")
    return out
