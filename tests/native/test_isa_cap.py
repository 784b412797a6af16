"""TESSERA_MAX_ISA caps dispatch (read once per process, so each cap runs in a fresh interpreter)."""

import json
import os
import subprocess
import sys

import pytest

PROBE = "import json, tessera.engine.backends as B; print(json.dumps([B.compiled(), B.auto()]))"


def backends_with_cap(cap):
    """Backends and Auto in a fresh interpreter under TESSERA_MAX_ISA=cap (None: no cap, whatever this process has)."""
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_MAX_ISA"}
    if cap is not None:
        env["TESSERA_MAX_ISA"] = cap
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout
    rows, auto = json.loads(out)
    return {b["name"]: b for b in rows}, auto


@pytest.mark.parametrize("cap, level", [("reference", 0), ("avx2", 1), ("avx512", 2)])
def test_cap_disables_higher_isas_with_a_reason(cap, level):
    order = ["reference", "avx2", "avx512", "amx"]
    rows, auto = backends_with_cap(cap)
    uncapped, _ = backends_with_cap(None)  # not this process: it may run under a cap itself
    for name, b in rows.items():
        if order.index(b["isa_level"]) > level:
            assert not b["available"] and b["reason"] == f"capped by TESSERA_MAX_ISA={cap}", name
        else:
            assert b["available"] == uncapped[name]["available"], name
    assert rows["Reference"]["available"]
    assert order.index(rows[auto[0]]["isa_level"]) <= level
    if cap == "reference":
        assert auto[0] == "Reference"
