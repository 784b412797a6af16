"""Verdict: preset sizes match the published figures, fit and roofline arithmetic, model shapes from files, remedies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.engine.config import ModelConfig
from tessera.engine.errors import TesseraError
from tessera.engine.hardware import presets, verdict

MEM = {"available_gb": 100.0, "read_bandwidth_gbs": 50.0, "read_bandwidth_1t_gbs": 20.0, "bandwidth_threads": 8,
       "thp_enabled": "madvise"}


def test_preset_sizes_match_published_figures():
    # tests/data/qwen3-moe-configs.json: per-token active expert bytes 3.62 GB (30B) / 28.4 GB (235B) in bf16
    a3b, a22b = presets.preset("qwen3-30b-a3b"), presets.preset("QWEN3-235B-A22B")
    assert presets.active_expert_params(a3b) * 2 / 1e9 == pytest.approx(3.62, abs=0.01)
    assert presets.active_expert_params(a22b) * 2 / 1e9 == pytest.approx(28.4, abs=0.05)
    assert (presets.dense_params(a3b) + presets.expert_params(a3b)) / 1e9 == pytest.approx(30.5, abs=0.1)
    assert (presets.dense_params(a22b) + presets.expert_params(a22b)) / 1e9 == pytest.approx(235.1, abs=0.2)
    published = json.loads((Path(__file__).resolve().parents[1] / "data" / "qwen3-moe-configs.json").read_text())
    assert a3b == ModelConfig.from_hf_dict(published["Qwen3-30B-A3B"]) and a3b.source == "Qwen3-30B-A3B"
    assert a22b == ModelConfig.from_hf_dict(published["Qwen3-235B-A22B"])
    with pytest.raises(TesseraError, match="--preset"):
        presets.preset("llama")


def test_estimate_cpu_only_roofline_and_fit():
    cfg = presets.preset("qwen3-30b-a3b")
    m = verdict.estimate(cfg, "Qwen3-30B-A3B", "bf16", auto="AVX512", memory=MEM, gpus=[])
    active = presets.active_expert_params(cfg) * 2
    assert m["decode_tok_s_upper_bound"] == pytest.approx(50e9 / active, rel=1e-3)
    assert m["decode_tok_s_upper_bound_cpu_only"] < m["decode_tok_s_upper_bound"]
    assert m["ram_needed_gb"] == pytest.approx(61.1, abs=0.2) and m["fits_ram"]
    int8 = verdict.estimate(cfg, "Qwen3-30B-A3B", "bf16", auto="AVX512Int8", memory=MEM, gpus=[])
    assert int8["expert_format"] == "int8"
    assert int8["decode_tok_s_upper_bound"] == pytest.approx(2 * m["decode_tok_s_upper_bound"], rel=1e-3)
    small = verdict.estimate(cfg, "Qwen3-30B-A3B", "bf16", auto="AVX512", memory={**MEM, "available_gb": 32.0}, gpus=[])
    assert not small["fits_ram"]


def test_estimate_with_gpu_splits_ram_and_vram():
    cfg = presets.preset("qwen3-30b-a3b")
    gpu = {"name": "RTX 4090", "vram_free_gb": 22.0}
    m = verdict.estimate(cfg, "Qwen3-30B-A3B", "bf16", auto="AMXInt8", memory=MEM, gpus=[gpu])
    assert m["fits_vram"] and m["vram_needed_gb"] == pytest.approx(presets.dense_params(cfg) * 2 / 1e9, abs=0.01)
    assert m["ram_needed_gb"] == pytest.approx(presets.expert_params(cfg) / 1e9, abs=0.01)  # int8 experts only
    assert "RTX 4090" in m["placement"] and "decode_tok_s_upper_bound_cpu_only" not in m


@pytest.mark.parametrize(("stored", "device_bytes"), [("q8_0", 2), ("bf16", 2), ("f32", 4)])
def test_vram_counts_what_cuda_holds_not_the_file_blocks(stored, device_bytes):
    # A Q8_0 file's dense weights are 34/32 bytes a weight in RAM but widened to bf16 on the device: VRAM must say 2.
    cfg = presets.preset("qwen3-30b-a3b")
    gpu = {"name": "RTX 4090", "vram_free_gb": 22.0}
    m = verdict.estimate(cfg, "Qwen3-30B-A3B", stored, auto="AVX512Int8", memory=MEM, gpus=[gpu])
    assert m["vram_needed_gb"] == pytest.approx(presets.dense_params(cfg) * device_bytes / 1e9, abs=0.01)


def test_model_shape_from_model_files(tiny_hf_model, tiny_gguf_model, tmp_path):
    """A model is read by the engine's inspector: the config it loads with, its name, its experts' stored type."""
    from tessera.engine.make_model import make_model
    from tessera.engine.weights import load_weights

    for path, want_name in ((tiny_hf_model, tiny_hf_model.name), (tiny_gguf_model, "tessera-random-tiny")):
        cfg, name, dtype = verdict.model_shape(str(path), None)
        assert cfg == load_weights(path).config and dtype == "f32" and name == want_name  # GGUF: general.name
    dense = make_model(tmp_path / "dense.gguf", fmt="gguf", dtype="bf16", config_overrides={"mlp_only_layers": [1]})
    cfg, _, dtype = verdict.model_shape(str(dense), None)
    assert dtype == "bf16" and cfg.dense_layers == [1]
    assert presets.active_expert_params(cfg) == len(cfg.moe_layers) * cfg.num_experts_per_tok * 3 * cfg.hidden_size * (
        cfg.moe_intermediate_size)


def test_model_shape_errors_name_the_path(tmp_path):
    with pytest.raises(TesseraError, match="no such file"):
        verdict.model_shape(str(tmp_path / "absent.gguf"), None)
    with pytest.raises(TesseraError, match="is missing") as e:
        verdict.model_shape(str(tmp_path), None)
    assert e.value.subject == str(tmp_path / "config.json")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(TesseraError, match="not a GGUF file") as e:
        verdict.model_shape(str(bad), None)
    assert e.value.subject == str(bad)


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


def test_backends_come_from_the_one_backend_list():
    from tessera.engine import backends as registry

    table, auto, reason = verdict.backends()
    assert list(table) == list(registry.names()[1:])  # Auto is the verdict's pick, not a row
    assert table["Torch"]["available"] and table["Reference"]["available"]
    assert (auto, reason) == registry.auto() and table[auto]["available"]
    assert verdict.expert_format("AVX512Int8", "bf16") == "int8" and verdict.expert_format("Reference", "f16") == "f16"


def _rendered_report(flag: str, auto: str, **extra) -> dict:
    """A hardware report as engine.hardware.probe builds it, for the renderers: an 8-core CPU with `flag`, no GPU,
    Auto picking `auto`, plus `extra` keys (model, quant_kernels)."""
    cpu = {"model": "x", "vendor": "", "sockets": 1, "physical_cores": 8, "logical_cores": 16, "allowed_cpus": 16,
           "numa_nodes": 1, "source": "cpuid", "flags": {flag: True}, "xcr0": "",
           "amx": {"usable": False, "reason": "no AMX"}}
    return {"host": "h", "kernel": "6", "python": "3", "cpu": cpu, "gpus": [], "gpu_status": "no CUDA device",
            "memory": {**MEM, "total_gb": 128.0, "thp_defrag": "madvise", "hugepages_total": 0,
                       "hugepage_size_kb": 2048, "bandwidth_source": "probe"},
            "backends": {}, "auto_backend": auto, "auto_reason": "r", "remedies": [], **extra}


def test_quant_kernels_listed_as_the_native_module_reports_them():
    """The report names the kernels that read GGUF blocks (and, for avx2, whether its prefill dots run on AVX-VNNI):
    the native module's list minus the emulated AMX twin, which no backend ever picks."""
    from tessera.engine import native
    from tessera.engine.hardware.render import to_markdown

    listed = verdict.quant_kernels()
    assert [q["name"] for q in listed] == [i["name"] for i in native.quant_isas() if i["name"] != "amx_int8_emu"]
    assert listed[-1] == {"name": "reference", "available": True, "reason": "available", "avx_vnni": False}
    report = _rendered_report("avx2", "AVX2", quant_kernels=[
        {"name": "avx512_vnni", "available": False, "reason": "CPU lacks avx512_vnni", "avx_vnni": False},
        {"name": "avx2", "available": True, "reason": "available", "avx_vnni": True},
        {"name": "reference", "available": True, "reason": "available", "avx_vnni": False}])
    text = to_markdown(report)
    assert "- avx512_vnni: no (CPU lacks avx512_vnni)" in text
    assert "- avx2: yes, prefill dots on AVX-VNNI (vpdpbusd)" in text and "- reference: yes\n" in text
    from tessera.app.wizards.report_html import report_html

    html = report_html(report)  # the hardware wizard's page
    assert "Quantized GGUF kernels" in html and "CPU lacks avx512_vnni" in html and "prefill dots on AVX-VNNI" in html


@pytest.mark.parametrize("with_gpu", [False, True])
def test_one_headline_ceiling_the_one_that_applies_here(with_gpu):
    """Without a GPU the CPU reads every weight a token needs, so that (lower) bound is the headline; with one the
    non-expert weights are in VRAM and the experts-only bound applies. The Markdown and the wizard show only it."""
    from tessera.app.wizards.report_html import report_html, summary_html
    from tessera.engine.hardware.render import to_markdown

    cfg = presets.preset("qwen3-30b-a3b")
    gpus = [{"name": "RTX 4090", "vram_free_gb": 22.0}] if with_gpu else []
    m = verdict.estimate(cfg, "Qwen3-30B-A3B", "bf16", auto="AVX512", memory=MEM, gpus=gpus)
    active = presets.active_expert_params(cfg) * 2
    if with_gpu:
        assert m["decode_tok_s_ceiling"] == m["decode_tok_s_upper_bound"] and m["ceiling_bytes_per_token"] == active
        assert "the rest is on the GPU" in m["ceiling_counts"]
    else:
        assert m["decode_tok_s_ceiling"] == m["decode_tok_s_upper_bound_cpu_only"] < m["decode_tok_s_upper_bound"]
        assert m["ceiling_bytes_per_token"] > active and "no GPU" in m["ceiling_counts"]
    assert m["decode_tok_s_ceiling"] == pytest.approx(50e9 / m["ceiling_bytes_per_token"], rel=1e-3)
    report = _rendered_report("avx512f", "AVX512", model=m)
    ceiling = f"{m['decode_tok_s_ceiling']:.1f} tokens/s"
    other = f"{m['decode_tok_s_upper_bound']:.1f} tokens/s"
    for text, figures in ((to_markdown(report), 1), (summary_html(report), 1), (report_html(report), 2)):
        assert ceiling in text and text.count("tokens/s") == figures  # the headline, and the Decode row under it
        assert with_gpu or other not in text
