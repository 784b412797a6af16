"""scripts/train_demo.py's own machinery: it pauses while someone else holds the bench lock, batches conversations by
padded tokens the same way on every run (so a rerun resumes on the same batches), and can start from a shipped demo
GGUF whose weights transformers then runs exactly as Tessera's engine does."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from tessera.engine.demo import DEMO_GGUF

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def td():
    spec = importlib.util.spec_from_file_location("train_demo", REPO / "scripts" / "train_demo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_lock_is_held_only_while_another_holder_has_it(td, tmp_path):
    lock = tmp_path / "bench.lock"
    assert not td.lock_is_held(lock)  # missing: never held
    lock.touch()
    assert not td.lock_is_held(lock)
    fd = os.open(lock, os.O_RDONLY)  # another open file description: another holder, as `flock` would be
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert td.lock_is_held(lock)
        fcntl.flock(fd, fcntl.LOCK_UN)
        fcntl.flock(fd, fcntl.LOCK_SH)  # a shared holder counts too
        assert td.lock_is_held(lock)
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert not td.lock_is_held(lock)  # and probing left no lock behind
    finally:
        os.close(fd)


def test_a_second_run_on_the_same_folder_stops(td, tmp_path):
    fd = td.claim_out_dir(tmp_path / "run")
    try:
        with pytest.raises(SystemExit, match="another train_demo run"):
            td.claim_out_dir(tmp_path / "run")
    finally:
        os.close(fd)
    os.close(td.claim_out_dir(tmp_path / "run"))  # free again once the first run is gone


def test_wait_while_locked_returns_when_the_holder_lets_go(td, tmp_path):
    lock = tmp_path / "bench.lock"
    lock.touch()
    assert td.wait_while_locked(None) == 0.0
    fd = os.open(lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    releaser = threading.Timer(0.6, lambda: (fcntl.flock(fd, fcntl.LOCK_UN), os.close(fd)))
    releaser.start()
    t0 = time.time()
    begun = []
    waited = td.wait_while_locked(lock, poll_s=0.05, on_wait=lambda: begun.append(time.time()))
    releaser.join()
    assert 0.5 <= waited <= time.time() - t0
    assert len(begun) == 1 and begun[0] - t0 < 0.3  # said once, at the start
    assert td.wait_while_locked(lock, on_wait=lambda: begun.append(0)) < 0.5 and len(begun) == 1  # free: not said


def test_batch_plan_fills_token_budgets_the_same_way_every_time(td):
    import random

    rng = random.Random(0)
    lengths = [rng.randint(20, 2048) for _ in range(3000)]
    plan = td.batch_plan(lengths, 4096, seed=1)
    assert plan == td.batch_plan(lengths, 4096, seed=1)
    assert sorted(i for b in plan for i in b) == list(range(3000))  # every conversation once
    assert all(len(b) * max(lengths[i] for i in b) <= 4096 for b in plan)
    assert sum(len(b) * max(lengths[i] for i in b) for b in plan) > 0.75 * 4096 * len(plan)  # little padding


def test_parse_args_rejects_a_budget_smaller_than_the_context(td, capsys):
    with pytest.raises(SystemExit):
        td.parse_args(["--tokens-per-step", "1000"])
    assert "--tokens-per-step" in capsys.readouterr().err


def test_init_from_the_shipped_gguf_gives_the_engine_s_model(td, tmp_path):
    transformers = pytest.importorskip("transformers")
    from tessera import engine
    from tessera.engine.sampling import SamplingParams

    built, state, cfg = td.init_from_gguf(DEMO_GGUF, tmp_path / "tok")
    args = td.parse_args([])
    config = td.model_config(args, built)
    assert {k: config[k] for k in ("vocab_size", "hidden_size", "num_experts")} == \
        {k: cfg.to_hf_dict()[k] for k in ("vocab_size", "hidden_size", "num_experts")}
    skip = ("architectures", "model_type", "torch_dtype")
    model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**{k: v for k, v in config.items()
                                                                            if k not in skip}))
    model.load_state_dict(state, strict=True)
    model.eval()
    session = engine.load(DEMO_GGUF, backend="Torch", threads=1)
    try:
        ids = session.tokenizer.encode("<|im_start|>user\nWhat is 12 + 34?<|im_end|>\n<|im_start|>assistant\n")
        events = list(session.generate(ids, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)))
        with torch.no_grad():
            want = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                                  min_new_tokens=12)
        assert events[-1].token_ids == want[0, len(ids):].tolist()
    finally:
        session.close()


def test_a_rerun_rebuilds_the_same_conversations_and_batches(td, tmp_path):
    from tokenizers import Tokenizer

    from tessera.engine.demo.dataset import CONTEXT_TOKENS, make_renderer
    from tessera.engine.tokenizer_build import chat_template

    built, _state, _cfg = td.init_from_gguf(DEMO_GGUF, tmp_path / "tok")
    tok = Tokenizer.from_file(str(built.out_dir / "tokenizer.json"))
    render = make_renderer(chat_template())
    args = td.parse_args(["--steps", "30", "--tokens-per-step", str(CONTEXT_TOKENS)])
    data, plan = td.training_data(tok, render, args)
    again, plan_again = td.training_data(tok, render, args)
    assert len(plan) == 30 and plan == plan_again
    assert [data[i] for b in plan for i in b] == [again[i] for b in plan for i in b]
    assert max(len(data[i][0]) for b in plan for i in b) <= CONTEXT_TOKENS
