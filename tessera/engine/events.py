"""Plain dataclasses the engine emits while it works; the CLI prints them, the GUI draws them. No Qt, no torch here."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenEvent:
    """One generated token. `text` is the newly complete UTF-8 text (may be "" while a multi-byte character is
    pending)."""

    token_id: int
    text: str
    index: int  # 0-based position among generated tokens
    t: float  # seconds since the request started


@dataclass(frozen=True)
class StepMetrics:
    """One forward step (prefill chunk or decode token), for live graphs."""

    phase: str  # "prefill" | "decode"
    tokens: int  # tokens processed in this step
    seconds: float
    expert_pairs: int = 0  # routed (token, expert) pairs in this step, all MoE layers
    expert_pairs_on_gpu: int = 0  # of those, served by the GPU (or twin) expert cache
    expert_bytes: int = 0  # expert weight bytes read by the CPU backend in this step


@dataclass
class RequestMetrics:
    """Summary of one generation request."""

    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    generated_tokens: int = 0
    ttft_s: float = 0.0  # time to first token
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prefill_tok_s: float = 0.0  # (prompt_tokens - reused_tokens) / prefill_s
    decode_tok_s: float = 0.0  # (generated_tokens - 1) / decode_s, the first token belongs to prefill
    prefix_hit_rate: float = 0.0  # reused_tokens / prompt_tokens
    expert_cache_hit_rate: float | None = None  # None when no GPU expert cache (or twin) is active
    stop_reason: str = ""  # "eos" | "stop_string" | "max_tokens" | "cancelled" | "context_full"
    backend: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class DoneEvent:
    """The last event of a request."""

    text: str  # the whole generated text
    token_ids: list[int] = field(default_factory=list)
    metrics: RequestMetrics = field(default_factory=RequestMetrics)


@dataclass(frozen=True)
class ProgressEvent:
    """Progress of a long operation (load, pack, convert, bandwidth probe)."""

    stage: str
    done: int
    total: int
    detail: str = ""
