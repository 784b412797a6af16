"""`tessera-cli generate` with placement flags: --explain prints the plan; CUDA without CUDA is a clear error."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

RESOURCES = Path(__file__).resolve().parents[2] / "tessera" / "resources" / "placement"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "tessera.engine", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_explain_and_twin_generation(tiny_gguf_model):
    r = cli("generate", tiny_gguf_model, "--prompt", "hello there", "--max-tokens", "4", "--temperature", "0",
            "--backend", "Torch", "--twin", "--placement", RESOURCES / "hybrid-cuda.yaml", "--explain", "--json")
    assert r.returncode == 0, r.stderr
    assert "Placement plan (from" in r.stderr and "hot-expert cache: 2 experts per layer on CPU twin" in r.stderr
    out = json.loads(r.stdout)
    assert 0.0 <= out["metrics"]["expert_cache_hit_rate"] <= 1.0
    plain = json.loads(cli("generate", tiny_gguf_model, "--prompt", "hello there", "--max-tokens", "4",
                           "--temperature", "0", "--backend", "Torch", "--json").stdout)
    assert out["token_ids"] == plain["token_ids"]  # the twin changes where things run, not what is computed
    assert plain["metrics"]["expert_cache_hit_rate"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the error cannot happen")
def test_cuda_without_cuda_is_one_clear_error_line(tiny_gguf_model):
    r = cli("generate", tiny_gguf_model, "--prompt", "hi", "--device", "cuda")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith("error: placement: the plan puts parts on cuda but no CUDA device is available")


def test_placement_and_device_flags_conflict(tiny_gguf_model):
    r = cli("generate", tiny_gguf_model, "--prompt", "hi", "--placement", RESOURCES / "cpu-only.yaml",
            "--device", "cuda")
    assert r.returncode == 2 and "error: --placement:" in r.stderr
