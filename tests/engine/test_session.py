"""engine.load + Session on the make-model tiny model, HF folder and GGUF: logits vs transformers, greedy generation,
chat prefix reuse across turns, backend switching, cancellation and named errors."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch
from hf_reference import single_thread  # noqa: F401

from tessera import engine
from tessera.engine.errors import BackendUnavailableError, ContextOverflowError, TesseraError
from tessera.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=16)


@pytest.fixture(scope="module")
def hf_session(tiny_hf_model):
    s = engine.load(tiny_hf_model, backend="Torch", threads=1)
    yield s
    s.close()


@pytest.fixture(scope="module")
def reference(tiny_hf_model):
    from transformers import Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM.from_pretrained(tiny_hf_model, dtype=torch.float32, attn_implementation="eager").eval()


def ids_of(session, text="The quick brown fox 跳过 lazy dogs 🙂 def f(x): return x"):
    return session.tokenizer.encode(text)


@pytest.mark.parametrize("which", ["hf", "gguf"])
def test_logits_equal_transformers_from_both_formats(which, tiny_hf_model, tiny_gguf_model, reference, hf_session):
    session = hf_session if which == "hf" else engine.load(tiny_gguf_model, backend="Torch", threads=1)
    ids = ids_of(session)
    assert len(ids) > 8
    with torch.no_grad():
        theirs = reference(torch.tensor([ids])).logits[0]  # [T, V]
    cache = session.model.new_cache(8, torch.float32)  # the arithmetic, exactly; bf16 KV: tests/engine/test_model_vs_hf
    ours = session.model.forward(torch.tensor(ids), cache, last_only=False)  # [T, V]
    scale = float(theirs.max() - theirs.min())
    assert float((ours - theirs).abs().max()) <= 1e-4 * scale
    if which == "gguf":
        session.close()


def test_greedy_generation_identical_to_transformers(hf_session, reference):
    ids = ids_of(hf_session, "Hello there, how")
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)
    events = list(hf_session.generate(ids, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)))
    done = events[-1]
    assert done.token_ids == out[0, len(ids):].tolist()
    assert done.text == "".join(e.text for e in events[:-1])
    assert done.text == hf_session.tokenizer.decode(done.token_ids)


def test_chat_second_turn_reuses_first_turn(hf_session):
    hf_session.reset_cache()
    turn1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    first = list(hf_session.chat(turn1, GREEDY, enable_thinking=False))[-1]
    assert first.metrics.reused_tokens == 0 and first.metrics.prefix_hit_rate == 0
    turn2 = turn1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Another one?"}]
    warm = list(hf_session.chat(turn2, GREEDY, enable_thinking=False))[-1]
    m = warm.metrics
    assert m.reused_tokens > 0 and m.prefix_hit_rate == m.reused_tokens / m.prompt_tokens > 0
    hf_session.reset_cache()
    cold = list(hf_session.chat(turn2, GREEDY, enable_thinking=False))[-1]
    assert cold.metrics.reused_tokens == 0
    assert warm.token_ids == cold.token_ids  # same answer with and without the reused KV


def test_prefix_reuse_across_conversations_and_backend_switch(hf_session):
    hf_session.reset_cache()
    a = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "First conversation."}]
    b = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Second one, different."}]
    list(hf_session.chat(a, GREEDY))
    list(hf_session.chat(b, GREEDY))  # shares the system prompt only: a is copied, not overwritten
    hf_session.set_backend("Torch")
    again = list(hf_session.chat(a, GREEDY))[-1]
    assert again.metrics.prompt_tokens - again.metrics.reused_tokens == 1  # a's whole prompt was still cached
    assert hf_session.backend_name == "Torch"


def test_auto_backend_is_resolved(tiny_hf_model):
    events = []
    s = engine.load(tiny_hf_model, threads=1, progress=events.append)
    try:
        assert s.backend_name not in ("", "Auto") and s.backend_reason
        stages = [e.stage for e in events]
        assert "load" in stages and stages[-1] == "prepare" and events[-1].done == events[-1].total
        done = list(s.generate(ids_of(s), SamplingParams(temperature=0, max_tokens=4)))[-1]
        assert done.metrics.backend == s.backend_name
    finally:
        s.close()


def test_cancel_then_session_still_usable(hf_session):
    cancel, n = threading.Event(), 0
    for event in hf_session.generate(ids_of(hf_session), SamplingParams(temperature=0, max_tokens=50, ignore_eos=True),
                                     cancel=cancel):
        if hasattr(event, "metrics"):
            assert event.metrics.stop_reason == "cancelled" and len(event.token_ids) == 2
        else:
            n += 1
            if n == 2:
                cancel.set()
    assert n == 2
    assert list(hf_session.generate(ids_of(hf_session), GREEDY))[-1].metrics.stop_reason in ("eos", "max_tokens")


def test_abandoned_generator_releases_the_session(hf_session):
    gen = hf_session.generate(ids_of(hf_session), GREEDY)
    next(gen)
    with pytest.raises(TesseraError, match="already generating"):
        next(hf_session.generate(ids_of(hf_session), GREEDY))
    gen.close()
    assert list(hf_session.generate(ids_of(hf_session), GREEDY))


def test_request_errors_are_named(hf_session, tiny_hf_model):
    with pytest.raises(TesseraError, match="empty"):
        hf_session.generate([], GREEDY)
    with pytest.raises(TesseraError) as e:
        hf_session.chat([], GREEDY)
    assert e.value.subject == "messages"
    with pytest.raises(TesseraError) as e:
        hf_session.chat([{"role": "robot", "content": "hi"}], GREEDY)
    assert e.value.subject == "messages[0]"
    short = engine.load(tiny_hf_model, backend="Torch", context_length=16)
    with pytest.raises(ContextOverflowError, match="context of 16"):
        short.generate(list(range(40)), GREEDY)
    short.close()
    with pytest.raises(TesseraError) as e:
        engine.load(tiny_hf_model, backend="Torch", context_length=1)
    assert e.value.subject == "--context-length"
    long = engine.load(tiny_hf_model, backend="Torch", context_length=10**9)
    assert long.context_length == long.config.max_position_embeddings  # clamped to the model's trained context
    long.close()


def test_unavailable_backend_is_named(tiny_hf_model):
    from tessera.engine import backends

    missing = [n for n, (ok, _) in backends.status().items() if not ok]
    if missing:  # a backend this CPU lacks (none on a machine with AMX: the capped case below still runs)
        with pytest.raises(BackendUnavailableError) as e:
            engine.load(tiny_hf_model, backend=missing[0])
        assert e.value.subject == f"backend {missing[0]}"
    # On every machine: dispatch capped below AVX-512, in a fresh process (the cap is read once per process).
    code = ("from tessera import engine\nfrom tessera.engine.errors import BackendUnavailableError\n"
            f"try: engine.load({str(tiny_hf_model)!r}, backend='AVX512')\n"
            "except BackendUnavailableError as e: print(e.subject, '|', e.message)")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TESSERA_MAX_ISA="avx2"),
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "backend AVX512 | capped by TESSERA_MAX_ISA=avx2"


def test_stop_string_with_real_tokenizer(hf_session):
    ids = ids_of(hf_session, "Once upon a time")
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    full = list(hf_session.generate(ids, params))[-1]
    assert len(full.text) > 6
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    events = list(hf_session.generate(ids, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop])))
    done = events[-1]
    assert done.metrics.stop_reason == "stop_string"
    assert done.text == full.text[: full.text.index(stop)] == "".join(e.text for e in events[:-1])
    assert done.token_ids == full.token_ids[: len(done.token_ids)]
