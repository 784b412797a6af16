"""SMBIOS type 17 parsing on a synthesized table, and the memory-speed remedies it enables."""

from __future__ import annotations

import struct

from tessera.engine.hardware import dimms, verdict


def _type17(handle: int, size_mb: int, rated: int, configured: int, locator: str, mem_type: int = 0x22) -> bytes:
    f = bytearray(0x5C)  # SMBIOS 3.3 length
    f[0], f[1] = 17, len(f)
    struct.pack_into("<H", f, 2, handle)
    struct.pack_into("<H", f, 0x08, 64)  # total width
    struct.pack_into("<H", f, 0x0A, 64)  # data width
    if size_mb >= 0x7FFF:
        struct.pack_into("<H", f, 0x0C, 0x7FFF)
        struct.pack_into("<I", f, 0x1C, size_mb)
    else:
        struct.pack_into("<H", f, 0x0C, size_mb)
    f[0x10] = 1  # Device Locator: string 1
    f[0x12] = mem_type
    struct.pack_into("<H", f, 0x15, rated)
    struct.pack_into("<H", f, 0x20, configured)
    return bytes(f) + locator.encode() + b"\0\0"


def _table(*structs: bytes) -> bytes:
    empty_slot = bytearray(_type17(9, 0, 0, 0, "DIMM_EMPTY"))
    struct.pack_into("<H", empty_slot, 0x0C, 0)
    type0 = bytes([0, 4, 0, 0]) + b"\0\0"  # a BIOS structure with no strings
    end = bytes([127, 4, 0xFF, 0xFF]) + b"\0\0"
    return type0 + b"".join(structs) + bytes(empty_slot) + end


def test_parse_two_ddr5_modules_and_skip_empty_slots():
    table = _table(_type17(1, 32768, 6000, 4800, "DIMM_A1"), _type17(2, 32768, 6000, 4800, "DIMM_B1"))
    mods = dimms.parse_dimms(table)
    assert [m["locator"] for m in mods] == ["DIMM_A1", "DIMM_B1"]
    assert mods[0] == {"locator": "DIMM_A1", "size_gb": 32.0, "type": "DDR5", "data_width_bits": 64,
                       "rated_mts": 6000, "configured_mts": 4800}
    assert dimms.theoretical_gbs(mods) == 2 * 8 * 4800e6 / 1e9  # 76.8 GB/s


def test_read_dimms_without_a_table(tmp_path):
    mods, note = dimms.read_dimms(str(tmp_path / "DMI"))
    assert mods == [] and note.startswith("memory modules unknown")
    (tmp_path / "DMI").write_bytes(_table(_type17(1, 65536, 3200, 3200, "P0 CH A")))
    mods, note = dimms.read_dimms(str(tmp_path / "DMI"))
    assert len(mods) == 1 and mods[0]["size_gb"] == 64.0 and note == "1 memory module(s) from SMBIOS"


def _report(multi: float, mods: list[dict]) -> dict:
    mem = {"read_bandwidth_gbs": multi, "read_bandwidth_1t_gbs": 30.0, "bandwidth_threads": 16, "dimms": mods,
           "theoretical_gbs": dimms.theoretical_gbs(mods), "thp_enabled": "madvise"}
    cpu = {"model": "AMD Ryzen 9 9950X", "vendor": "AuthenticAMD", "physical_cores": 16, "logical_cores": 32,
           "allowed_cpus": 32, "flags": {"amx_tile": False}, "amx": {"usable": False, "reason": "CPU lacks amx_tile"}}
    return {"cpu": cpu, "memory": mem, "gpus": []}


def test_xmp_off_and_channel_remedies():
    slow = dimms.parse_dimms(_table(_type17(1, 32768, 6000, 4800, "A1"), _type17(2, 32768, 6000, 4800, "B1")))
    topics = [r["topic"] for r in verdict.remedies(_report(60.0, slow))]
    assert topics == ["Memory speed"]  # 60 of 76.8 GB/s is fine; the profile is not
    fast = dimms.parse_dimms(_table(_type17(1, 32768, 6000, 6000, "A1"), _type17(2, 32768, 6000, 6000, "A2")))
    r = verdict.remedies(_report(25.0, fast))  # 25 of 96 GB/s: one channel used, or something else is busy
    assert [x["topic"] for x in r] == ["Memory bandwidth"] and "different channels" in r[0]["remedy"]
