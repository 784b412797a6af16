"""The CPU section of the hardware report: model, topology, ISA flags, XCR0 and whether AMX may be used.

Sources, named in the report's `source` field so nobody mistakes a guess for a measurement: `native`
(engine.native.cpu_features(): CPUID, XGETBV and the AMX permission request in C++), else `proc-cpuinfo` (the kernel's
flag list: a fallback that cannot show XCR0 or the AMX permission).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# The flags the report always lists (DESIGN §3 needs these to pick a backend).
REPORTED_FLAGS = ("avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                  "amx_tile", "amx_int8", "amx_bf16")
XCR0_BITS = {"x87": 0, "sse": 1, "avx": 2, "opmask": 5, "zmm_hi256": 6, "hi16_zmm": 7, "xtilecfg": 17, "xtiledata": 18}
# Every flag the report shows, spelled as /proc/cpuinfo spells them (the native probe says "sse42" for "sse4_2").
ALL_FLAGS = ("sse4_2", "fma", "f16c", "avx", "avx2", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl",
             "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8", "avx_vnni", "avx512_bf16")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    blocks = []
    for chunk in text.strip().split("\n\n"):
        entry = {}
        for line in chunk.splitlines():
            if ":" in line:
                key, _, value = line.partition(":")
                entry[key.strip()] = value.strip()
        if entry:
            blocks.append(entry)
    return blocks


def topology(cpuinfo_text: str | None = None, sys_root: str = "/sys/devices/system") -> dict:
    """Sockets, physical cores, logical CPUs, NUMA nodes, and how many CPUs this process may run on."""
    logical = os.cpu_count() or 1
    cores: set[tuple[str, str]] = set()
    packages: set[str] = set()
    for cpu_dir in Path(sys_root, "cpu").glob("cpu[0-9]*"):
        core_id = _read(f"{cpu_dir}/topology/core_id").strip()
        pkg = _read(f"{cpu_dir}/topology/physical_package_id").strip()
        if core_id:
            cores.add((pkg, core_id))
            packages.add(pkg)
    if not cores:  # no sysfs topology (containers): /proc/cpuinfo's physical id / core id
        for b in _cpuinfo_blocks(cpuinfo_text if cpuinfo_text is not None else _read("/proc/cpuinfo")):
            if "core id" in b:
                cores.add((b.get("physical id", "0"), b["core id"]))
                packages.add(b.get("physical id", "0"))
    nodes = [p for p in Path(sys_root, "node").glob("node[0-9]*")]
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = logical
    return {
        "sockets": max(1, len(packages)),
        "physical_cores": len(cores) or logical,
        "logical_cores": logical,
        "numa_nodes": max(1, len(nodes)),
        "allowed_cpus": allowed,
    }


def _from_native() -> dict | None:
    """engine.native.cpu_features(), or None when the native probe cannot run (then /proc/cpuinfo is the source)."""
    try:
        from tessera.engine import native

        return dict(native.cpu_features())
    except Exception:  # noqa: BLE001 - a broken native probe must not hide the /proc/cpuinfo fallback
        return None


def _amx_verdict(flags: dict[str, bool], xcr0: int | None) -> tuple[bool, str]:
    """Why AMX cannot be used, checked in DESIGN §4's order (CPUID, then XCR0 bits 17/18), when the native probe's
    permission request did not run."""
    if not flags.get("amx_tile"):
        return False, "CPU lacks amx_tile (no AMX on this processor, or AMX disabled in the BIOS)"
    if xcr0 is None:
        return False, "XCR0 unknown (the native CPU probe did not run), so whether the OS enables AMX state is unknown"
    if not (xcr0 >> 17) & 1 or not (xcr0 >> 18) & 1:
        return False, (f"XCR0=0x{xcr0:x} lacks the AMX tile bits 17/18: the kernel does not enable AMX state "
                       "(Linux >= 5.16 needed, or AMX turned off by the kernel command line)")
    return False, "the AMX permission request did not run (the native CPU probe did not run)"


def _proc_probe() -> tuple[dict[str, bool], str]:
    """(flags, model) from /proc/cpuinfo."""
    blocks = _cpuinfo_blocks(_read("/proc/cpuinfo"))
    listed = set(blocks[0].get("flags", "").split()) if blocks else set()
    return {name: name in listed for name in ALL_FLAGS}, blocks[0].get("model name", "") if blocks else ""


def _native_fields(native: dict) -> tuple[dict[str, bool], int, str, bool, str]:
    """(flags, xcr0, model, amx usable, reason) from engine.native.cpu_features()."""
    src = dict(native["flags"])
    src["sse4_2"] = src.get("sse42", False)
    flags = {name: bool(src.get(name, False)) for name in ALL_FLAGS}
    return flags, int(native["xcr0"]), str(native.get("brand", "")), bool(native["amx_permitted"]), str(
        native.get("amx_reason") or ("granted" if native["amx_permitted"] else "native probe gave no reason"))


def probe_cpu() -> dict:
    """The report's `cpu` object: model, topology, flags {name: bool}, xcr0, amx {usable, reason}, source."""
    native = _from_native()
    if native is not None:
        source = "native"
        flags, xcr0, model, amx_usable, amx_reason = _native_fields(native)
    else:
        source, xcr0 = "proc-cpuinfo", None
        flags, model = _proc_probe()
        amx_usable, amx_reason = _amx_verdict(flags, xcr0)
    if not model:
        blocks = _cpuinfo_blocks(_read("/proc/cpuinfo"))
        model = blocks[0].get("model name", "unknown CPU") if blocks else "unknown CPU"
    vendor = ""
    blocks = _cpuinfo_blocks(_read("/proc/cpuinfo"))
    if blocks:
        vendor = blocks[0].get("vendor_id", "")
    out = {"model": re.sub(r"\s+", " ", model).strip(), "vendor": vendor, **topology()}
    out["flags"] = {name: bool(flags.get(name, False)) for name in REPORTED_FLAGS}
    out["other_flags"] = {k: bool(v) for k, v in flags.items() if k not in REPORTED_FLAGS}
    out["xcr0"] = None if xcr0 is None else f"0x{int(xcr0):x}"
    out["xcr0_state"] = (None if xcr0 is None else
                         {name: bool((int(xcr0) >> bit) & 1) for name, bit in XCR0_BITS.items()})
    out["amx"] = {"usable": bool(amx_usable), "reason": amx_reason}
    out["source"] = source
    return out
