"""OpenAI's presence and frequency penalties (used by the server): formula, generated tokens only, validation."""

from __future__ import annotations

import pytest
import torch

from tessera.engine.errors import TesseraError
from tessera.engine.sampling import SamplingParams, apply_presence_frequency, make_generator, sample


def test_formula_counts_each_occurrence_for_frequency_and_once_for_presence():
    logits = torch.zeros(5)
    generated = torch.tensor([1, 1, 3])
    out = apply_presence_frequency(logits, generated, presence=0.5, frequency=0.25)
    assert out.tolist() == [0.0, -(2 * 0.25 + 0.5), 0.0, -(0.25 + 0.5), 0.0]


def test_prompt_tokens_are_not_penalized():
    # Token 2 leads by a little; it appears in the prompt only, so a big presence penalty must not touch it.
    logits = torch.tensor([0.0, 0.0, 1.0, 0.5])
    seen = torch.tensor([2, 2, 2, 3])  # prompt [2, 2, 2] + one generated token 3
    params = SamplingParams(temperature=0, presence_penalty=2.0)
    assert sample(logits, params, seen, make_generator(0), generated=1) == 2
    # Once 2 has been generated, the penalty moves greedy decoding to the next best token.
    seen = torch.tensor([3, 2])
    assert sample(logits, params, seen, make_generator(0), generated=1) == 3


@pytest.mark.parametrize("field,flag", [("presence_penalty", "--presence-penalty"),
                                        ("frequency_penalty", "--frequency-penalty")])
def test_out_of_range_is_named(field, flag):
    with pytest.raises(TesseraError) as e:
        SamplingParams(**{field: 2.5})
    assert e.value.subject == flag
