"""`tessera-cli bench-moe --dtype q4_k_m ...`: the quantized layer's JSON object (tiny-q shape: this tests the
command, not speed) and the named error for a shape whose rows are not whole blocks."""

import json

import pytest

import tessera.engine.native as N
from tessera.engine.cli import main
from tessera.engine.cli.bench_moe_quant import decode_copies, last_level_cache_bytes


@pytest.mark.parametrize("dtype", ["q4_k_m", "q8_0"])
def test_bench_moe_quantized_json(capsys, dtype):
    assert main(["bench-moe", "--shape", "tiny-q", "--dtype", dtype, "--threads", "2", "--seconds", "0.05",
                 "--rounds", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dtype"] == dtype and out["bandwidth_gbs"] > 0
    assert 1 <= out["decode_layer_copies"] <= 16 and out["decode_working_set_bytes"] > 0
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


def test_the_last_level_cache_is_read_from_sysfs(tmp_path):
    for index, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "491520K"), ("index4", "n/a")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 491520 * 1024
    assert last_level_cache_bytes(tmp_path / "absent") == 0  # no sysfs cache folder: nothing known


def test_decode_copies_cover_twice_the_cache_within_the_ram():
    MB = 10**6
    assert decode_copies(392 * MB, 491 * MB, 24_000 * MB) == 3  # a Q4_K_M layer against a 480 MB L3: 1.18 GB
    assert decode_copies(392 * MB, 0, 24_000 * MB) == 1  # no cache size known: the layer alone
    assert decode_copies(392 * MB, 491 * MB, 1_000 * MB) == 1  # no room for copies: the layer alone
    assert decode_copies(1 * MB, 491 * MB, 24_000 * MB) == 16  # a tiny layer: at most 16 copies
