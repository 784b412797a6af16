"""The hardware report (a plain dict from engine.hardware) as HTML for the wizard's result page. No engine import."""

from __future__ import annotations

from html import escape

OK, BAD, MUTED = "#2e7d32", "#c62828", "#757575"


def _count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return str(int(n))


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _chip(name: str, on: bool) -> str:
    colour = OK if on else BAD
    mark = "&#10003;" if on else "&#10007;"
    return f'<span style="color:{colour}">{mark}&nbsp;{escape(name)}</span>'


def _row(label: str, value: str) -> str:
    return f'<tr><td style="color:{MUTED}; padding-right:12px">{escape(label)}</td><td>{value}</td></tr>'


def summary_html(report: dict) -> str:
    """The headline: Auto's backend, the expected speed when a model was chosen, and how many things to fix."""
    parts = [f"<h2>Auto will use <b>{escape(report['auto_backend'])}</b></h2>",
             f"<p>{escape(report['auto_reason'])}</p>"]
    m = report.get("model")
    if m:
        fit = "fits in RAM" if m["fits_ram"] else "does <b>not</b> fit in RAM"
        parts.append(f"<p><b>{escape(m['name'])}</b>: {fit}; expected decode speed at most "
                     f"<b>{m['decode_tok_s_ceiling']:.1f} tokens/s</b> (bandwidth roofline, an upper bound).</p>")
    n = len(report["remedies"])
    parts.append(f"<p>{'Nothing to fix.' if n == 0 else f'{n} thing(s) to look at below.'}</p>")
    return "".join(parts)


def report_html(report: dict) -> str:
    cpu, mem = report["cpu"], report["memory"]
    h = [summary_html(report), "<h3>CPU</h3><table>"]
    h.append(_row("Model", escape(cpu["model"])))
    h.append(_row("Cores", f"{cpu['sockets']} socket(s), {cpu['physical_cores']} physical, {cpu['logical_cores']} "
                           f"logical, {cpu['numa_nodes']} NUMA node(s)"))
    h.append(_row("ISA", " &nbsp; ".join(_chip(k, v) for k, v in cpu["flags"].items())))
    h.append(_row("XCR0", escape(cpu["xcr0"] or "unavailable") + f' <span style="color:{MUTED}">(source: '
                  f"{escape(cpu['source'])})</span>"))
    h.append(_row("AMX", _chip("usable" if cpu["amx"]["usable"] else "not usable", cpu["amx"]["usable"])
                  + " &mdash; " + escape(cpu["amx"]["reason"])))
    h.append("</table><h3>Memory</h3><table>")
    h.append(_row("RAM", f"{mem['total_gb']:.1f} GB total, {mem['available_gb']:.1f} GB available"))
    h.append(_row("Read bandwidth", f"<b>{mem['read_bandwidth_gbs']:.1f} GB/s</b> with {mem['bandwidth_threads']} "
                                    f"threads, {mem['read_bandwidth_1t_gbs']:.1f} GB/s with one "
                                    f'<span style="color:{MUTED}">({escape(mem["bandwidth_source"])})</span>'))
    h.append(_row("Huge pages", f"THP {escape(str(mem['thp_enabled']))}, pool {mem['hugepages_total']} x "
                                f"{mem['hugepage_size_kb']} kB"))
    dimms = mem.get("dimms") or []
    if dimms:
        d = dimms[0]
        mods = (f"{len(dimms)} x {d['size_gb']:g} GB {escape(d['type'])} at {d['configured_mts'] or '?'} MT/s "
                f"(rated {d['rated_mts'] or '?'})")
        if mem.get("theoretical_gbs"):
            mods += f", {mem['theoretical_gbs']:.0f} GB/s peak at one module per channel"
    else:
        mods = f'<span style="color:{MUTED}">{escape(mem.get("dimms_note") or "unknown")}</span>'
    h.append(_row("Modules", mods))
    h.append("</table><h3>GPUs</h3>")
    if not report["gpus"]:
        h.append(f"<p>{escape(report['gpu_status'])}</p>")
    else:
        h.append("<table>")
        for g in report["gpus"]:
            h.append(_row(g["name"], f"compute {g['compute_capability']}, {g['vram_free_gb']:.1f} of "
                                     f"{g['vram_total_gb']:.1f} GB free, pinned H&rarr;D {g['h2d_gbs']:.1f} GB/s, "
                                     f"D&rarr;H {g['d2h_gbs']:.1f} GB/s, driver {escape(str(g['driver_version']))}"))
        h.append("</table>")
    h.append("<h3>Backends</h3><table>")
    for name, b in report["backends"].items():
        h.append(_row(name, _chip("available" if b["available"] else "unavailable", b["available"])
                      + " &mdash; " + escape(b["reason"]) + f"<br><small>{escape(b['description'])}</small>"))
    h.append("</table>")
    if report.get("quant_kernels"):  # the kernels that read GGUF quantized blocks (engine.hardware.verdict)
        h.append("<h3>Quantized GGUF kernels</h3><table>")
        for q in report["quant_kernels"]:
            note = " &mdash; prefill dots on AVX-VNNI" if q["avx_vnni"] else ""
            h.append(_row(q["name"], _chip("available" if q["available"] else "unavailable", q["available"])
                          + (note if q["available"] else " &mdash; " + escape(q["reason"]))))
        h.append("</table>")
    tuning = report.get("tuning")
    if tuning:  # engine.tuned.status(): measured on this CPU (when) or defaults in use
        h.append("<h3>Kernel tuning</h3><table>")
        h.append(_row("Measured", escape(f"{tuning['measured_at']} on {tuning['backend']} in {tuning['seconds']:.1f} s")
                      if tuning["stored"] else f'<span style="color:{MUTED}">{escape(tuning["message"])}</span>'))
        for name, k in tuning["knobs"].items():  # the value, where it came from and the medians behind it
            h.append(_row(name, f"{k['value']} <small>({escape(k['detail'])})</small>"))  # engine.tuned.status's
        h.append("</table>")
    m = report.get("model")
    if m:
        h.append(f"<h3>Model: {escape(m['name'])}</h3><table>")
        h.append(_row("Size", f"{_count(m['total_params'])} parameters, {_count(m['active_params'])} active per token"))
        h.append(_row("Placement", escape(m["placement"])))
        if "type_mix" in m:  # a model file: its types, and the engine's estimate of this load (as the model panel)
            h.append(_row("Types", escape(m["type_mix"])))
            h.append(_row("RAM", f"this load needs {escape(m['ram_text'])}; {m['ram_available_gb']:.1f} GB available "
                                 + _chip("fits" if m["fits_ram"] else "does not fit", m["fits_ram"])))
        else:
            h.append(_row("RAM", f"needs about {_size(m['ram_needed_bytes'])}, {m['ram_available_gb']:.1f} GB "
                                 "available " + _chip("fits" if m["fits_ram"] else "does not fit", m["fits_ram"])))
        if "fits_vram" in m:
            h.append(_row("VRAM", f"needs about {m['vram_needed_gb']:.1f} GB, {m['vram_free_gb']:.1f} GB free "
                                  + _chip("fits" if m["fits_vram"] else "does not fit", m["fits_vram"])))
        h.append(_row("Decode", f"at most <b>{m['decode_tok_s_ceiling']:.1f} tokens/s</b>: "
                                f"{_size(m['ceiling_bytes_per_token'])} per token ({escape(m['ceiling_counts'])}) / "
                                f"{mem['read_bandwidth_gbs']:.1f} GB/s"))
        h.append("</table>")
    h.append("<h3>Remedies</h3>")
    if not report["remedies"]:
        h.append("<p>Nothing to fix.</p>")
    else:
        h.append("<ul>" + "".join(f"<li><b>{escape(r['topic'])}</b>: {escape(r['problem'])} {escape(r['remedy'])}</li>"
                                  for r in report["remedies"]) + "</ul>")
    return "".join(h)
