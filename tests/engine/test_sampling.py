"""Sampling parameters and the pure sampling functions, against transformers' logits processors where they exist."""

from __future__ import annotations

import math

import pytest
import torch
from hf_reference import single_thread  # noqa: F401

from tessera.engine.errors import TesseraError
from tessera.engine.sampling import (
    SamplingParams,
    apply_repetition_penalty,
    filter_min_p,
    filter_top_k,
    filter_top_p,
    make_generator,
    sample,
)


@pytest.mark.parametrize(
    "kwargs, subject",
    [
        (dict(top_p=0.0), "--top-p"),
        (dict(top_p=1.5), "--top-p"),
        (dict(temperature=-0.1), "--temperature"),
        (dict(temperature=math.nan), "--temperature"),
        (dict(top_k=-1), "--top-k"),
        (dict(min_p=1.0), "--min-p"),
        (dict(repetition_penalty=0.0), "--repetition-penalty"),
        (dict(max_tokens=0), "--max-tokens"),
        (dict(seed=-3), "--seed"),
        (dict(stop=[""]), "--stop"),
    ],
)
def test_bad_params_are_named(kwargs, subject):
    with pytest.raises(TesseraError) as e:
        SamplingParams(**kwargs)
    assert e.value.subject == subject


def test_defaults_and_lists_become_tuples():
    p = SamplingParams(stop=["a"], stop_token_ids=[3])
    assert p.repetition_penalty == 1.0 and p.stop == ("a",) and p.stop_token_ids == (3,)
    assert SamplingParams(temperature=0).greedy and not p.greedy
    hash(p)


def logits_row(seed=0, v=50):
    return torch.randn(v, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_and_ignores_seed():
    x = logits_row()
    for seed in (1, 2, None):
        picked = sample(x, SamplingParams(temperature=0, seed=seed), torch.tensor([]), make_generator(seed))
        assert picked == int(x.argmax())


def test_repetition_penalty_equals_transformers():
    from transformers import RepetitionPenaltyLogitsProcessor

    x = logits_row(1)
    seen = torch.tensor([0, 3, 3, 7, 12, 40])
    theirs = RepetitionPenaltyLogitsProcessor(1.3)(seen[None], x[None].clone())[0]
    torch.testing.assert_close(apply_repetition_penalty(x, seen, 1.3), theirs)
    assert torch.equal(apply_repetition_penalty(x, seen, 1.0), x)


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_keeps_the_same_tokens_as_transformers(p):
    from transformers import TopPLogitsWarper

    x = logits_row(2)
    theirs = TopPLogitsWarper(p)(None, x[None].clone())[0]
    assert torch.equal(torch.isfinite(filter_top_p(x, p)), torch.isfinite(theirs))


def test_top_k_and_min_p():
    x = logits_row(3)
    kept = torch.isfinite(filter_top_k(x, 5))
    assert int(kept.sum()) == 5
    assert set(torch.nonzero(kept).flatten().tolist()) == set(torch.topk(x, 5).indices.tolist())
    probs = torch.softmax(x, -1)
    kept = torch.isfinite(filter_min_p(x, 0.2))
    assert torch.equal(kept, probs >= 0.2 * probs.max())
    assert torch.equal(filter_top_k(x, 0), x) and torch.equal(filter_min_p(x, 0.0), x)


def test_seeded_sampling_reproducible_and_distributed_like_softmax():
    x = torch.tensor([1.0, 2.0, 0.5, -1.0])
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=7)
    draw = lambda g: [sample(x, params, torch.tensor([]), g) for _ in range(4000)]  # noqa: E731
    a, b = draw(make_generator(7)), draw(make_generator(7))
    assert a == b
    freq = torch.bincount(torch.tensor(a), minlength=4).float() / len(a)
    assert torch.allclose(freq, torch.softmax(x, -1), atol=0.03)


def test_filters_narrow_the_choice():
    x = logits_row(4)
    g = make_generator(0)
    only_top = {sample(x, SamplingParams(temperature=2.0, top_k=1, seed=0), torch.tensor([]), g) for _ in range(50)}
    assert only_top == {int(x.argmax())}
    tiny_p = {sample(x, SamplingParams(temperature=2.0, top_k=0, top_p=1e-6), torch.tensor([]), g) for _ in range(50)}
    assert tiny_p == {int(x.argmax())}
    high_min_p = {sample(x, SamplingParams(temperature=1.0, top_k=0, top_p=1, min_p=0.99), torch.tensor([]), g)
                  for _ in range(50)}
    assert high_min_p == {int(x.argmax())}
