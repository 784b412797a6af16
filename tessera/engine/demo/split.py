"""The held-out split: a problem belongs to the evaluation side when a hash of its key says so, on every machine.

Training draws only problems whose key hashes to the training side, evaluation only the others, so no evaluation prompt
(in any wording) is ever seen in training. The hash is SHA-256, not Python's salted `hash()`.
"""

from __future__ import annotations

import hashlib
import random

from tessera.engine.demo.skills import SKILLS, Problem

HELDOUT_PERCENT = 10


def is_heldout(key: str) -> bool:
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") % 100 < HELDOUT_PERCENT


def draw(skill: str, rng: random.Random, *, heldout: bool) -> Problem:
    """One problem of `skill` from the requested side of the split (rejection sampling; about 1 in 10 is held out)."""
    make = SKILLS[skill]
    for _ in range(10_000):
        problem = make(rng)
        if is_heldout(problem.key) == heldout:
            return problem
    raise RuntimeError(f"skill {skill}: no {'held-out' if heldout else 'training'} problem in 10000 draws")


def eval_problems(skill: str, n: int, *, seed: int = 0) -> list[Problem]:
    """The first `n` distinct held-out problems of `skill` for this seed: the same list on every run."""
    rng = random.Random(f"tessera-demo-eval:{skill}:{seed}")
    seen: set[str] = set()
    out: list[Problem] = []
    for _ in range(100 * n + 1000):
        if len(out) == n:
            break
        p = draw(skill, rng, heldout=True)
        if p.key not in seen:
            seen.add(p.key)
            out.append(p)
    return out
