"""Verdict: preset sizes match the published figures, fit and roofline arithmetic, model shapes from files, remedies."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.errors import TesseraError
from engine.hardware import presets, verdict

MEM = {"available_gb": 100.0, "read_bandwidth_gbs": 50.0, "read_bandwidth_1t_gbs": 20.0, "bandwidth_threads": 8,
       "thp_enabled": "madvise"}


def test_preset_sizes_match_published_figures():
    # tests/data/qwen3-moe-configs.json: per-token active expert bytes 3.62 GB (30B) / 28.4 GB (235B) in bf16
    a3b, a22b = presets.preset("qwen3-30b-a3b"), presets.preset("QWEN3-235B-A22B")
    assert a3b.active_expert_params() * 2 / 1e9 == pytest.approx(3.62, abs=0.01)
    assert a22b.active_expert_params() * 2 / 1e9 == pytest.approx(28.4, abs=0.05)
    assert (a3b.dense_params() + a3b.expert_params()) / 1e9 == pytest.approx(30.5, abs=0.1)
    assert (a22b.dense_params() + a22b.expert_params()) / 1e9 == pytest.approx(235.1, abs=0.2)
    with pytest.raises(TesseraError, match="--preset"):
        presets.preset("llama")


def test_estimate_cpu_only_roofline_and_fit():
    shape = presets.preset("qwen3-30b-a3b")
    m = verdict.estimate(shape, "bf16", auto="AVX512", memory=MEM, gpus=[])
    active = shape.active_expert_params() * 2
    assert m["decode_tok_s_upper_bound"] == pytest.approx(50e9 / active, rel=1e-3)
    assert m["decode_tok_s_upper_bound_cpu_only"] < m["decode_tok_s_upper_bound"]
    assert m["ram_needed_gb"] == pytest.approx(61.1, abs=0.2) and m["fits_ram"]
    int8 = verdict.estimate(shape, "bf16", auto="AVX512Int8", memory=MEM, gpus=[])
    assert int8["expert_format"] == "int8"
    assert int8["decode_tok_s_upper_bound"] == pytest.approx(2 * m["decode_tok_s_upper_bound"], rel=1e-3)
    small = verdict.estimate(shape, "bf16", auto="AVX512", memory={**MEM, "available_gb": 32.0}, gpus=[])
    assert not small["fits_ram"]


def test_estimate_with_gpu_splits_ram_and_vram():
    shape = presets.preset("qwen3-30b-a3b")
    gpu = {"name": "RTX 4090", "vram_free_gb": 22.0}
    m = verdict.estimate(shape, "bf16", auto="AMXInt8", memory=MEM, gpus=[gpu])
    assert m["fits_vram"] and m["vram_needed_gb"] == pytest.approx(shape.dense_params() * 2 / 1e9, abs=0.01)
    assert m["ram_needed_gb"] == pytest.approx(shape.expert_params() / 1e9, abs=0.01)  # int8 experts only
    assert "RTX 4090" in m["placement"] and "decode_tok_s_upper_bound_cpu_only" not in m


def test_model_shape_from_hf_folder(tmp_path):
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 3,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "moe_intermediate_size": 40,
           "intermediate_size": 96, "num_experts": 6, "num_experts_per_tok": 2, "vocab_size": 300,
           "mlp_only_layers": [1], "torch_dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape, dtype = verdict.model_shape(str(tmp_path), None)
    assert dtype == "f32" and shape.dense_layers == 1 and shape.moe_layers == 2 and shape.head_dim == 24
    assert shape.active_expert_params() == 2 * 2 * 3 * 64 * 40
    del cfg["num_experts"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TesseraError, match="num_experts"):
        verdict.model_shape(str(tmp_path), None)


def test_model_shape_errors_name_the_path(tmp_path):
    with pytest.raises(TesseraError, match="no such file"):
        verdict.model_shape(str(tmp_path / "absent.gguf"), None)
    with pytest.raises(TesseraError, match="config.json missing"):
        verdict.model_shape(str(tmp_path), None)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(TesseraError, match="not a readable GGUF"):
        verdict.model_shape(str(bad), None)


def test_model_shape_from_gguf_header(tmp_path):
    import gguf

    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    for key, value in {"block_count": 2, "embedding_length": 32, "attention.head_count": 4,
                       "attention.head_count_kv": 2, "attention.key_length": 16, "expert_feed_forward_length": 24,
                       "expert_count": 4, "expert_used_count": 2}.items():
        w.add_uint32(f"qwen3moe.{key}", value)
    w.add_token_list(["a", "b", "c"])
    for i in range(2):
        for part in ("gate", "up"):
            w.add_tensor(f"blk.{i}.ffn_{part}_exps.weight", np.zeros((4, 24, 32), dtype=np.float16))
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", np.zeros((4, 32, 24), dtype=np.float16))
    w.add_tensor("output.weight", np.zeros((3, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shape, dtype = verdict.model_shape(str(path), None)
    assert dtype == "f16" and shape.num_experts == 4 and shape.num_experts_per_tok == 2 and shape.vocab_size == 3
    assert shape.dense_layers == 0 and not shape.tie_word_embeddings and shape.head_dim == 16


def _report(**cpu_over):
    cpu = {"model": "Intel(R) Xeon(R) Platinum 8480+", "vendor": "GenuineIntel", "physical_cores": 56,
           "logical_cores": 112, "allowed_cpus": 112,
           "flags": {"amx_tile": False, "avx512f": True}, "amx": {"usable": False, "reason": "CPU lacks amx_tile"}}
    cpu.update(cpu_over)
    # 56 cores reading 50 GB/s together against 40 GB/s for one: channels or XMP are the suspects
    return {"cpu": cpu, "memory": dict(MEM, read_bandwidth_1t_gbs=40.0, bandwidth_threads=56), "gpus": []}


def test_remedies_in_plain_words():
    topics = [r["topic"] for r in verdict.remedies(_report())]
    assert topics == ["AMX", "Memory bandwidth"]  # Sapphire Rapids without the AMX flag -> BIOS
    r = verdict.remedies(_report(flags={"amx_tile": True}, amx={"usable": False, "reason": "XCR0=0xe7 lacks bits"}))
    assert "Linux 5.16" in r[0]["remedy"]
    fine = _report(model="AMD Ryzen 9 7950X", vendor="AuthenticAMD", physical_cores=16, logical_cores=32,
                   allowed_cpus=8)
    fine["memory"] = dict(MEM, read_bandwidth_gbs=60.0, bandwidth_threads=8, thp_enabled="never")
    topics = [r["topic"] for r in verdict.remedies(fine)]
    assert topics == ["Threads", "Threads", "Huge pages"]


def test_predicted_backends_follow_design_table():
    flags = {"avx2": True, "fma": True, "avx512f": True, "avx512bw": True, "avx512vl": True, "avx512_vnni": False}
    assert verdict.predicted_backend("AVX512", flags, False, "")[0]
    assert verdict.predicted_backend("AVX512Int8", flags, False, "") == (False, "CPU lacks avx512_vnni")
    amx = {"amx_tile": True, "amx_int8": True}
    assert verdict.predicted_backend("AMXInt8", amx, False, "kernel refused") == (False, "kernel refused")
