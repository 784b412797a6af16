"""Sampling parameters and pure functions from logits to the next token.

Order as transformers applies them: repetition penalty, then temperature, top-k, top-p, min-p. Temperature 0 is greedy.
OpenAI's presence and frequency penalties (for the server) apply right after the repetition penalty, to
generated tokens.
Letters: V vocabulary size, n tokens seen so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from tessera.engine.errors import TesseraError


@dataclass(frozen=True)
class SamplingParams:
    """What to sample and when to stop. Defaults are Tessera's own (Qwen3's recommended thinking-mode values), never
    read from a model's generation_config.json. top_k 0 and top_p 1 and min_p 0 disable those filters."""

    temperature: float = 0.6
    top_k: int = 20
    top_p: float = 0.95
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = field(default_factory=tuple)  # stop strings (not included in the output text)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)  # in addition to the tokenizer's end-of-sequence ids
    ignore_eos: bool = False  # keep going past end-of-sequence tokens (benchmarks)
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from the logit of every token generated so far
    frequency_penalty: float = 0.0  # OpenAI's: subtracted per occurrence of a token generated so far

    def __post_init__(self):
        # Accept lists from callers, keep the dataclass hashable and immutable.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        self.validate()

    def validate(self) -> None:
        def bad(flag: str, msg: str):
            raise TesseraError(flag, msg)

        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            bad("--temperature", f"must be a number >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k < 0:
            bad("--top-k", f"must be >= 0 (0 disables it), got {self.top_k}")
        if not (0 < self.top_p <= 1):
            bad("--top-p", f"must be in (0, 1], got {self.top_p}")
        if not (0 <= self.min_p < 1):
            bad("--min-p", f"must be in [0, 1), got {self.min_p}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            bad("--repetition-penalty", f"must be > 0 (1 disables it), got {self.repetition_penalty}")
        for flag, value in (("--presence-penalty", self.presence_penalty),
                            ("--frequency-penalty", self.frequency_penalty)):
            if not (math.isfinite(value) and -2 <= value <= 2):
                bad(flag, f"must be in [-2, 2] (0 disables it), got {value}")
        if self.max_tokens < 1:
            bad("--max-tokens", f"must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not (0 <= self.seed < 2**63):
            bad("--seed", f"must be in [0, 2^63), got {self.seed}")
        if any(not s for s in self.stop):
            bad("--stop", "stop strings must not be empty")
        if any(t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "token ids must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style, as transformers: a seen token's logit is divided by `penalty` when positive, multiplied when
    negative."""
    if penalty == 1.0 or seen.numel() == 0:
        return logits
    out = logits.clone()  # [V]
    picked = out[seen]  # [n]
    out[seen] = torch.where(picked > 0, picked / penalty, picked * penalty)  # [n]
    return out


def apply_presence_frequency(logits: torch.Tensor, generated: torch.Tensor, presence: float,
                             frequency: float) -> torch.Tensor:
    """OpenAI's penalties: logit -= frequency * count + presence * (count > 0), counting generated tokens only."""
    if (presence == 0 and frequency == 0) or generated.numel() == 0:
        return logits
    counts = torch.bincount(generated, minlength=logits.shape[-1]).to(logits.dtype)  # [V]
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)  # [V]


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k).values[-1]  # scalar
    return logits.masked_fill(logits < kth, -math.inf)  # [V]


def filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches p (always at least one)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)  # [V], [V]
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)  # [V]
    drop_sorted = cum - torch.softmax(sorted_logits, dim=-1) >= p  # [V] mass before this token already reached p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)  # [V]
    return logits.masked_fill(drop, -math.inf)


def filter_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the top token's."""
    if min_p <= 0:
        return logits
    probs = torch.softmax(logits, dim=-1)  # [V]
    return logits.masked_fill(probs < min_p * probs.max(), -math.inf)


def make_generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def sample(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor, generator: torch.Generator,
           generated: int = 0) -> int:
    """The next token id from the last position's logits [V] (float32), the ids seen so far [n] (prompt, then the
    `generated` ids sampled so far) and a seeded generator. NaN logits, or none finite, are a named error."""
    if bool(torch.isnan(logits).any()) or not bool(torch.isfinite(logits).any()):
        raise TesseraError("logits", "are NaN or Inf: the model's output cannot be sampled (damaged weights?)")
    logits = apply_repetition_penalty(logits, seen, params.repetition_penalty)  # [V]
    if generated:
        logits = apply_presence_frequency(logits, seen[seen.numel() - generated :], params.presence_penalty,
                                          params.frequency_penalty)  # [V]
    if params.greedy:
        return int(torch.argmax(logits))
    logits = logits / params.temperature  # [V]
    logits = filter_top_k(logits, params.top_k)
    logits = filter_top_p(logits, params.top_p)
    logits = filter_min_p(logits, params.min_p)
    probs = torch.softmax(logits, dim=-1)  # [V]
    return int(torch.multinomial(probs, 1, generator=generator))
