"""CPU section: CPUID from Python agrees with the kernel's flag list; AMX verdicts name their reason; topology parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.hardware import cpu as cpu_mod
from engine.hardware import cpuid

PROC_FLAGS = set()
for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
    if line.startswith("flags"):
        PROC_FLAGS = set(line.split(":", 1)[1].split())
        break

needs_x86_linux = pytest.mark.skipif(not cpuid.supported() or not PROC_FLAGS, reason="needs x86-64 Linux")


@needs_x86_linux
def test_python_cpuid_agrees_with_proc_cpuinfo():
    flags, xcr0 = cpuid.read_flags()
    for name in flags:
        assert flags[name] == (name in PROC_FLAGS), name
    assert xcr0 is not None and xcr0 & 0b110 == 0b110  # the OS saves SSE and AVX state on any AVX machine


@needs_x86_linux
def test_probe_cpu_reports_flags_and_amx_reason():
    out = cpu_mod.probe_cpu()
    assert out["source"] in ("native", "cpuid-python")
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
    assert not ok and "OSXSAVE" in reason


def test_native_shape_adapter_takes_struct_fields():
    native = {"avx2": True, "sse42": True, "amx_tile": True, "amx_int8": True, "xcr0": 0x600E7, "brand": "Xeon X",
              "amx_permitted": False, "amx_reason": "kernel refused XTILEDATA permission (errno 1)"}
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
