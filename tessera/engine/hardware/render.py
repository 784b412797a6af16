"""The hardware report as Markdown (for people, the wizard's export and clipboard) and JSON (for tools)."""

from __future__ import annotations

import json


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, sort_keys=False)


def count(n: float) -> str:
    """A parameter count, readably (30.5 B, 994.2 M, 12.0 k)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(int(n))


def size(n: float) -> str:
    """Bytes, readably (61.1 GB, 2.0 MB)."""
    for unit, s in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= s:
            return f"{n / s:.1f} {unit}"
    return f"{int(n)} B"


def _yes(v: bool) -> str:
    return "yes" if v else "no"


def _modules(mem: dict) -> str:
    dimms = mem.get("dimms") or []
    if not dimms:
        return mem.get("dimms_note") or "unknown"
    d = dimms[0]
    text = (f"{len(dimms)} x {d['size_gb']:g} GB {d['type']}, {d['configured_mts'] or '?'} MT/s "
            f"(rated {d['rated_mts'] or '?'})")
    if mem.get("theoretical_gbs"):
        text += f"; {mem['theoretical_gbs']:.0f} GB/s peak at one module per channel"
    return text


def to_markdown(report: dict) -> str:
    cpu, mem = report["cpu"], report["memory"]
    lines = ["# Tessera hardware report", "",
             f"Host `{report['host']}`, Linux {report['kernel']}, Python {report['python']}.", "", "## CPU", "",
             f"- Model: {cpu['model']} ({cpu['vendor'] or 'unknown vendor'})",
             f"- {cpu['sockets']} socket(s), {cpu['physical_cores']} physical cores, "
             f"{cpu['logical_cores']} logical CPUs "
             f"({cpu['allowed_cpus']} usable by this process), {cpu['numa_nodes']} NUMA node(s)",
             "- ISA flags (source: " + cpu["source"] + "): "
             + ", ".join(f"{k} {_yes(v)}" for k, v in cpu["flags"].items()),
             f"- XCR0: {cpu['xcr0'] or 'unavailable (no CPUID probe)'}",
             f"- AMX usable: {_yes(cpu['amx']['usable'])} ({cpu['amx']['reason']})", "", "## Memory", "",
             f"- Total {mem['total_gb']:.1f} GB, available {mem['available_gb']:.1f} GB",
             f"- Read bandwidth: {mem['read_bandwidth_gbs']:.1f} GB/s with {mem['bandwidth_threads']} threads, "
             f"{mem['read_bandwidth_1t_gbs']:.1f} GB/s with one (probe: {mem['bandwidth_source']})",
             f"- Transparent huge pages: {mem['thp_enabled']} (defrag {mem['thp_defrag']}); hugepage pool "
             f"{mem['hugepages_total']} x {mem['hugepage_size_kb']} kB",
             f"- Modules: {_modules(mem)}", "", "## GPUs", ""]
    if not report["gpus"]:
        lines.append(f"- {report['gpu_status']}")
    for g in report["gpus"]:
        lines.append(f"- {g['name']} (compute {g['compute_capability']}): {g['vram_free_gb']:.1f} of "
                     f"{g['vram_total_gb']:.1f} GB free; pinned host->device {g['h2d_gbs']:.1f} GB/s, device->host "
                     f"{g['d2h_gbs']:.1f} GB/s; driver {g['driver_version']}, CUDA runtime {g['cuda_runtime']}")
    lines += ["", "## Backends", "", "| backend | what it is | available | reason |", "|---|---|---|---|"]
    for name, b in report["backends"].items():
        lines.append(f"| {name} | {b['description']} | {_yes(b['available'])} | {b['reason']} |")
    lines += ["", f"Auto picks **{report['auto_backend']}**: {report['auto_reason']}."]
    if report.get("quant_kernels"):
        lines += ["", "Quantized GGUF files (Q4_K_M, Q8_0, ...) are read in place by the quantized kernels of the "
                  "backend's level:", ""]
        for q in report["quant_kernels"]:
            if not q["available"]:
                lines.append(f"- {q['name']}: no ({q['reason']})")
            else:
                lines.append(f"- {q['name']}: yes" + (", prefill dots on AVX-VNNI (vpdpbusd)" if q["avx_vnni"] else ""))
    if report.get("tuning"):
        from tessera.engine.tuned import describe

        lines += ["", "## Kernel tuning", ""] + [f"- {line}" for line in describe(report["tuning"])]
    m = report.get("model")
    if m:
        lines += ["", f"## Model: {m['name']}", "",
                  f"- {count(m['total_params'])} parameters, {count(m['active_params'])} active per token; stored "
                  f"{m['stored_dtype']}, " + (f"experts read as stored by {m['backend']}"
                                              if m["expert_format"] == "as stored"
                                              else f"experts as {m['expert_format']} for {m['backend']}"),
                  f"- Placement: {m['placement']}"]
        if "type_mix" in m:  # a model file: its types, and the engine's estimate of this load
            lines += [f"- Types (share of the file): {m['type_mix']}",
                      f"- RAM: this load needs {m['ram_text']}; {m['ram_available_gb']:.1f} GB available: "
                      + ("fits" if m["fits_ram"] else "does NOT fit")]
        else:
            lines.append(f"- RAM: needs about {size(m['ram_needed_bytes'])}, {m['ram_available_gb']:.1f} GB "
                         "available: " + ("fits" if m["fits_ram"] else "does NOT fit"))
        if "fits_vram" in m:
            lines.append(f"- VRAM: needs about {m['vram_needed_gb']:.1f} GB, {m['vram_free_gb']:.1f} GB free: "
                         + ("fits" if m["fits_vram"] else "does NOT fit"))
        lines.append(f"- Expected decode speed: at most {m['decode_tok_s_ceiling']:.1f} tokens/s "
                     f"({size(m['ceiling_bytes_per_token'])} per token, {m['ceiling_counts']}, at "
                     f"{mem['read_bandwidth_gbs']:.1f} GB/s; an upper bound)")
    lines += ["", "## Remedies", ""]
    if not report["remedies"]:
        lines.append("Nothing to fix.")
    for r in report["remedies"]:
        lines.append(f"- **{r['topic']}**: {r['problem']} {r['remedy']}")
    return "\n".join(lines) + "\n"
