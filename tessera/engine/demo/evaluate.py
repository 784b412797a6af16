"""Exact-match evaluation of the demo model on held-out problems, through Tessera's whole chat pipeline.

Each prompt goes through `Session.chat` exactly as the app sends it with thinking off (chat template, tokenizer,
prefill and greedy decode on the chosen expert backend, detokenization), and the reply must equal the problem's
canonical answer (surrounding whitespace aside). The problems come from the held-out side of the split, so none was
seen in training.

With `turns` > 1 the scored question is the last turn of a chat: it follows `turns - 1` earlier exchanges (held-out
problems of every skill, in a fixed order per problem, each answered with its canonical answer, as a chat in the app
whose earlier replies were right), so the score says whether the model still answers after a long conversation.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tessera.engine.demo.skills import SKILLS, Problem
from tessera.engine.demo.split import draw, eval_problems

# Longest canonical answer is ~100 tokens (a 4-column sum with a carry in every column); leave room to be wrong.
MAX_REPLY_TOKENS = 128


@dataclass
class SkillResult:
    correct: int = 0
    n: int = 0
    failures: list[tuple[Problem, str]] = field(default_factory=list)  # (problem, the reply given)

    @property
    def accuracy(self) -> float:
        return 100.0 * self.correct / self.n if self.n else 0.0


@dataclass
class EvalResult:
    backend: str
    skills: dict[str, SkillResult]
    seconds: float
    turns: int = 1

    @property
    def overall(self) -> float:
        n = sum(s.n for s in self.skills.values())
        return 100.0 * sum(s.correct for s in self.skills.values()) / n if n else 0.0

    def as_json(self) -> dict:
        """The shape `tessera-cli eval-demo --json` prints."""
        return {
            "skills": {k: {"accuracy": round(v.accuracy, 2), "n": v.n} for k, v in self.skills.items()},
            "overall": round(self.overall, 2),
            "backend": self.backend,
            "turns": self.turns,
        }


def earlier_problems(skill: str, index: int, count: int, *, seed: int = 0) -> list[tuple[str, Problem]]:
    """`count` (skill, problem) pairs to ask before the `index`-th scored problem of `skill`: held-out problems of the
    skills in turn, from a start that differs per problem. The same list on every run."""
    rng = random.Random(f"tessera-demo-eval-context:{skill}:{index}:{seed}")
    names = list(SKILLS)
    start = rng.randrange(len(names))
    picked = [names[(start + k) % len(names)] for k in range(count)]
    return [(name, draw(name, rng, heldout=True)) for name in picked]


def earlier_turns(skill: str, index: int, count: int, *, seed: int = 0) -> list[dict[str, str]]:
    """The chat before the `index`-th scored problem of `skill`: `count` exchanges of `earlier_problems`, each answered
    with its canonical answer."""
    messages: list[dict[str, str]] = []
    for _name, p in earlier_problems(skill, index, count, seed=seed):
        messages += [{"role": "user", "content": p.prompt}, {"role": "assistant", "content": p.answer}]
    return messages


def reply(session, prompt: str, *, history: list[dict[str, str]] | None = None,
          cancel: threading.Event | None = None) -> str:
    """The model's greedy reply to one user message (after `history`, earlier turns), thinking off, as the app would
    get it."""
    from tessera.engine.events import DoneEvent
    from tessera.engine.sampling import SamplingParams

    params = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, max_tokens=MAX_REPLY_TOKENS)
    text = ""
    messages = [*(history or []), {"role": "user", "content": prompt}]
    for event in session.chat(messages, params, enable_thinking=False, cancel=cancel):
        if isinstance(event, DoneEvent):
            text = event.text
    return text


def evaluate(
    session,
    n: int,
    *,
    skills: list[str] | None = None,
    seed: int = 0,
    turns: int = 1,
    problems: dict[str, list[Problem]] | None = None,
    on_problem: Callable[[str, Problem, str, bool], None] | None = None,
    cancel: threading.Event | None = None,
) -> EvalResult:
    """Run `n` held-out problems of each skill (all skills unless `skills` names some) through `session`, each as the
    last turn of a `turns`-turn chat. `problems` (skill -> problems) scores exactly those instead (a fixed set, such as
    the tests' cases for the shipped model); `n` and `skills` are then ignored."""
    if turns < 1:
        raise ValueError(f"turns must be >= 1, got {turns}")
    if problems is None:
        problems = {name: eval_problems(name, n, seed=seed) for name in (list(SKILLS) if skills is None else skills)}
    t0 = time.perf_counter()
    results: dict[str, SkillResult] = {}
    for name, todo in problems.items():
        res = results[name] = SkillResult()
        for i, p in enumerate(todo):
            history = earlier_turns(name, i, turns - 1, seed=seed)
            got = reply(session, p.prompt, history=history, cancel=cancel)
            ok = got.strip() == p.answer
            res.n += 1
            res.correct += ok
            if not ok:
                res.failures.append((p, got))
            if on_problem is not None:
                on_problem(name, p, got, ok)
    return EvalResult(session.backend_name, results, time.perf_counter() - t0, turns)
