"""`tessera-cli bench-moe --json` prints the object the issue specifies (tiny shape: this tests the command, not
speed)."""

import json

import engine.backends as B
from engine.cli import main


def test_bench_moe_json_shape(capsys):
    assert main(["bench-moe", "--shape", "tiny", "--threads", "2", "--seconds", "0.05", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bandwidth_gbs"] > 0
    timed = [b["name"] for b in B.compiled() if b["available"] and not b["emulated"] and b["name"] != "Reference"]
    for name in timed:
        r = out["backends"][name]
        for key in ("decode_us", "decode_gbs", "decode_pct_of_bandwidth", "prefill128_gflops", "prefill512_gflops"):
            assert r[key] > 0, (name, key)
        assert r["max_rel_err"] < (0.02 if "Int8" in name else 0.01)
    assert set(out["backends"]) == set(timed)  # every entry has the full set of keys
    for name in (b["name"] for b in B.compiled() if b["available"] and b["emulated"]):
        assert out["not_timed"][name]["not_timed"] == "emulated" and out["not_timed"][name]["max_rel_err"] < 0.05
    assert set(out["torch_baseline"]) >= {"decode_us", "decode_gbs", "prefill128_gflops", "prefill512_gflops"}


def test_bench_moe_unavailable_backend_is_a_named_error(capsys):
    missing = [n for n, (ok, _) in B.status().items() if not ok]
    if not missing:
        return
    assert main(["bench-moe", "--shape", "tiny", "--backends", missing[0], "--seconds", "0.05"]) == 1
    assert f"error: backend {missing[0]}: " in capsys.readouterr().err
