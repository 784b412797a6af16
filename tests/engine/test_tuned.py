"""Kernel knobs measured on this machine (tessera/engine/tuned.py, tessera/engine/calibrate.py, `tessera-cli tune`): the
stored record round-trips and is refused with a named message when damaged or foreign, the environment wins over it, the
calibration picks the measured best (fake clock), and a real short calibration on a tiny shape stores a usable
record."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tessera.engine import calibrate, native, tuned
from tessera.engine.cli import main


def _record(**knobs) -> dict:
    return {"tessera_tuning": tuned.RECORD_VERSION, "cpu": tuned.cpu_model(), "build": tuned.build_id(),
            "measured_at": "2026-12-03T15:00:00Z", "seconds": 2.5, "backend": "AVX2", "threads": 2,
            "shape": {"E": 16, "H": 64, "I": 32, "k": 4},
            "knobs": {n: {"value": v, "default": 0, "workload": "decode", "median_ms": {str(v): 1.0}}
                      for n, v in knobs.items()}}


def test_record_round_trips(tmp_path):
    rec = _record(spin_us=10, prefetch_bytes=4096, quant_moe_chunk_tokens=512)
    path = tuned.save(rec, tmp_path)
    assert path == tuned.record_path(tmp_path) and path.parent == tmp_path
    assert tuned.load(tmp_path) == (rec, "")
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # the temporary file of the atomic write is gone
    assert tuned.load(tmp_path / "empty") == (None, "")  # no record yet: no complaint


def test_status_shows_the_medians_behind_each_measured_value(tmp_path):
    """check and the hardware wizard show each knob's value, its source and, when measured, every candidate's median."""
    rec = _record(quant_moe_chunk_tokens=512)
    rec["knobs"]["quant_moe_chunk_tokens"]["median_ms"] = {"512": 80.25, "64": 99.0, "256": 90.5}
    tuned.save(rec, tmp_path)
    st = tuned.status(tmp_path)
    assert st["stored"] and st["knobs"]["quant_moe_chunk_tokens"] == {
        "value": 512, "source": "measured", "median_ms": {"256": 90.5, "512": 80.25, "64": 99.0}, "meaning": "",
        "medians_text": "; medians 64: 99 ms, 256: 90.5 ms, 512: 80.25 ms",
        "detail": "measured; medians 64: 99 ms, 256: 90.5 ms, 512: 80.25 ms"}
    lines = tuned.describe(st)  # candidates in numeric order, whatever order the JSON holds them in
    assert "quant_moe_chunk_tokens = 512 (measured; medians 64: 99 ms, 256: 90.5 ms, 512: 80.25 ms)" in lines
    assert "spin_us = 50 (default)" in lines  # not in the record: the kernels' default


def test_placeholder_values_say_what_they_stand_for(tmp_path, monkeypatch):
    """A knob whose value means "the kernels' own default" (amx_tile_min_rows 0: per weight format) says so in check,
    for the value and for that candidate's median; plain numbers get no gloss."""
    monkeypatch.delenv("TESSERA_AMX_TILE_MIN_ROWS", raising=False)
    rec = _record(amx_tile_min_rows=0)
    rec["knobs"]["amx_tile_min_rows"]["median_ms"] = {"0": 14.5, "16": 14.4, "1": 13.7}
    tuned.save(rec, tmp_path)
    st = tuned.status(tmp_path)
    assert st["knobs"]["amx_tile_min_rows"]["meaning"].startswith("per weight format: bf16 2, int8 16")
    line = next(x for x in tuned.describe(st) if x.startswith("amx_tile_min_rows = 0"))
    assert "measured: per weight format: bf16 2, int8 16" in line
    assert "medians 0 (per weight format): 14.5 ms, 1: 13.7 ms, 16: 14.4 ms" in line
    assert tuned.value_meaning("amx_tile_min_rows", 16) == "" and tuned.value_meaning("spin_us", 0) == ""


def test_the_quantized_chunk_is_calibrated_on_the_engines_longest_call():
    from tessera.engine import generate

    assert calibrate.QUANT_PREFILL_T == generate.PREFILL_CHUNK


def test_records_are_keyed_by_cpu_and_build(tmp_path):
    tuned.save(_record(spin_us=10), tmp_path)
    assert tuned.load(tmp_path, cpu="Another CPU")[0] is None
    assert tuned.load(tmp_path, build="0123456789abcdef")[0] is None
    assert tuned.record_path(tmp_path, cpu="A") != tuned.record_path(tmp_path, cpu="B")


@pytest.mark.parametrize("text, problem", [
    ("{not json", "not valid JSON"),
    ('{"cpu": "x"}', "not a Tessera tuning record"),
    (json.dumps({**_record(spin_us=1), "tessera_tuning": 99}), "record version 99, this build reads version 1"),
    (json.dumps({**_record(spin_us=1), "cpu": "Other CPU"}), "measured on CPU 'Other CPU'"),
    (json.dumps({**_record(spin_us=1), "build": "feedfacefeedface"}), "measured with native build 'feedfacefeedface'"),
    (json.dumps(_record(threads_per_phase=3)), "unknown knob 'threads_per_phase'"),
    (json.dumps(_record(spin_us="fast")), "knob 'spin_us': 'value' must be a whole number"),
])
def test_bad_record_is_ignored_with_a_named_message(tmp_path, text, problem):
    path = tuned.record_path(tmp_path)
    path.write_text(text)
    record, message = tuned.load(tmp_path)
    assert record is None
    assert message.startswith(f"tuning record {path}: ") and problem in message
    assert message.endswith("ignored, the kernels' defaults are used")
    st = tuned.status(tmp_path)
    assert not st["stored"] and st["message"] == message
    assert all(k["source"] != "measured" for k in st["knobs"].values())


_APPLY = """
import json, sys
from tessera.engine import tuned
rec, msg = tuned.load(sys.argv[1])
print(json.dumps([tuned.apply(rec), msg]))
"""


def _apply_in_child(folder, **env_knobs) -> tuple[dict, str, dict]:
    """tuned.load + tuned.apply in a fresh process with `env_knobs` as the only TESSERA_* knobs set: (what apply says,
    load's message, the native module's own knob values afterwards)."""
    env = {n: v for n, v in os.environ.items() if n not in tuned.KNOBS.values()}
    env.update(env_knobs)
    code = _APPLY + "from tessera.engine import native\nprint(json.dumps(native.tuning()))\n"
    lines = subprocess.run([sys.executable, "-c", code, str(folder)], env=env, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    knobs, message = json.loads(lines[0])
    return knobs, message, json.loads(lines[1])


def test_environment_wins_over_the_record(tmp_path):
    tuned.save(_record(spin_us=123, prefetch_bytes=4096, quant_moe_chunk_tokens=128), tmp_path)
    knobs, message, native_now = _apply_in_child(tmp_path, TESSERA_SPIN_US="7", TESSERA_QUANT_MOE_CHUNK_T="64")
    assert message == ""
    assert knobs["spin_us"] == {"value": 7, "source": "environment"}
    assert knobs["quant_moe_chunk_tokens"] == {"value": 64, "source": "environment"}
    assert knobs["prefetch_bytes"] == {"value": 4096, "source": "measured"}
    assert knobs["amx_tile_min_rows"] == {"value": 0, "source": "default"}
    assert (native_now["spin_us"], native_now["quant_moe_chunk_tokens"], native_now["prefetch_bytes"]) == (7, 64, 4096)


def test_the_record_reaches_the_native_module(tmp_path):
    """What the kernels read (native.tuning(), the atomics in tessera/tuning.h) is the record's value after a load
    applies it, the default before, and the default again when the record is of another build (stale)."""
    rec = _record(spin_us=11, prefetch_bytes=2048, amx_tile_min_rows=2, quant_moe_chunk_tokens=512,
                  vnni_gemm_min_tokens=8, avx2_gemm_min_tokens=3, decode_streams=1)
    tuned.save(rec, tmp_path)
    knobs, message, native_now = _apply_in_child(tmp_path)
    assert message == "" and all(k["source"] == "measured" for k in knobs.values())
    assert {n: native_now[n] for n in tuned.KNOBS} == {n: rec["knobs"][n]["value"] for n in tuned.KNOBS}
    stale = dict(rec, build="feedfacefeedface")
    tuned.record_path(tmp_path).write_text(json.dumps(stale))
    knobs, message, native_now = _apply_in_child(tmp_path)
    assert "measured with native build 'feedfacefeedface'" in message
    assert all(k["source"] == "default" for k in knobs.values())
    assert {n: native_now[n] for n in tuned.KNOBS} == {"spin_us": 50, "prefetch_bytes": -1, "amx_tile_min_rows": 0,
                                                      "quant_moe_chunk_tokens": 0, "vnni_gemm_min_tokens": 0,
                                                      "avx2_gemm_min_tokens": 0, "decode_streams": 0}


def test_a_bad_chunk_in_the_environment_is_named():
    env = dict(os.environ, TESSERA_QUANT_MOE_CHUNK_T="-1")
    r = subprocess.run([sys.executable, "-c", "from tessera.engine import native; native.tuning()"], env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "TESSERA_QUANT_MOE_CHUNK_T: must be a whole number >= 0, got '-1'" in r.stderr


def test_pick_takes_the_best_median_and_keeps_the_default_on_a_near_tie():
    knob = calibrate.Knob("spin_us", 50, (0, 10, 50), "decode")
    runs = {0: iter([9.0, 1.0, 1.0]), 10: iter([2.0, 2.0, 2.0]), 50: iter([3.0, 3.0, 3.0])}  # 0: one slow outlier
    best, medians = calibrate.pick(knob, lambda v: next(runs[v]), rounds=3)
    assert best == 0 and medians == {0: 1.0, 10: 2.0, 50: 3.0}
    near = {0: 0.99, 10: 1.5, 50: 1.0}  # 1 % better than the default: within MARGIN, noise
    assert calibrate.pick(knob, lambda v: near[v], rounds=3)[0] == 50


def test_measure_knob_times_each_value_with_the_knob_set():
    """A fake clock that advances by what the knob in force costs: the calibration must set the native knob before
    timing each candidate, pick the cheapest, and leave the knob as it found it."""
    cost = {0: 5e-3, 10: 2e-3, 50: 4e-3, 200: 8e-3}  # seconds per step by spin_us
    now = [0.0]

    def work():
        now[0] += cost[native.tuning()["spin_us"]]

    before = native.tuning()["spin_us"]
    knob = calibrate.Knob("spin_us", 50, tuple(cost), "decode")
    best, medians = calibrate.measure_knob(knob, work, steps=4, rounds=3, clock=lambda: now[0])
    assert best == 10
    assert medians == pytest.approx(cost)
    assert native.tuning()["spin_us"] == before


def test_knobs_follow_the_backend():
    names = lambda b, **kw: [k.name for k in calibrate.knobs_for(b, **kw)]  # noqa: E731
    chunk, gemm, avx2 = "quant_moe_chunk_tokens", "vnni_gemm_min_tokens", "avx2_gemm_min_tokens"
    streams = "decode_streams"
    # run() keeps the quantized ISA's knobs (AVX-512 VNNI's or AVX2's)
    assert names("AVX512") == ["spin_us", "prefetch_bytes", chunk, streams, gemm, avx2]
    assert names("AVX2") == ["spin_us", "prefetch_bytes", chunk, streams, avx2]
    assert names("AVX512Int8") == ["spin_us", chunk, streams, gemm, avx2] and names("Reference") == ["spin_us"]
    assert names("AMXBF16") == ["spin_us", "amx_tile_min_rows", chunk, streams, gemm]
    assert names("AMXBF16-emulated") == ["spin_us", chunk, streams, gemm]
    # the first load's calibration leaves out the slow quantized prefill (tessera-cli tune measures it), not the
    # quantized decode's streams (one-token steps: quick)
    assert names("AVX512", on_load=True) == ["spin_us", "prefetch_bytes", streams]
    assert names("AMXInt8", on_load=True) == ["spin_us", "amx_tile_min_rows", streams]


def _measures_only(knob, backend: str, workload: str) -> None:
    """calibrate.run(backend) in a child on a 16-expert Q4_K-sized shape, every other knob set by the environment:
    only `knob` is measured, on `workload`, with a median stored for each candidate."""
    code = ("import json; from tessera.engine import calibrate; calibrate.LAYER_BYTES = 4e6; "
            f"r = calibrate.run('{backend}', 16, 256, 256, 4, threads=2, seconds=0.05, rounds=2); "
            "print(json.dumps(r))")
    env = {n: v for n, v in os.environ.items() if n not in tuned.KNOBS.values()}
    env.update({var: "0" for name, var in tuned.KNOBS.items() if name != knob.name})  # 0: a valid value of each
    rec = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                    check=True).stdout)
    assert list(rec["knobs"]) == [knob.name] and rec["shape"]["quant_experts_timed"] == 16
    k = rec["knobs"][knob.name]
    assert k["value"] in knob.candidates and k["workload"] == workload
    assert set(k["median_ms"]) == {str(c) for c in knob.candidates}


def test_the_quantized_chunk_is_measured_on_a_real_sized_prefill(monkeypatch):
    """calibrate.run on a shape of whole Q4_K blocks times quant_moe_chunk_tokens on the quantized synthetic layer
    (spin_us etc. come from the environment here, so only the chunk is measured), and stores every candidate's
    median (which value wins is the machine's business: not asserted)."""
    backend = native.dense_kernel() if native.dense_kernel() in ("AVX512", "AVX2") else None
    if backend is None:
        pytest.skip("the quantized chunk is measured on SIMD backends only")
    _measures_only(calibrate.QUANT_CHUNK, backend, "quant_prefill")
    monkeypatch.setattr(calibrate, "LAYER_BYTES", 1e5)  # less than one expert's blocks: k experts are made
    layer = calibrate.synthetic_quant_layer(16, 256, 256, 4)
    assert layer[3] == 4
    calibrate.synthetic_quant_prefill(layer, 16, 4, 64, native.make_pool(2), "reference")()  # slots of missing
    # experts dropped (-1): a quant_moe_forward runs


def test_the_decode_streams_are_measured_on_quantized_decode_steps():
    """On a backend with SIMD quantized kernels, calibrate.run times decode_streams on one-token quantized MoE steps,
    every candidate's median stored; which value wins is the machine's business."""
    from tessera.engine import backends

    backend = next((b.name for b in backends.table() if b.available and b.name in ("AVX512Int8", "AVX2")), None)
    if backend is None:
        pytest.skip("this CPU (or TESSERA_MAX_ISA) runs neither AVX512Int8 nor AVX2")
    _measures_only(calibrate.DECODE_STREAMS, backend, "quant_decode")


def test_the_avx2_gemm_threshold_is_measured_on_a_short_prefill():
    """On the AVX2 backend, calibrate.run times avx2_gemm_min_tokens on a QUANT_SHORT_T-token quantized prefill (a few
    tokens an expert: where the threshold decides), every candidate's median stored; the other knobs come from the
    environment here. Which value wins is the machine's business: not asserted."""
    from tessera.engine import backends

    if not next(b.available for b in backends.table() if b.name == "AVX2"):
        pytest.skip("this CPU (or TESSERA_MAX_ISA) runs no AVX2 backend")
    _measures_only(calibrate.AVX2_GEMM_MIN, "AVX2", "quant_prefill_short")


def test_real_short_tune_on_a_tiny_shape(tmp_path, capsys):
    before = native.tuning()
    assert main(["tune", "--shape", "tiny", "--threads", "2", "--seconds", "0.3", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "stored " in out and "spin_us = " in out
    record, message = tuned.load(tmp_path)
    assert message == "" and record["shape"]["H"] == 64 and record["backend"] in ("AVX512", "AVX2", "AVX512Int8",
                                                                                   "AMXInt8", "AMXBF16", "Reference")
    for name, k in record["knobs"].items():
        knob = next(kn for kn in calibrate.knobs_for(record["backend"]) if kn.name == name)
        assert k["value"] in knob.candidates and set(k["median_ms"]) == {str(c) for c in knob.candidates}
        assert all(ms > 0 for ms in k["median_ms"].values())
    assert native.tuning() == before  # measuring leaves the process's knobs alone; a load applies the record
    assert main(["tune", "--show", "--dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert f"Measured {record['measured_at']}" in shown and "(measured; medians " in shown


def test_tune_bad_arguments_are_named(capsys):
    assert main(["tune", "--shape", "tiny", "--seconds", "0"]) == 1
    assert "error: --seconds: must be positive" in capsys.readouterr().err


def test_load_applies_a_record_or_says_defaults(tmp_path):
    line = tuned.prepare_for_load("AVX2", 16, 64, 32, 4, folder=tmp_path, calibrate=False)
    assert line.startswith("kernels not calibrated on this CPU yet: defaults used")
    tuned.record_path(tmp_path).write_text("{broken")
    line = tuned.prepare_for_load("AVX2", 16, 64, 32, 4, folder=tmp_path, calibrate=False)
    assert "not valid JSON" in line and "ignored" in line


def test_a_record_of_another_backend_is_not_applied(tmp_path):
    tuned.save(_record(spin_us=123), tmp_path)  # measured on AVX2
    line = tuned.prepare_for_load("Reference", 16, 64, 32, 4, folder=tmp_path)
    assert "was measured on AVX2, this load runs Reference: defaults used" in line and "(measured)" not in line
    assert tuned.load(tmp_path)[0]["knobs"]["spin_us"]["value"] == 123  # not recalibrated over


def test_small_models_do_not_calibrate_by_default(monkeypatch):
    monkeypatch.delenv(tuned.ON_LOAD_ENV, raising=False)
    assert not tuned.calibrate_on_load(192, 256)  # the demo model's experts
    assert tuned.calibrate_on_load(2048, 768)  # Qwen3-30B-A3B's
    monkeypatch.setenv(tuned.ON_LOAD_ENV, "1")
    assert tuned.calibrate_on_load(192, 256)  # asked for
    monkeypatch.setenv(tuned.ON_LOAD_ENV, "0")
    assert not tuned.calibrate_on_load(2048, 768)


_FIRST_LOAD = """
import sys
from tessera.engine import native, tuned
line = tuned.prepare_for_load(sys.argv[2], 16, 64, 32, 4, threads=2, folder=sys.argv[1])
print(line)
print(tuned.load(sys.argv[1])[0] is not None)
"""


def test_first_load_calibrates_once_when_asked(tmp_path):
    """TESSERA_TUNE_ON_LOAD=1 (tests otherwise never calibrate): the first load measures and stores, the second applies
    what the first stored."""
    backend = native.dense_kernel() if native.dense_kernel() in ("AVX512", "AVX2") else "Reference"
    env = dict(os.environ, TESSERA_TUNE_ON_LOAD="1")
    run = lambda: subprocess.run([sys.executable, "-c", _FIRST_LOAD, str(tmp_path), backend], env=env,  # noqa: E731
                                 capture_output=True, text=True, check=True).stdout.splitlines()
    first = run()
    assert first[0].startswith("kernels calibrated in ") and first[1] == "True"
    second = run()
    assert second[0].startswith("kernel tuning measured ") and "spin_us" in second[0] and "(measured)" in second[0]


def test_the_synthetic_layer_has_the_real_shape_and_an_own_copy_of_each_expert(monkeypatch):
    """Its experts are copies of one random expert (timing depends on the bytes streamed, not the values), but each is
    its own memory, so decode streams n experts' bytes as a real layer does; outputs have unit variance."""
    import torch

    monkeypatch.setattr(calibrate, "LAYER_BYTES", 3 * 256 * 128 * 2 * 5)  # room for 5 experts
    layer, n = calibrate.synthetic_layer(16, 256, 128, 2)
    assert n == 5
    assert tuple(layer.gate_proj.shape) == (5, 128, 256) and tuple(layer.down_proj.shape) == (5, 256, 128)
    for m in (layer.gate_proj, layer.up_proj, layer.down_proj):
        assert m.dtype == torch.bfloat16 and m.is_contiguous() and torch.isfinite(m.float()).all()
        assert m.untyped_storage().nbytes() == m.numel() * 2  # n experts' bytes, not one expert broadcast
        assert 0.5 < float(m[0].float().pow(2).sum(-1).mean()) < 2.0  # unit-variance outputs for unit inputs
    assert not torch.equal(layer.gate_proj[0], layer.up_proj[0])
    monkeypatch.setattr(calibrate, "LAYER_BYTES", 1.0)
    assert calibrate.synthetic_layer(16, 256, 128, 3)[1] == 3  # never fewer than k
