"""Reading this process's /proc/self/smaps in tests: one field of the mapping that holds an address."""

from __future__ import annotations


def mapping_field(address: int, field: str) -> list[str]:
    """The words after `field:` (e.g. "Rss", "VmFlags") in the smaps entry of the mapping holding `address`."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == f"{field}:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}, or it has no {field} line")
