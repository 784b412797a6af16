"""Installed memory modules from the SMBIOS table (type 17 "Memory Device"), for the memory-speed remedies.

Linux exposes the raw table at /sys/firmware/dmi/tables/DMI, usually readable by root only; without it the report says
the layout is unknown rather than guessing. Field offsets follow the DMTF SMBIOS specification 3.x, type 17.
"""

from __future__ import annotations

import struct
from pathlib import Path

DMI_TABLE = "/sys/firmware/dmi/tables/DMI"
MEMORY_TYPES = {0x12: "DDR", 0x13: "DDR2", 0x18: "DDR3", 0x1A: "DDR4", 0x1B: "LPDDR", 0x1C: "LPDDR2",
                0x1D: "LPDDR3", 0x1E: "LPDDR4", 0x22: "DDR5", 0x23: "LPDDR5"}


def _structures(table: bytes):
    """(type, formatted bytes, strings) of each SMBIOS structure until the end-of-table marker (type 127)."""
    i = 0
    while i + 4 <= len(table):
        kind, length = table[i], table[i + 1]
        if length < 4 or i + length > len(table):
            return
        formatted = table[i:i + length]
        end = table.find(b"\0\0", i + length)
        if end < 0:
            return
        strings = [s.decode("ascii", "replace").strip() for s in table[i + length:end].split(b"\0") if s]
        yield kind, formatted, strings
        if kind == 127:
            return
        i = end + 2


def _word(f: bytes, off: int) -> int | None:
    return struct.unpack_from("<H", f, off)[0] if off + 2 <= len(f) else None


def _dword(f: bytes, off: int) -> int | None:
    return struct.unpack_from("<I", f, off)[0] if off + 4 <= len(f) else None


def _string(f: bytes, off: int, strings: list[str]) -> str:
    if off >= len(f) or f[off] == 0 or f[off] > len(strings):
        return ""
    return strings[f[off] - 1]


def _speed(f: bytes, off: int, ext_off: int) -> int | None:
    v = _word(f, off)
    if v == 0xFFFF:
        v = _dword(f, ext_off)
    return v or None


def parse_dimms(table: bytes) -> list[dict]:
    """Populated memory devices: size_gb, type, rated and configured speed (MT/s), data width (bits), locator."""
    out = []
    for kind, f, strings in _structures(table):
        if kind != 17:
            continue
        size = _word(f, 0x0C)
        if not size or size == 0xFFFF:  # 0: empty slot; 0xFFFF: unknown
            continue
        if size == 0x7FFF:
            mb = (_dword(f, 0x1C) or 0) & 0x7FFFFFFF
        else:
            mb = (size & 0x7FFF) / 1024 if size & 0x8000 else size & 0x7FFF
        width = _word(f, 0x0A)
        out.append({
            "locator": _string(f, 0x10, strings),
            "size_gb": round(mb / 1024, 2),
            "type": MEMORY_TYPES.get(f[0x12] if len(f) > 0x12 else 0, "unknown"),
            "data_width_bits": width if width and width != 0xFFFF else None,
            "rated_mts": _speed(f, 0x15, 0x54),
            "configured_mts": _speed(f, 0x20, 0x58),
        })
    return out


def read_dimms(path: str = DMI_TABLE) -> tuple[list[dict], str]:
    """(modules, note). An unreadable table gives ([], why) — the normal case when not running as root."""
    try:
        table = Path(path).read_bytes()
    except PermissionError:
        return [], "memory modules unknown: the SMBIOS table is readable by root only"
    except OSError:
        return [], "memory modules unknown: no SMBIOS table exposed (virtual machine or container)"
    dimms = parse_dimms(table)
    return dimms, (f"{len(dimms)} memory module(s) from SMBIOS" if dimms else "SMBIOS lists no memory modules")


def theoretical_gbs(dimms: list[dict]) -> float | None:
    """Peak GB/s if each module sits on its own channel (one DIMM per channel): modules x bytes wide x MT/s."""
    total = 0.0
    for d in dimms:
        mts = d["configured_mts"] or d["rated_mts"]
        if not mts:
            return None
        total += (d["data_width_bits"] or 64) / 8 * mts * 1e6 / 1e9
    return total or None
