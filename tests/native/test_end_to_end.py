"""The model's MoE layers through each native backend, end to end on a tiny bf16 model (one load; switching backend
repacks without reloading the file):
- greedy generation is identical across the bf16 backends and the Reference;
- int8 backends reach >= 99 % teacher-forced top-1 agreement with the Reference over a fixed text, and greedy
  continuations differ in at most 1 of 20 positions on prompts whose top two logits are not within rounding.
"""

import pytest
import torch

import tessera.engine.backends as B
from tessera import engine
from tessera.engine import dense
from tessera.engine.make_model import make_model

pytestmark = pytest.mark.slow  # a model load and a few dozen short generations per backend

INT8 = [n for n in B.available_names(include_emulated=True) if "Int8" in n]
BF16 = [n for n in B.available_names(include_emulated=True) if "Int8" not in n and n != "Reference"]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    cache = tmp_path_factory.mktemp("xdg-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(cache))  # packed-weight cache of this test only
    # These tests judge the expert kernels on a model whose top-2 logit gaps are ~1e-3. The dense layers' bf16 GEMM
    # (from 16 tokens) rounds its input to bf16, which turns the kernels' last-bit differences into 2^-9 steps and
    # multiplies the teacher-forced RMS change by ~4 on every backend, AVX512 included (measured: 0.0004 -> 0.0062):
    # the dense layers keep their f32-input mat-vec here, as the KV cache stays f32 below
    # (tests/engine/test_dense_gemm.py tests that GEMM).
    mp.setattr(dense, "GEMM_MIN_TOKENS", 10**9)
    path = make_model(tmp_path_factory.mktemp("tiny-bf16") / "model", fmt="hf", dtype="bf16", seed=3)
    s = engine.load(path, backend="Reference", threads=2)
    yield s
    s.close()
    mp.undo()


def use(session, name):
    if session.backend_name != name:
        session.set_backend(name)
    assert session.backend_name == name


def greedy(session, prompt, n):
    """n greedy tokens after `prompt`, and the top-2 logit gap at each step."""
    model = session.model
    cache = model.new_cache(len(prompt) + n, torch.float32)  # see teacher_forced
    logits = model.forward(torch.tensor(prompt), cache)[0]  # [V]
    out, gaps = [], []
    for _ in range(n):
        top = torch.topk(logits, 2).values
        gaps.append(float(top[0] - top[1]))
        tok = int(torch.argmax(logits))
        out.append(tok)
        logits = model.forward(torch.tensor([tok]), cache)[0]
    return out, gaps


def teacher_forced(session, ids):
    model = session.model
    # A float32 KV cache: these tests judge the expert kernels on a tiny model whose top-2 logit gaps are ~1e-3, the
    # size of what the default bf16 cache moves logits by; a bf16 cache would change which prompts count as decisive.
    return model.forward(torch.tensor(ids), model.new_cache(len(ids), torch.float32), last_only=False)  # [T, V]


def fixed_text(session):
    text = ("The quick brown fox jumps over the lazy dog. " * 3 + "Tessera runs experts on the CPU; "
            "attention, norms and the router stay in torch. 0123456789 " * 2)
    return session.tokenizer.encode(text)


PROMPTS = [[5, 17, 42], [100, 7, 300, 12, 9, 1], [250, 251, 252, 253], [3, 1, 4, 1, 5, 9, 2, 6], [77] * 5, [400, 2]]
# 40-token prompts: their prefill takes the bf16-activation tiles (T >= 16) where a backend has them.
LONG_PROMPTS = [torch.randint(0, 437, (40,), generator=torch.Generator().manual_seed(s)).tolist() for s in range(3)]


@pytest.mark.parametrize("name", BF16)
def test_greedy_identical_to_reference(session, name):
    use(session, "Reference")
    want = [greedy(session, p, 20)[0] for p in PROMPTS + LONG_PROMPTS]
    use(session, name)
    got = [greedy(session, p, 20)[0] for p in PROMPTS + LONG_PROMPTS]
    assert got == want


@pytest.mark.parametrize("name", INT8)
def test_int8_teacher_forced_agreement_and_greedy(session, name):
    ids = fixed_text(session)
    assert len(ids) >= 100
    use(session, "Reference")
    ref_logits = teacher_forced(session, ids)  # [T, V]
    ref_greedy = [greedy(session, p, 20) for p in PROMPTS]
    use(session, name)
    logits = teacher_forced(session, ids)  # [T, V]
    agree = float((logits.argmax(-1) == ref_logits.argmax(-1)).float().mean())
    assert agree >= 0.99, f"{name}: teacher-forced top-1 agreement {agree:.3f}"
    # "Within rounding": a top-2 gap below 4x the RMS logit change the quantization causes on the fixed text.
    margin = 4 * float((logits - ref_logits).pow(2).mean().sqrt())
    decisive = [(p, toks) for p, (toks, gaps) in zip(PROMPTS, ref_greedy) if min(gaps) > margin]
    assert len(decisive) >= 2, "too few prompts with decisive logits to test"
    for p, want in decisive:
        got, _ = greedy(session, p, 20)
        diffs = sum(a != b for a, b in zip(got, want))
        assert diffs <= 1, f"{name}: prompt {p}: {diffs} of 20 greedy positions differ"


def test_switching_backend_keeps_the_session_and_names_unavailable_ones(session):
    missing = [n for n, (ok, _) in B.status().items() if not ok]
    use(session, "Reference")
    if missing:
        with pytest.raises(engine.errors.BackendUnavailableError, match=f"backend {missing[0]}: "):
            session.set_backend(missing[0])
        assert session.backend_name == "Reference"  # the old backend stays on error


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_cli_unavailable_backend_is_a_named_error(command, tiny_gguf_model, capsys, tmp_path, monkeypatch):
    missing = [n for n, (ok, _) in B.status().items() if not ok]
    if not missing:
        pytest.skip("every backend runs here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from tessera.engine.cli import main

    extra = (["--prompt", "hi", "--max-tokens", "2"] if command == "generate"
             else ["--prompt-tokens", "4", "--gen-tokens", "2"])
    assert main([command, str(tiny_gguf_model), "--backend", missing[0], *extra]) == 1
    reason = B.status()[missing[0]][1]
    assert f"error: backend {missing[0]}: {reason}" in capsys.readouterr().err


def test_cli_generate_runs_on_every_native_backend(tiny_gguf_model, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from tessera.engine.cli import main

    for name in ["Auto", "Reference"] + [n for n in B.status() if n in B.available_names(include_emulated=True)]:
        assert main(["generate", str(tiny_gguf_model), "--backend", name, "--prompt", "hello", "--max-tokens", "3",
                     "--temperature", "0"]) == 0, name
