"""The dataclasses that travel on the worker's signals. Plain data (numbers, strings, dicts): views read these and
never the engine's own objects, so nothing here imports torch or the engine."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoadProgress:
    """A step of a long operation: operation is "load", "repack", "inspect" or "make"."""

    operation: str
    stage: str
    done: int
    total: int
    detail: str = ""

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total > 0 else 0.0


@dataclass(frozen=True)
class ModelState:
    """What is loaded now (loaded=False after unload or a failed load)."""

    loaded: bool
    path: str = ""
    name: str = ""
    backend: str = ""
    backend_reason: str = ""
    device: str = "cpu"
    threads: int = 0
    context_length: int = 0
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StepSample:
    """One forward step of a generation (prefill chunk or decode token)."""

    phase: str
    tokens: int
    seconds: float
    expert_pairs: int = 0
    expert_pairs_on_gpu: int = 0
    expert_bytes: int = 0


@dataclass(frozen=True)
class TokenChunk:
    """Newly generated text of a request, batched by the worker (several tokens per chunk when they come fast)."""

    request_id: int
    text: str
    tokens: int  # tokens in this chunk
    total_tokens: int  # tokens generated so far
    t: float  # seconds since the request started, at the last token of the chunk
    steps: tuple[StepSample, ...] = ()


@dataclass(frozen=True)
class GenerationResult:
    """The end of a request. metrics mirrors the engine's RequestMetrics as a dict (stop_reason, tok/s, TTFT, ...)."""

    request_id: int
    text: str
    metrics: dict
    error: str = ""  # set when the request failed (the failure also arrives on `failed`)


@dataclass(frozen=True)
class WorkerError:
    """A failure of a worker operation, in words a user can act on."""

    operation: str  # "load", "generate", "backend", "inspect", "make", "unload"
    subject: str
    message: str
    detail: str = ""  # traceback text for unexpected errors; "" for user-fixable ones
    cancelled: bool = False  # the user cancelled the operation: not an error to put in a dialog

    @property
    def text(self) -> str:
        return f"{self.subject}: {self.message}" if self.subject else self.message


@dataclass(frozen=True)
class ModelSummary:
    """Header-only facts about a model file or folder (the model panel shows these before loading)."""

    path: str
    info: dict


@dataclass(frozen=True)
class BackendList:
    """Every backend name with (available, reason); the settings dialog disables the unavailable ones."""

    status: dict  # name -> (available: bool, reason: str)
    auto_choice: str = ""
    auto_reason: str = ""
    device: str = "cpu"  # "cuda:0 (NVIDIA ...)" when a GPU is usable
    vram_free_bytes: int = 0
    vram_total_bytes: int = 0
    cuda_reason: str = ""  # why there is no usable CUDA device ("" when there is one)


@dataclass(frozen=True)
class PackCacheInfo:
    """The packed-weight cache as the settings dialog shows it (the worker's `pack_cache` signal)."""

    folder: str
    held_bytes: int = 0
    text: str = ""  # "12.34 GB" (engine.pack_cache.human_bytes), or why the size is unknown
    freed_bytes: int = -1  # bytes a Clear removed; -1 when this is only the size
    freed_text: str = ""
    error: str = ""
    budget_text: str = ""  # the most it keeps, "12.3 GB" ("" when unknown); older models are evicted beyond it
    budget_why: str = ""  # where the budget comes from (disk share, 2 x the largest model, TESSERA_PACK_CACHE_BUDGET)
