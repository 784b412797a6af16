"""`tessera-cli bench-moe --dtype q4_k_m ...`: the quantized layer's JSON object (tiny-q shape: this tests the
command, not speed) and the named error for a shape whose rows are not whole blocks."""

import json

import pytest

import tessera.engine.native as N
from tessera.engine.cli import main


@pytest.mark.parametrize("dtype", ["q4_k_m", "q8_0"])
def test_bench_moe_quantized_json(capsys, dtype):
    assert main(["bench-moe", "--shape", "tiny-q", "--dtype", dtype, "--threads", "2", "--seconds", "0.05",
                 "--rounds", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dtype"] == dtype and out["bandwidth_gbs"] > 0
    available = [i["name"] for i in N.quant_isas() if i["available"]]
    assert set(out["isas"]) == set(available)
    for isa, r in out["isas"].items():
        # Relative L2 error vs float64 on the dequantized weights: sqrt of the MoE NMSE bound of test_quant_moe.py.
        assert r["rel_err_vs_float64"] < 1e-3 ** 0.5, isa
        if isa == "reference":
            assert r["not_timed"] == "scalar correctness twin"
            continue
        for key in ("decode_us", "decode_gbs", "decode_pct_of_bandwidth", "prefill128_ms", "prefill128_gflops",
                    "prefill512_ms", "prefill512_gflops"):
            assert r[key] > 0, (isa, key)


def test_bench_moe_quantized_times_the_prompt_lengths_asked_for(capsys):
    assert main(["bench-moe", "--shape", "tiny-q", "--dtype", "q4_k", "--threads", "2", "--seconds", "0.05",
                 "--rounds", "3", "--prompt-lengths", "3,40", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for isa, r in out["isas"].items():
        if isa != "reference":
            assert {"prefill3_ms", "prefill40_ms", "prefill40_gflops"} <= set(r) and "prefill512_ms" not in r, isa


def test_bench_moe_quantized_shape_must_hold_whole_blocks(capsys):
    assert main(["bench-moe", "--shape", "tiny", "--dtype", "q4_k"]) == 1
    assert "--shape: tiny has H=64, I=32: Q4_K rows need a multiple of 256 values" in capsys.readouterr().err
