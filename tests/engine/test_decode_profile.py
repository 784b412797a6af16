"""engine.native.decode_profile: TESSERA_PROFILE's phase timers inside the native one-call decode step
(native/include/tessera/step_profile.h). Off they count nothing; on they count every phase of every step and leave the
step's results as they were, bit for bit (the timers only read clocks and counters). No timing is asserted: only that
the phases are the step's (one mark per layer for the per-layer phases, the phases' wall times adding up to the
step's) and that the counters are consistent.

The profiled run is a child process: the native module reads TESSERA_PROFILE once, when it is first imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tessera.engine import attention, native

pytestmark = pytest.mark.skipif(attention.native_kernel(64) == "Reference",
                                reason="the native decode step needs the AVX-512 attention kernel")

PROMPT, STEPS = 6, 5

# Loads FILE, prefills PROMPT tokens, runs STEPS one-token steps (the whole-model native call), saves the logits of
# each step to OUT (torch.save) and prints decode_profile() as JSON.
CHILD = r"""
import json, sys, torch
from tessera.engine import native
from tessera.engine.model import Qwen3MoeModel, layer_experts
from tessera.engine.weights import load_weights
path, out, prompt, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
w = load_weights(path)
model = Qwen3MoeModel(w, native.make_backend("Auto", layer_experts(w.config, w.tensors), threads=2))
ids = torch.randint(0, w.config.vocab_size, (prompt + steps,), generator=torch.Generator().manual_seed(3))
cache = model.new_cache(prompt + steps)
model.forward(ids[:prompt], cache)
native.decode_profile(reset=True)
logits = [model.forward(ids[t : t + 1], cache) for t in range(prompt, prompt + steps)]
torch.save(torch.cat(logits), out)
print(json.dumps(native.decode_profile()))
"""


@pytest.fixture(scope="module")
def q4_file(tmp_path_factory):
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("prof") / "m.gguf", preset="tiny-kquant", fmt="gguf", dtype="q4_k_m")


def _child(path, out, profile: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_PROFILE"}
    if profile:
        env["TESSERA_PROFILE"] = "1"
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), str(out), str(PROMPT), str(STEPS)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_off_counts_nothing():
    if os.environ.get("TESSERA_PROFILE"):
        pytest.skip("this process runs with TESSERA_PROFILE set")
    prof = native.decode_profile()
    assert prof["enabled"] is False and prof["steps"] == 0 and prof["phases"] == {}


def test_on_counts_every_phase_and_changes_no_result(q4_file, tmp_path):
    off = _child(q4_file, tmp_path / "off.pt", profile=False)
    on = _child(q4_file, tmp_path / "on.pt", profile=True)
    assert off["enabled"] is False and off["steps"] == 0
    assert torch.equal(torch.load(tmp_path / "off.pt"), torch.load(tmp_path / "on.pt"))

    assert on["enabled"] is True and on["steps"] == STEPS and on["threads"] == 2
    from tessera.engine.weights import load_weights

    layers = load_weights(q4_file).config.num_hidden_layers
    phases = on["phases"]
    per_layer = ["input_norm", "qkv", "qk_rope_kv", "attention", "o_proj", "post_norm", "router", "route",
                 "moe_setup", "moe_quant_x", "moe_gate_up", "moe_quant_act", "moe_down", "moe_reduce", "residual"]
    for name in per_layer:
        assert phases[name]["marks"] == STEPS * layers, name
    assert "moe_packed" not in phases  # quantized experts run in place, not a packed copy
    # The phases tile the step: their wall times add up to it (each mark ends one phase and starts the next).
    assert sum(p["wall_ms"] for p in phases.values()) == pytest.approx(on["step_ms"], rel=1e-6, abs=1e-6)
    for name, p in phases.items():
        assert len(p["busy_ms"]) == 2
        assert 0.0 <= p["busy_ms"][0] + p["tail_ms"] <= p["wall_ms"] * (1 + 1e-9) + 1e-9, name
        assert p["joined"] <= p["dispatches"], name  # one worker joins a published job at most once
        assert p["busy_ms"][1] >= 0.0 and p["wake_ms"] >= 0.0 and p["sleeps"] >= 0, name
    # The mat-vec phases of more than one pool task go to the pool (this file's o_proj is one task: the caller runs
    # it); the per-layer scalar work stays on the caller.
    for name in ["qkv", "moe_gate_up", "moe_down"]:
        assert phases[name]["dispatches"] >= STEPS * layers, name
    assert phases["o_proj"]["busy_ms"][0] > 0.0
    for name in ["input_norm", "route", "residual"]:
        assert phases[name]["dispatches"] == 0 and phases[name]["busy_ms"][1] == 0.0, name
