"""`tessera-cli check`: the JSON object the issue specifies, Markdown/JSON export, and named errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.engine.cli import main

PROC_FLAGS: set[str] = set()
if Path("/proc/cpuinfo").exists():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            PROC_FLAGS = set(line.split(":", 1)[1].split())
            break


@pytest.fixture(scope="module")
def report() -> dict:
    # A subprocess runs the real entry point, as a user would: `tessera-cli check --json --quick`.
    out = subprocess.run([sys.executable, "-m", "tessera.engine", "check", "--json", "--quick", "--preset",
                          "qwen3-30b-a3b"], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def test_json_has_the_fields_the_issue_lists(report):
    cpu = report["cpu"]
    for key in ("model", "physical_cores", "logical_cores", "numa_nodes", "flags", "amx"):
        assert key in cpu, key
    for flag in ("avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile",
                 "amx_int8", "amx_bf16"):
        assert isinstance(cpu["flags"][flag], bool), flag
    assert isinstance(cpu["amx"]["usable"], bool) and isinstance(cpu["amx"]["reason"], str)
    for key in ("total_gb", "available_gb", "read_bandwidth_gbs", "read_bandwidth_1t_gbs"):
        assert report["memory"][key] > 0, key
    assert isinstance(report["gpus"], list)
    for g in report["gpus"]:
        for key in ("name", "vram_total_gb", "vram_free_gb", "compute_capability", "h2d_gbs", "d2h_gbs"):
            assert key in g, key
    assert all(set(b) == {"available", "reason", "description", "weights"} for b in report["backends"].values())
    assert report["auto_backend"] in report["backends"] and report["backends"][report["auto_backend"]]["available"]
    assert report["model"]["decode_tok_s_upper_bound"] > 0
    tuning = report["tuning"]  # engine.tuned.status(): what is measured on this CPU, or that defaults are in use
    assert set(tuning["knobs"]) == {"prefetch_bytes", "spin_us", "amx_tile_min_rows", "quant_moe_chunk_tokens",
                                     "vnni_gemm_min_tokens", "avx2_gemm_min_tokens", "decode_streams"}
    assert all(isinstance(q["avx_vnni"], bool) for q in report["quant_kernels"])  # the GGUF kernels, best first
    assert report["quant_kernels"][-1]["name"] == "reference" and report["quant_kernels"][-1]["available"]
    assert tuning["cpu"] and tuning["stored"] in (True, False)


@pytest.mark.skipif(not PROC_FLAGS, reason="needs /proc/cpuinfo")
def test_json_matches_this_machine(report):
    """On the team machine (Zen 5): avx512_bf16 true, amx_tile false with a reason; elsewhere: whatever the CPU has."""
    flags = report["cpu"]["flags"]
    assert flags["avx512_bf16"] == ("avx512_bf16" in PROC_FLAGS)
    assert flags["amx_tile"] == ("amx_tile" in PROC_FLAGS)
    if not flags["amx_tile"]:
        assert report["cpu"]["amx"]["usable"] is False
        assert "lacks amx_tile" in report["cpu"]["amx"]["reason"]
        assert not report["backends"]["AMXInt8"]["available"] and report["backends"]["AMXInt8"]["reason"]


def test_no_cuda_is_a_normal_answer(report):
    if not report["gpus"]:
        assert report["gpu_status"].startswith("no CUDA device")


def test_markdown_and_save(tmp_path, capsys):
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    assert main(["check", "--quick", "--no-gpu", "--seconds", "0.1", "--save", str(md)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Tessera hardware report") and "## Backends" in out and "Auto picks" in out
    assert md.read_text().startswith("# Tessera hardware report")
    assert "## Kernel tuning" in out and "- spin_us = " in out  # defaults here: tests keep their own tuning folder
    assert main(["check", "--json", "--no-gpu", "--seconds", "0.1", "--save", str(js)]) == 0
    assert json.loads(js.read_text())["gpu_status"].startswith("GPU probe skipped")


@pytest.mark.parametrize("argv, needle", [
    (["--seconds", "0"], "error: --seconds: must be positive"),
    (["--threads", "0"], "error: --threads: must be at least 1"),
    (["--model", "/no/such/model.gguf"], "error: /no/such/model.gguf: no such file or folder"),
])
def test_errors_name_their_subject(argv, needle, capsys):
    assert main(["check", "--quick", *argv]) == 1
    assert needle in capsys.readouterr().err
