"""The prefill + decode loop: greedy equality, seeded sampling, cancellation, stop tokens/strings, guards, metrics."""

from __future__ import annotations

import threading

import pytest
import torch
from hf_reference import LetterDecoder, engine_model, single_thread  # noqa: F401

from tessera.engine.errors import ContextOverflowError, TesseraError
from tessera.engine.events import DoneEvent, TokenEvent
from tessera.engine.generate import StopStrings, generate
from tessera.engine.sampling import SamplingParams

PROMPT = [3, 17, 42, 99, 7, 64, 5]


@pytest.fixture(scope="module")
def models():
    return engine_model("odd_sizes", seed=5)


def run(model, params, prompt=PROMPT, ctx=512, **kw):
    events = list(generate(model, model.new_cache(16), prompt, params, decoder=LetterDecoder(), context_length=ctx,
                           **kw))
    assert isinstance(events[-1], DoneEvent) and all(isinstance(e, TokenEvent) for e in events[:-1])
    return events[:-1], events[-1]


def test_greedy_matches_transformers_generate(models):
    ref, model = models
    with torch.no_grad():
        out = ref.generate(torch.tensor([PROMPT]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    tokens, done = run(model, SamplingParams(temperature=0, max_tokens=32))
    assert done.token_ids == out[0, len(PROMPT):].tolist() == [e.token_id for e in tokens]
    assert done.metrics.stop_reason == "max_tokens" and done.metrics.generated_tokens == 32
    assert done.text == "".join(e.text for e in tokens) and len(done.text) == 32
    assert [e.index for e in tokens] == list(range(32))


def test_seeded_sampling_is_reproducible(models):
    _, model = models
    params = SamplingParams(temperature=1.3, top_k=0, top_p=1.0, seed=1234, max_tokens=24)
    a = run(model, params)[1].token_ids
    b = run(model, params)[1].token_ids
    c = run(model, SamplingParams(temperature=1.3, top_k=0, top_p=1.0, seed=99, max_tokens=24))[1].token_ids
    assert a == b
    assert a != c  # 24 tokens at high temperature: another seed gives another sequence


def test_cancel_stops_within_one_token(models):
    _, model = models
    cancel, steps, seen = threading.Event(), [], []
    gen = generate(model, model.new_cache(16), PROMPT, SamplingParams(temperature=0, max_tokens=50),
                   decoder=LetterDecoder(), context_length=512, cancel=cancel, on_step=steps.append)
    for event in gen:
        seen.append(event)
        if isinstance(event, TokenEvent) and event.index == 2:
            cancel.set()
    done = seen[-1]
    assert isinstance(done, DoneEvent) and done.metrics.stop_reason == "cancelled"
    assert len(done.token_ids) == 3 and len(seen) == 4
    assert [s.phase for s in steps] == ["prefill", "decode", "decode"]  # no step computed after the cancel


class CancelAfter:
    """A cancel flag that reads as set from its n-th look on: the generate loop looks once before the prefill chunk,
    then the model once before each decoder layer, so n = 2 stops a prefill step after its first layer."""

    def __init__(self, n: int):
        self.n, self.looks = n, 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks >= self.n


def test_cancel_stops_a_prefill_step_between_layers_and_leaves_the_cache_as_it_was(models):
    _, model = models
    assert len(model.layers) >= 2
    cache, steps = model.new_cache(16), []
    cancel = CancelAfter(2)
    events = list(generate(model, cache, PROMPT, SamplingParams(temperature=0, max_tokens=5), decoder=LetterDecoder(),
                           context_length=512, cancel=cancel, on_step=steps.append))
    assert len(events) == 1 and events[0].metrics.stop_reason == "cancelled" and events[0].token_ids == []
    assert cancel.looks == 2 and steps == []  # stopped before the second layer: no step finished
    assert cache.length == 0 and cache.tokens == []  # the unfinished step left nothing behind
    again = list(generate(model, cache, PROMPT, SamplingParams(temperature=0, max_tokens=5), decoder=LetterDecoder(),
                          context_length=512))[-1]
    assert again.token_ids == run(model, SamplingParams(temperature=0, max_tokens=5))[1].token_ids


def test_cancel_before_start_computes_nothing(models):
    _, model = models
    cancel, steps = threading.Event(), []
    cancel.set()
    tokens, done = run(model, SamplingParams(temperature=0), cancel=cancel, on_step=steps.append)
    assert tokens == [] and steps == [] and done.metrics.stop_reason == "cancelled"


def test_stop_token_ids_and_eos(models):
    _, model = models
    greedy = run(model, SamplingParams(temperature=0, max_tokens=12))[1].token_ids
    stop = greedy[4]
    first = greedy.index(stop)
    tokens, done = run(model, SamplingParams(temperature=0, max_tokens=12), eos_token_ids=(stop,))
    assert done.token_ids == greedy[: first + 1] and done.metrics.stop_reason == "eos"
    assert tokens[-1].text == "" and len(done.text) == first  # the end-of-sequence token adds no text
    same = run(model, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop]))[1]
    assert same.token_ids == done.token_ids
    ignored = run(model, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), eos_token_ids=(stop,))[1]
    assert ignored.token_ids == greedy


def test_stop_string_across_tokens_is_cut_and_held_back(models):
    _, model = models
    greedy = run(model, SamplingParams(temperature=0, max_tokens=16))[1]
    stop = greedy.text[5:8]  # three letters from three different tokens
    first = greedy.text.index(stop)
    tokens, done = run(model, SamplingParams(temperature=0, max_tokens=16, stop=[stop]))
    assert done.metrics.stop_reason == "stop_string"
    assert done.text == greedy.text[:first] == "".join(e.text for e in tokens)
    assert done.token_ids == greedy.token_ids[: first + 3]


def test_stop_strings_unit():
    s = StopStrings(("</end>", "xyz"))
    assert s.feed("hello <") == ("hello ", False)
    assert s.feed("/e") == ("", False)
    assert s.feed("nd") == ("", False)
    assert s.feed("!") == ("</end!", False)
    assert s.feed("ab x") == ("ab ", False)
    assert s.feed("yz tail") == ("", True)
    t = StopStrings(("ab",))
    assert t.feed("a") == ("", False) and t.flush() == "a"


def test_context_guard_and_context_full(models):
    _, model = models
    with pytest.raises(ContextOverflowError) as e:
        generate(model, model.new_cache(16), list(range(20)), SamplingParams(), decoder=LetterDecoder(),
                 context_length=20)
    assert e.value.subject == "prompt" and "context of 20" in e.value.message
    tokens, done = run(model, SamplingParams(temperature=0, max_tokens=100), ctx=len(PROMPT) + 5)
    assert done.metrics.stop_reason == "context_full" and len(done.token_ids) == 5


def test_bad_prompts_are_named_errors(models):
    _, model = models
    with pytest.raises(TesseraError, match="empty"):
        generate(model, model.new_cache(16), [], SamplingParams(), decoder=LetterDecoder(), context_length=64)
    with pytest.raises(TesseraError, match="outside the vocabulary"):
        generate(model, model.new_cache(16), [1, 10_000], SamplingParams(), decoder=LetterDecoder(), context_length=64)


def test_metrics_and_steps(models):
    _, model = models
    steps = []
    tokens, done = run(model, SamplingParams(temperature=0, max_tokens=6), on_step=steps.append, backend_name="Torch")
    m = done.metrics
    assert (m.prompt_tokens, m.reused_tokens, m.generated_tokens, m.backend) == (len(PROMPT), 0, 6, "Torch")
    assert m.ttft_s > 0 and m.prefill_tok_s > 0 and m.decode_tok_s > 0 and m.prefix_hit_rate == 0
    assert m.expert_cache_hit_rate is None
    assert [s.phase for s in steps] == ["prefill"] + ["decode"] * 5
    k, moe = model.config.num_experts_per_tok, sum(model.config.is_moe_layer(i) for i in range(3))
    assert steps[0].tokens == len(PROMPT) and steps[0].expert_pairs == len(PROMPT) * k * moe
    assert all(s.tokens == 1 and s.expert_pairs == k * moe for s in steps[1:])
    assert all(0 < tokens[i].t <= tokens[i + 1].t for i in range(5))
