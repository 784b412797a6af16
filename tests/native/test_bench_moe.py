"""`tessera-cli bench-moe --json` prints the object the issue specifies (tiny shape: this tests the command, not
speed)."""

import json

import tessera.engine.backends as B
import tessera.engine.native as N
from tessera.engine.cli import main


def test_bench_moe_json_shape(capsys):
    assert main(["bench-moe", "--shape", "tiny", "--threads", "2", "--seconds", "0.05", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bandwidth_gbs"] > 0
    timed = [b["name"] for b in B.compiled() if b["available"] and not b["emulated"] and b["name"] != "Reference"]
    for name in timed:
        r = out["backends"][name]
        for key in ("decode_us", "decode_gbs", "decode_pct_of_bandwidth", "prefill128_gflops", "prefill512_gflops",
                    "prefill2048_gflops", "prefill4096_gflops"):
            assert r[key] > 0, (name, key)
        peak = {"amx_bf16": out["amx_bf16_peak_gflops"], "amx_int8": out["amx_int8_peak_gops"],
                "bf16_dot": out["peak_bf16_gflops"], "int8_dot": out["peak_int8_gops"],
                "fp32_fma": out["peak_fp32_gflops"]}[r["prefill_peak"]]
        assert peak is not None and peak > 0, (name, r["prefill_peak"])  # a timed backend's instruction exists here
        assert abs(r["prefill4096_pct_of_peak"] - 100 * r["prefill4096_gflops"] / peak) < 1e-6
        assert r["max_rel_err"] < (0.02 if "Int8" in name else 0.01)
        assert 1 <= r["decode_layer_copies"] <= 16  # packed copies cycled past the last-level cache
    assert set(out["backends"]) == set(timed)  # every entry has the full set of keys
    for name in (b["name"] for b in B.compiled() if b["available"] and b["emulated"]):
        assert out["not_timed"][name]["not_timed"] == "emulated" and out["not_timed"][name]["max_rel_err"] < 0.05
    assert set(out["torch_baseline"]) >= {"decode_us", "decode_gbs", "prefill128_gflops", "prefill512_gflops"}
    assert out["prompt_lengths"] == [128, 512, 2048, 4096]
    amx = B.status()["AMXBF16"][0]
    assert (out["amx_bf16_peak_gflops"] is None) == (not amx) and (out["amx_int8_peak_gops"] is None) == (not amx)
    assert (out["peak_int8_gops"] is None) == (not N.cpu_features()["flags"]["avx512_vnni"])


def test_bench_moe_prompt_lengths_and_human_output(capsys):
    backend = "AVX2" if "AVX2" in B.available_names() else "Reference"
    assert main(["bench-moe", "--shape", "tiny", "--threads", "1", "--seconds", "0.02", "--no-torch",
                 "--prompt-lengths", "3,40", "--backends", backend]) == 0
    text = capsys.readouterr().out
    assert "T=3 " in text and "T=40 " in text and "T=128" not in text
    if "AVX2" in B.available_names():
        assert "% of fp32 FMA" in text


def test_bench_moe_bad_prompt_lengths_are_a_named_error(capsys):
    assert main(["bench-moe", "--shape", "tiny", "--prompt-lengths", "128,zero"]) == 1
    assert "error: --prompt-lengths: " in capsys.readouterr().err


def test_bench_moe_unavailable_backend_is_a_named_error(capsys):
    missing = [n for n, (ok, _) in B.status().items() if not ok]
    if not missing:
        return
    assert main(["bench-moe", "--shape", "tiny", "--backends", missing[0], "--seconds", "0.05"]) == 1
    assert f"error: backend {missing[0]}: " in capsys.readouterr().err
