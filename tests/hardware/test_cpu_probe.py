"""CPU section: the native CPUID probe agrees with the kernel's flag list; AMX verdicts name their reason; topology
parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.engine.hardware import cpu as cpu_mod

PROC_FLAGS = set()
for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
    if line.startswith("flags"):
        PROC_FLAGS = set(line.split(":", 1)[1].split())
        break

needs_proc_flags = pytest.mark.skipif(not PROC_FLAGS, reason="needs /proc/cpuinfo with a flags line (Linux)")


@needs_proc_flags
def test_native_cpuid_agrees_with_proc_cpuinfo():
    out = cpu_mod.probe_cpu()
    flags = {**out["flags"], **out["other_flags"]}
    assert set(flags) == set(cpu_mod.ALL_FLAGS)
    for name in flags:
        assert flags[name] == (name in PROC_FLAGS), name
    assert int(out["xcr0"], 16) & 0b110 == 0b110  # the OS saves SSE and AVX state on any AVX machine


def test_proc_cpuinfo_is_the_fallback_when_the_native_probe_fails(monkeypatch):
    monkeypatch.setattr(cpu_mod, "_from_native", lambda: None)
    out = cpu_mod.probe_cpu()
    assert out["source"] == "proc-cpuinfo" and out["xcr0"] is None and out["amx"]["usable"] is False
    for name in cpu_mod.REPORTED_FLAGS:
        assert out["flags"][name] == (name in PROC_FLAGS), name


@needs_proc_flags
def test_probe_cpu_reports_flags_and_amx_reason():
    out = cpu_mod.probe_cpu()
    assert out["source"] == "native"
    for name in cpu_mod.REPORTED_FLAGS:
        assert out["flags"][name] == (name in PROC_FLAGS), name
    assert out["amx"]["usable"] in (True, False) and out["amx"]["reason"]
    if "amx_tile" not in PROC_FLAGS:
        assert out["amx"]["usable"] is False and "lacks amx_tile" in out["amx"]["reason"]
    assert 1 <= out["physical_cores"] <= out["logical_cores"]
    assert out["numa_nodes"] >= 1 and out["sockets"] >= 1


def test_amx_verdict_order_cpu_then_xcr0():
    no_amx = {"amx_tile": False}
    assert cpu_mod._amx_verdict(no_amx, 0xE7) == (
        False, "CPU lacks amx_tile (no AMX on this processor, or AMX disabled in the BIOS)")
    ok, reason = cpu_mod._amx_verdict({"amx_tile": True}, 0xE7)  # XCR0 without bits 17/18
    assert not ok and "XCR0=0xe7" in reason and "5.16" in reason
    ok, reason = cpu_mod._amx_verdict({"amx_tile": True}, None)
    assert not ok and "XCR0 unknown" in reason


def test_native_fields_rename_sse42_and_keep_the_amx_reason():
    native = {"flags": {"avx2": True, "sse42": True, "amx_tile": True, "amx_int8": True}, "xcr0": 0x600E7,
              "brand": "Xeon X", "amx_permitted": False, "amx_reason": "kernel refused XTILEDATA permission (errno 1)"}
    flags, xcr0, model, usable, reason = cpu_mod._native_fields(native)
    assert flags["avx2"] and flags["sse4_2"] and flags["amx_int8"] and not flags["avx512f"]
    assert (xcr0, model, usable) == (0x600E7, "Xeon X", False) and "refused" in reason


def test_topology_from_a_fake_sysfs(tmp_path):
    # 2 packages x 2 cores x 2 threads, 2 NUMA nodes
    cpu_dir = tmp_path / "cpu"
    n = 0
    for pkg in range(2):
        for core in range(2):
            for _ in range(2):
                d = cpu_dir / f"cpu{n}" / "topology"
                d.mkdir(parents=True)
                (d / "core_id").write_text(f"{core}\n")
                (d / "physical_package_id").write_text(f"{pkg}\n")
                n += 1
    for node in range(2):
        (tmp_path / "node" / f"node{node}").mkdir(parents=True)
    topo = cpu_mod.topology(sys_root=str(tmp_path))
    assert topo["sockets"] == 2 and topo["physical_cores"] == 4 and topo["numa_nodes"] == 2


def test_topology_falls_back_to_proc_cpuinfo(tmp_path):
    text = "\n\n".join(f"processor\t: {i}\nphysical id\t: 0\ncore id\t\t: {i // 2}" for i in range(4))
    topo = cpu_mod.topology(cpuinfo_text=text, sys_root=str(tmp_path))
    assert topo["physical_cores"] == 2 and topo["sockets"] == 1
