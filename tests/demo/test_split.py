"""The held-out split: evaluation problems are never drawn for training, in any wording, and are the same every run."""

from __future__ import annotations

import random

import pytest

from tessera.engine.demo.dataset import conversation
from tessera.engine.demo.skills import SKILLS
from tessera.engine.demo.split import HELDOUT_PERCENT, draw, eval_problems, is_heldout


def test_hash_split_is_stable_and_about_the_right_size():
    keys = [f"add:{a}+{b}" for a in range(10, 110) for b in range(10, 60)]
    share = 100 * sum(map(is_heldout, keys)) / len(keys)
    assert abs(share - HELDOUT_PERCENT) < 2
    # SHA-256 based: fixed across processes and machines (Python's hash() is salted per process).
    assert [is_heldout(k) for k in ("add:347+589", "sort:1,2,3", "count:r:strawberry")] == \
        [is_heldout(k) for k in ("add:347+589", "sort:1,2,3", "count:r:strawberry")]


@pytest.mark.parametrize("skill", list(SKILLS))
def test_eval_problems_are_heldout_distinct_and_fixed(skill):
    a = eval_problems(skill, 30)
    assert len(a) == 30 and len({p.key for p in a}) == 30
    assert all(is_heldout(p.key) for p in a)
    assert a == eval_problems(skill, 30)
    assert eval_problems(skill, 10) == a[:10]


def test_training_draws_are_never_heldout():
    rng = random.Random(3)
    for skill in SKILLS:
        for _ in range(300):
            assert not is_heldout(draw(skill, rng, heldout=False).key)


def test_no_eval_prompt_occurs_in_training_conversations():
    heldout_prompts = {p.prompt for s in SKILLS for p in eval_problems(s, 50)}
    rng = random.Random("train:1234")  # the training script's stream for its default seed
    for _ in range(3000):
        for m in conversation(rng):
            if m["role"] == "user":
                assert m["content"] not in heldout_prompts
