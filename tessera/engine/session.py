"""A loaded model ready to generate: weights, tokenizer, the expert backend and the prefix cache, behind one object.

`load(path)` reads a GGUF file or a Hugging Face folder; `Session.generate` takes raw token ids, `Session.chat` renders
the chat template first. Both reuse the K/V of the longest cached token prefix. One request at a time per session.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from tessera.engine import dense, heap, native, pack_store, preload, readahead
from tessera.engine.chat_tokens import ChatPrompt
from tessera.engine.errors import Cancelled, NotEnoughMemoryError, TesseraError
from tessera.engine.events import DoneEvent, ProgressEvent, StepMetrics, TokenEvent
from tessera.engine.generate import check_prompt, generate
from tessera.engine.hybrid import PlacementArg, build, resolve_plan, uses_expert_cache
from tessera.engine.kv_cache import KVCache, PrefixCache
from tessera.engine.model import Qwen3MoeModel, layer_experts
from tessera.engine.sampling import SamplingParams

Progress = Callable[[ProgressEvent], None] | None


def load(
    path: str | os.PathLike,
    *,
    backend: str = "Auto",
    threads: int | None = None,
    context_length: int | None = None,
    kv_cache_type: str = "bf16",
    progress: Progress = None,
    cancel: threading.Event | None = None,
    prefix_cache_bytes: int | None = None,
    placement: PlacementArg = None,
    twin: bool = False,
) -> Session:
    """Load a Qwen3-MoE GGUF file or HF folder. Raises TesseraError subclasses for bad files or settings, Cancelled.

    placement: None (everything on the CPU), a rules file, a PlacementPlan or PlacementSettings (engine.hybrid);
    twin: run the plan's GPU half on the CPU with the same code path (the CPU twin).
    kv_cache_type: "bf16" (default) or "q8_0" (int8 K/V with an f16 scale per 32 values: engine.kv_q8; CPU layers only).
    """
    from tessera.engine.model_info import inspect_model
    from tessera.engine.tokenizer import Tokenizer
    from tessera.engine.weights import load_weights, open_model

    path = Path(path)
    heap.keep_freed_blocks()  # a prefill's per-layer temporaries reused, not faulted in again (engine.heap)
    pre = preload.take(path)  # the torch-free part of this load, begun before `import torch` (engine.preload)
    try:
        _check_kv_cache_type(kv_cache_type)
        if threads is not None:
            if threads < 1:
                raise TesseraError("--threads", f"must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        model = open_model(path, gguf=None if pre is None else pre.model())  # every header read once, here
    except BaseException:
        if pre is not None:
            pre.release(close_model=True)
        raise
    # The preload's thread does the pages when it opened this very file for this backend; it is waited for at the end.
    pages_early = pre is not None and model.gguf is not None and pre.opened(model.gguf) and pre.backend == backend
    if pre is not None and not pages_early:
        pre.release(close_model=True)
        pre = None
    ahead = None if pages_early else _pages(model, backend, cancel)
    try:
        info = inspect_model(model, kv_cache_type=kv_cache_type)
        weights = load_weights(model, progress=progress, cancel=cancel)
        _check_cancel(cancel)
        tokenizer = Tokenizer.from_model(model)
        _check_cancel(cancel)
        session = Session(path, weights, tokenizer, info, backend=backend, threads=threads,
                          context_length=context_length, progress=progress, prefix_cache_bytes=prefix_cache_bytes,
                          placement=placement, twin=twin, kv_cache_type=kv_cache_type)
        if pre is not None:  # its populate done before the first forward; its read-ahead the session's
            pre.wait()
            ahead = pre.ahead if pre.pages_done else _pages(model, backend, cancel)
    except BaseException:
        if pre is not None:
            pre.release(close_model=True)
        if ahead is not None:
            ahead.stop()
        raise
    if pre is not None:
        pre.release()
    session.readahead = ahead
    session.mapped_files = [] if model.gguf is None else [str(part.path) for part in model.gguf.files]
    heap.give_back()  # what loading freed (unpacked tensors, conversions) leaves the heap now, not at the first reply
    return session


def _pages(model, backend: str, cancel: threading.Event | None) -> readahead.ReadAhead | None:
    """A GGUF file (nearly) all in the page cache: its pages into the map the weights are views of, now (CPU only,
    ~0.07 s a GB: cheaper than the page faults decode would take on first touches; a nice-19 thread doing it beside
    the first forward slowed decode on 2 cores). Otherwise the file into the page cache on a thread, in file order,
    while the loader and the first forward walk it (returned: the session stops it when closed). Only the parts the
    model reads through the map: not the routed experts a native backend packs (readahead.read_in_place)."""
    if model.gguf is None:
        return None
    maps = [part.mapping for part in model.gguf.files]
    ranges = readahead.read_in_place(model.gguf, backend)
    if readahead.resident_fraction(maps, ranges) >= readahead.POPULATE_WHEN_CACHED:
        readahead.populate(maps, cancel, ranges)
        return None
    return readahead.start((part.path for part in model.gguf.files), ranges)


def _check_kv_cache_type(name: str) -> None:
    from tessera.engine.kv_cache import KV_DTYPES

    if name not in KV_DTYPES:
        raise TesseraError("--kv-cache-type", f"{name!r} is not one of {', '.join(KV_DTYPES)}")


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled()


def _default_prefix_cache_bytes() -> int:
    import psutil

    return int(min(4 << 30, 0.15 * psutil.virtual_memory().total))


def model_id(path: Path) -> str:
    """How the packed-weight cache names a model (`tessera-cli cache list`): its absolute path. The cache keys layers by
    their content, so a file replaced under the same name is never served stale bytes."""
    return str(path.resolve())


class Session:
    """A loaded model. Attributes: config, info, tokenizer, backend_name, backend_reason, context_length."""

    def __init__(self, path: Path, weights, tokenizer, info, *, backend: str = "Auto", threads: int | None = None,
                 context_length: int | None = None, progress: Progress = None, prefix_cache_bytes: int | None = None,
                 placement: PlacementArg = None, twin: bool = False, kv_cache_type: str = "bf16"):
        from tessera.engine.kv_cache import KV_DTYPES

        _check_kv_cache_type(kv_cache_type)
        if kv_cache_type == "q8_0" and weights.config.head_dim % 32:
            raise TesseraError("--kv-cache-type", f"q8_0 needs a head dim that is a multiple of 32; this model's is "
                                                  f"{weights.config.head_dim} (use bf16)")
        self.kv_cache_type = kv_cache_type
        self.path, self.config, self.tokenizer, self.info, self.threads = path, weights.config, tokenizer, info, threads
        limit = self.config.max_position_embeddings
        if context_length is not None and context_length < 2:
            raise TesseraError("--context-length", f"must be 2 or more, got {context_length}")
        self.context_length = min(context_length or limit, limit)  # a wish: at most the model's trained context
        self._model_key = model_id(path)
        # Where each part runs (CPU only unless a rules file or settings put parts on a GPU or its CPU twin).
        self.placement = resolve_plan(placement, self.config, backend=backend, twin=twin)
        self._layers = layer_experts(self.config, weights.tensors)
        self._sources = weights.sources  # the mapped file parts, for engine.source_digest
        first = next(iter(self._layers.values()), None)
        self.bytes_per_expert = 0 if first is None else sum(  # as stored: quantized experts are read as blocks
            t.nbytes // t.shape[0] for t in (first.gate_proj, first.up_proj, first.down_proj))
        parts = build(self.placement, self._layers, self.config, threads=threads, model_id=self._model_key,
                      progress=progress, sources=self._sources)
        self.backend_name, self.backend_reason = parts.backend_name, parts.backend_reason
        dense.set_quant_isa(native.quant_isa_for_dense(self.backend_name))  # the dense blocks follow the backend
        if progress is not None:
            progress(ProgressEvent("prepare", 0, 1, "non-expert weights"))
        self.model = Qwen3MoeModel(weights, parts.experts, parts.devices, kv_dtype=KV_DTYPES[kv_cache_type])
        gpu = sorted({str(b.device) for b in self.model.layers if b.device.type != "cpu"})
        if kv_cache_type == "q8_0" and gpu:  # the torch path could dequantize there, but nothing has tested it
            raise TesseraError("--kv-cache-type", f"q8_0 runs attention on the CPU only; this placement puts layers on "
                                                  f"{', '.join(gpu)} (use bf16 there)")
        self.model.source_experts = self._layers  # engine.finite names a damaged expert tensor from these
        if progress is not None:
            progress(ProgressEvent("prepare", 1, 1, ""))
        self.prefix_cache = PrefixCache(self._new_cache, prefix_cache_bytes or _default_prefix_cache_bytes())
        self._busy = threading.Lock()
        self.readahead: readahead.ReadAhead | None = None  # load() sets it: the file's read-ahead, stopped by close()
        self.mapped_files: list[str] = []  # load() sets it: the files the weights are views of (bench)

    def _new_cache(self, capacity: int) -> KVCache:
        return self.model.new_cache(capacity)

    def set_backend(self, name: str, progress: Progress = None) -> None:
        """Switch the expert backend (repacks the experts); the KV and prefix caches are kept. On error the old one
        stays."""
        if self.model is None:
            raise TesseraError("session", "is closed")
        if not self._busy.acquire(blocking=False):
            raise TesseraError("session", "is generating; switch the backend when the answer is done")
        try:
            plan = dataclasses.replace(self.placement, experts_backend=name)
            try:
                parts = build(plan, self._layers, self.config, threads=self.threads, model_id=self._model_key,
                              progress=progress, sources=self._sources)
            except NotEnoughMemoryError as e:  # the backend in use is part of what is not free
                raise NotEnoughMemoryError(e.subject, f"{e.message}; the backend in use ({self.backend_name}) stays "
                                           f"loaded: load the model again with {name} to pack it alone",
                                           e.shortfall) from None
            old = self.model.experts
            self.model.set_experts(parts.experts)
            self.placement.experts_backend = parts.backend_name
            self.backend_name, self.backend_reason = parts.backend_name, parts.backend_reason
            dense.set_quant_isa(native.quant_isa_for_dense(self.backend_name))
            old.close(finish_writes=False)  # its packs still being saved go on behind (engine.pack_store)
        finally:
            self._busy.release()

    def warm_expert_cache(self, prompts: list[str], cancel: threading.Event | None = None) -> dict[int, list[int]]:
        """Pick the hot experts from routing on the user's own recent prompts (prefill only, into a throwaway KV cache),
        then make the most-used ones resident. Returns {layer: resident experts}; {} when no expert cache is in use."""
        cache_backend = self.model.experts
        if not uses_expert_cache(self.placement) or not self._layers or not prompts:
            return {}
        with self._busy:
            for text in prompts:
                _check_cancel(cancel)
                ids = self.tokenizer.encode(text)[: self.context_length - 1]
                if ids:
                    self.model.forward(torch.tensor(ids), self.model.new_cache(len(ids)))
            cache_backend.take_step_stats()  # warm-up traffic is not part of any request's hit rate
            return cache_backend.rebalance()

    @property
    def device(self) -> str:
        """Where the dense parts run, for status bars: "cpu", "cuda:0", or "cuda (CPU twin)"."""
        return "cpu (twin of the GPU half)" if self.placement.twin else self.placement.accelerator

    def explain(self) -> str:
        """The placement plan as a table: where each part runs, the CPU backend and the hot-expert cache."""
        text = self.placement.explain(self.config.num_experts)
        return text + f"\n  CPU backend chosen: {self.backend_name} ({self.backend_reason})"

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        cancel: threading.Event | None = None,
        on_step: Callable[[StepMetrics], None] | None = None,
    ) -> Iterator[TokenEvent | DoneEvent]:
        """Stream the continuation of raw token ids. Errors in the request (empty prompt, too long) raise at once."""
        if self.model is None:
            raise TesseraError("session", "is closed")
        prompt_ids = [int(t) for t in prompt_ids]
        check_prompt(self.config, prompt_ids, self.context_length)
        return self._stream(prompt_ids, params, cancel, on_step)

    def _stream(self, prompt_ids, params, cancel, on_step) -> Iterator[TokenEvent | DoneEvent]:
        if not self._busy.acquire(blocking=False):
            raise TesseraError("session", "is already generating; one request at a time")
        try:
            cache, _ = self.prefix_cache.acquire(prompt_ids)
            try:
                with pack_store.generating():  # a first load's pack-cache writes wait meanwhile (engine.pack_store)
                    yield from generate(
                        self.model, cache, prompt_ids, params, decoder=self.tokenizer.stream_decoder(),
                        eos_token_ids=tuple(self.tokenizer.eos_token_ids), context_length=self.context_length,
                        cancel=cancel, on_step=on_step, backend_name=self.backend_name,
                        bytes_per_expert=self.bytes_per_expert)
            finally:
                self.prefix_cache.release(cache)
        finally:
            heap.give_back()  # the request's kept temporaries back to the OS (engine.heap)
            self._busy.release()

    def chat(self, messages: list[dict], params: SamplingParams, *, enable_thinking: bool = True,
             tools: list[dict] | None = None, cancel: threading.Event | None = None,
             on_step: Callable[[StepMetrics], None] | None = None,
             allow_special_tokens: bool = False) -> Iterator[TokenEvent | DoneEvent]:
        """Render the chat template for `messages` (role system|user|assistant|tool, content) and stream the answer.
        tools: OpenAI-style function definitions, rendered by the model's template (Qwen3: a <tools> system block).
        User, system and tool content is tokenized without special tokens (a pasted `<|im_start|>` stays text and
        cannot forge a turn) unless allow_special_tokens (tessera/engine/chat_tokens.py)."""
        prompt = self.prepare_chat(messages, enable_thinking=enable_thinking, tools=tools,
                                   allow_special_tokens=allow_special_tokens)
        return self.generate(prompt.ids, params, cancel=cancel, on_step=on_step)

    def prepare_chat(self, messages: list[dict], *, enable_thinking: bool = True, tools: list[dict] | None = None,
                     allow_special_tokens: bool = False) -> ChatPrompt:
        """The chat template rendered once and tokenized as `chat` does it: the prompt text and its ids. For callers
        that need both (the server reads the text for an open <think>, then runs `generate(prompt.ids, ...)`)."""
        from tessera.engine.chat_tokens import prepare_chat

        return prepare_chat(self.tokenizer, lambda msgs: self.render_chat(msgs, enable_thinking=enable_thinking,
                                                                          tools=tools),
                            messages, allow_special_tokens=allow_special_tokens)

    def render_chat(self, messages: list[dict], *, enable_thinking: bool = True,
                    tools: list[dict] | None = None) -> str:
        from tessera.engine.chat_template import ChatTemplate

        if not messages:
            raise TesseraError("messages", "is empty: give at least one message")
        for i, m in enumerate(messages):
            if m.get("role") not in ("system", "user", "assistant", "tool") or not isinstance(m.get("content"), str):
                raise TesseraError(f"messages[{i}]",
                                   "needs a role of system, user, assistant or tool and a string content")
        extra = {"tools": tools} if tools else {}  # assistant messages may carry OpenAI-style tool_calls too
        return ChatTemplate.of(self.tokenizer).render(messages, add_generation_prompt=True,
                                                       enable_thinking=enable_thinking, **extra)

    def reset_cache(self) -> None:
        """Forget every cached prefix (benchmarks use this to measure a cold prefill)."""
        self.prefix_cache.clear()

    def close(self) -> None:
        if self.readahead is not None:
            self.readahead.stop()
        if self.model is not None:
            self.model.experts.close()
        self.model = None
        self.prefix_cache.clear()
        self._layers = {}
        heap.give_back()
