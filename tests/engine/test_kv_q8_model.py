"""The q8_0 KV cache in a model (engine.kv_q8, engine.decode_layer, engine.session): logits against the bf16 cache,
the native decode step against the Python path with the same cache, and the option's plumbing (engine.load, the CLI's
--kv-cache-type, the RAM estimate).

Tolerance of q8_0 against bf16 (test_q8_0_logits_stay_close_to_the_bf16_cache): q8_0 stores each K/V value to within
half a step of 1/127 of its block's largest (relative error up to ~2^-8 of the block's scale, against bf16's 2^-9 of
each value), what llama.cpp users accept with -ctk/-ctv q8_0. On random-weight models, whose logits are nearly flat,
teacher-forced top-1 agreement is held to >= 0.90 (issue 12's bound for quantized weights on such models) and the mean
KL to <= 1e-3: twice the 5e-4 test_attention allows the bf16 cache against transformers, for about twice the per-value
error (measured on 2026-12-03: top-1 0.973 / 0.980, mean KL 4.6e-5 / 3.5e-5 on the q8_0 / bf16 files).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tessera.engine import native
from tessera.engine.attention import native_q8_kernel
from tessera.engine.experts import TorchExperts
from tessera.engine.model import Qwen3MoeModel, RoutingStats, layer_experts
from tessera.engine.weights import load_weights

NATIVE_Q8 = native_q8_kernel(64) != "Reference"
NO_NATIVE_Q8 = "the native decode step over a q8_0 cache needs a native kernel (AVX512_VNNI or AVX2)"
PROMPT, STEPS = 40, 30


@pytest.fixture(scope="module", params=["q8_0", "bf16"])
def model_file(request, tmp_path_factory):
    from tessera.engine.make_model import make_model

    path = tmp_path_factory.mktemp("kvq8-" + request.param) / "m.gguf"
    return request.param, make_model(path, preset="tiny-kquant", fmt="gguf", dtype=request.param)


def _model(path, backend: str, kv_dtype=torch.int8) -> Qwen3MoeModel:
    w = load_weights(path)
    layers = layer_experts(w.config, w.tensors)
    experts = TorchExperts(layers) if backend == "Torch" else native.make_backend(backend, layers, threads=2)
    return Qwen3MoeModel(w, experts, kv_dtype=kv_dtype)


def _step(model, token, cache, native_step: bool, stack: bool = True):
    saved, saved_stack = [block.decode_step for block in model.layers], model.decode_stack
    if not native_step:
        for block in model.layers:
            block.decode_step = None
    if not (native_step and stack):
        model.decode_stack = None
    stats = RoutingStats()
    try:
        return model.forward(token, cache, stats=stats), stats  # [1, V]
    finally:
        for block, step in zip(model.layers, saved):
            block.decode_step = step
        model.decode_stack = saved_stack


def test_q8_0_logits_stay_close_to_the_bf16_cache(model_file):
    name, path = model_file
    q8, bf16 = _model(path, "Auto"), _model(path, "Auto", torch.bfloat16)
    ids = torch.randint(0, q8.config.vocab_size, (300,), generator=torch.Generator().manual_seed(3))
    outs = []
    for model in (q8, bf16):
        cache = model.new_cache(16)
        parts = [model.forward(ids[:200], cache, last_only=False)]  # prefill, then teacher-forced decode steps
        parts += [model.forward(ids[i : i + 1], cache) for i in range(200, 300)]
        outs.append(torch.cat(parts).double())  # [300, V]
    assert q8.new_cache(4).quantized and not bf16.new_cache(4).quantized
    ours, theirs = outs
    assert torch.isfinite(ours).all()
    top1 = float((ours.argmax(-1) == theirs.argmax(-1)).double().mean())
    kl = float((theirs.softmax(-1) * (theirs.log_softmax(-1) - ours.log_softmax(-1))).sum(-1).mean())
    assert top1 >= 0.90 and kl <= 1e-3, f"{name}: top-1 {top1:.3f}, mean KL {kl:.2e}"


@pytest.mark.skipif(not NATIVE_Q8, reason=NO_NATIVE_Q8)
@pytest.mark.parametrize("backend", ["Auto", "Torch"])
def test_native_step_matches_the_python_path(model_file, backend):
    """Same cache state, one token: the native step (its own q/k/v sums, the native quantizer) against the Python path
    (torch's sums, engine.kv_q8's quantizer), both on the same attention kernel. What may differ is test_decode_layer's
    ~1e-7 of summation order, which can move a K/V value across a q8_0 rounding boundary (one step = 1/127 of its
    block's largest): at least 90 % of the steps within 1e-3, every step within 5e-2, and at least 90 % of the written
    K/V bytes identical."""
    name, path = model_file
    model = _model(path, backend)
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (PROMPT + STEPS,), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(PROMPT + STEPS)
    model.forward(ids[:PROMPT], cache)
    close = same_bytes = total_bytes = 0
    for t in range(PROMPT, PROMPT + STEPS):
        ours_cache, theirs_cache = cache.copy_prefix(t), cache.copy_prefix(t)
        assert model.layers[0].decode_step.runs(ids[t : t + 1].reshape(1, 1).float(), ours_cache)
        ours, _ = _step(model, ids[t : t + 1], ours_cache, native_step=True)
        theirs, _ = _step(model, ids[t : t + 1], theirs_cache, native_step=False)
        diff = float((ours - theirs).abs().max())
        assert torch.isfinite(ours).all() and diff <= 5e-2, (t, diff)
        close += diff <= 1e-3
        for layer in range(cfg.num_hidden_layers):
            k_ours, k_theirs = (c.keys_values(layer, t + 1) for c in (ours_cache, theirs_cache))
            for a, b in zip(k_ours, k_theirs):  # [nkv, t+1, hd]: earlier positions untouched, this one close
                assert torch.equal(a[:, :t], b[:, :t])
                same_bytes += int((a[:, t] == b[:, t]).sum())
                total_bytes += a[:, t].numel()
        cache = theirs_cache
    assert close >= 0.9 * STEPS and same_bytes >= 0.9 * total_bytes, (close, same_bytes, total_bytes)


@pytest.mark.skipif(not NATIVE_Q8, reason=NO_NATIVE_Q8)
def test_the_whole_model_call_equals_the_per_layer_calls(model_file):
    name, path = model_file
    model = _model(path, "Auto")
    cfg = model.config
    if model.decode_stack is None or not model.decode_stack.runs(torch.zeros(1, cfg.hidden_size), model.new_cache(4),
                                                                  model.experts):
        assert name != "q8_0", "a q8_0 file's layers all take the one-call step, with a q8_0 cache too"
        pytest.skip("this file's experts are not read in place: no one-call step")
    ids = torch.randint(0, cfg.vocab_size, (PROMPT + 6,), generator=torch.Generator().manual_seed(4))
    cache = model.new_cache(PROMPT + 6)
    model.forward(ids[:PROMPT], cache)
    for t in range(PROMPT, PROMPT + 6):
        ours_cache, theirs_cache = cache.copy_prefix(t), cache.copy_prefix(t)
        ours, _ = _step(model, ids[t : t + 1], ours_cache, native_step=True)
        theirs, _ = _step(model, ids[t : t + 1], theirs_cache, native_step=True, stack=False)
        assert torch.equal(ours, theirs)
        for layer in range(cfg.num_hidden_layers):
            for a, b in zip(ours_cache.keys_values(layer, t + 1), theirs_cache.keys_values(layer, t + 1)):
                assert torch.equal(a, b)
        cache = theirs_cache


def test_native_step_on_the_avx2_kernel():
    """The native decode step takes whatever kernel the dispatch picks (decode_layer.cpp calls attention_q8): in a
    process capped at TESSERA_MAX_ISA=avx2 the two tests above run again, on the AVX2 kernel, and must pass, not
    skip."""
    if native.attention_q8_kernel(64) == "Reference":
        pytest.skip("no native q8_0 attention kernel on this CPU")
    script = textwrap.dedent("""
        import sys
        import pytest
        from tessera.engine import native
        print("kernel", native.attention_q8_kernel(64), flush=True)
        sys.exit(pytest.main(["-q", "-rs", "-p", "no:cacheprovider", sys.argv[1], "-k",
                              "native_step_matches or whole_model_call"]))
    """)
    env = dict(os.environ, TESSERA_MAX_ISA="avx2")
    r = subprocess.run([sys.executable, "-c", script, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.startswith("kernel AVX2\n"), r.stdout[:200]
    assert "6 passed" in r.stdout and "skipped" not in r.stdout, r.stdout[-1500:]


def test_engine_load_takes_the_option_and_names_a_bad_value(model_file):
    from tessera import engine
    from tessera.engine.errors import TesseraError

    name, path = model_file
    with pytest.raises(TesseraError, match="--kv-cache-type.*'q4'"):
        engine.load(path, kv_cache_type="q4")
    session = engine.load(path, kv_cache_type="q8_0", backend="Torch", threads=1, context_length=64)
    try:
        assert session.kv_cache_type == "q8_0" and session.model.new_cache(8).quantized
        assert session.info.ram.kv_bytes < engine.inspect_model(path).ram.kv_bytes  # sized as loaded
    finally:
        session.close()


def test_a_head_dim_q8_0_cannot_store_is_refused_by_name(tiny_gguf_model):
    from tessera import engine
    from tessera.engine.errors import TesseraError

    with pytest.raises(TesseraError, match="--kv-cache-type.*multiple of 32"):
        engine.load(tiny_gguf_model, kv_cache_type="q8_0", backend="Torch", threads=1)


def test_ram_estimate_counts_the_q8_0_cache():
    from tessera.engine.config import PUBLISHED
    from tessera.engine.kv_cache import kv_bytes
    from tessera.engine.model_summary import paper_info

    cfg = PUBLISHED["qwen3-30b-a3b"]
    from tessera.engine.model_info import estimate_ram

    bf16 = paper_info(cfg, "30B", "q4_k_m", context_length=8192)
    q8 = estimate_ram(bf16, 8192, "Auto", "q8_0")
    scratch = kv_bytes(1, cfg.num_key_value_heads, cfg.head_dim, 8192, torch.float32)
    assert q8.kv_bytes == kv_bytes(48, 4, 128, 8192, torch.int8) + scratch
    assert bf16.ram.kv_bytes == kv_bytes(48, 4, 128, 8192) + scratch
    assert q8.kv_bytes - scratch == 2 * 48 * 4 * 8192 * 136  # 128 int8 + 4 f16 scales per position and head


def test_cli_flag(capsys, model_file):
    from tessera.engine.cli import main

    name, path = model_file
    with pytest.raises(SystemExit) as e:
        main(["generate", str(path), "--prompt", "hi", "--kv-cache-type", "q4"])
    assert e.value.code == 2 and "--kv-cache-type" in capsys.readouterr().err
    code = main(["generate", str(path), "--prompt", "Hello", "--temperature", "0", "--max-tokens", "5", "--backend",
                 "Torch", "--threads", "1", "--kv-cache-type", "q8_0", "--json"])
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", ["generate", "chat", "bench", "serve"])
def test_every_loading_command_offers_the_flag(capsys, command):
    from tessera.engine.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "--kv-cache-type" in capsys.readouterr().out


def test_check_sizes_the_q8_0_cache(model_file):
    """tessera-cli check --model/--preset --kv-cache-type: the hardware report's fit sizes the cache the load makes."""
    from tessera.engine.hardware.verdict import model_load, preset_load

    name, path = model_file
    kv = {t: model_load(str(path), context_length=512, backend="Torch", kv_cache_type=t)["ram"]["kv_bytes"]
          for t in ("bf16", "q8_0")}
    assert kv["q8_0"] < kv["bf16"]
    paper = {t: preset_load("qwen3-30b-a3b", "q4_k_m", context_length=8192, backend="Auto", kv_cache_type=t)
             for t in ("bf16", "q8_0")}
    assert paper["bf16"]["ram"]["kv_bytes"] - paper["q8_0"]["ram"]["kv_bytes"] == 2 * 48 * 4 * 8192 * (256 - 136)


def test_the_flag_is_refused_with_a_remote_server(capsys):
    from tessera.engine.cli import main

    code = main(["generate", "--remote", "http://127.0.0.1:9", "--prompt", "hi", "--kv-cache-type", "q8_0"])
    assert code == 2 and "--kv-cache-type" in capsys.readouterr().err
