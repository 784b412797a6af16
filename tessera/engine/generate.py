"""Prefill + decode loop: a generator of `TokenEvent`s ending with one `DoneEvent`.

Cancellation is checked before every forward step (so a request stops within one token); stop strings are found across
token boundaries, and text that could still become a stop string is held back until it cannot.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import torch

from tessera.engine.errors import Cancelled, ContextOverflowError, TesseraError
from tessera.engine.events import DoneEvent, RequestMetrics, StepMetrics, TokenEvent
from tessera.engine.finite import check_logits
from tessera.engine.kv_cache import KVCache
from tessera.engine.model import Qwen3MoeModel, RoutingStats
from tessera.engine.sampling import SamplingParams, make_generator, sample

# Prompt tokens per prefill forward step: the longest call the kernels see. Longer calls let each expert's weights
# serve more tokens per read (the quantized MoE on AMX tiles: a 4096-token prompt's experts 1.3x faster in 2048-token
# calls than in 512-token ones, docs/BENCHMARKS.md "Long prompts on AMX"); the per-CPU split of a call into passes is
# tessera/tuning.h quant_moe_chunk_tokens (measured by engine/calibrate.py at QUANT_PREFILL_T = this). Cancellation is
# checked between decoder layers (model.forward's `cancelled`), so a long step still stops within one layer. Memory:
# attention never holds a T x S score matrix (native kernels), the MoE's scratch grows ~T * k * I floats per pass.
PREFILL_CHUNK = 2048


class StopStrings:
    """Finds stop strings in streamed text; holds back a tail that is still a prefix of one of them."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.held = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """(text safe to show now, whether a stop string was reached; text from the stop string on is dropped)."""
        text = self.held + piece
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return text[: min(hits)], True
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:n]):
                    keep = n
                    break
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def flush(self) -> str:
        text, self.held = self.held, ""
        return text


def check_prompt(config, prompt_ids: list[int], context_length: int) -> None:
    """Named errors for a prompt that cannot be run: empty, too long for the context, ids outside the vocabulary."""
    if not prompt_ids:
        raise TesseraError("prompt", "is empty: give at least one token")
    if len(prompt_ids) >= context_length:
        raise ContextOverflowError(
            "prompt",
            f"{len(prompt_ids)} tokens do not fit in the context of {context_length} tokens with room for an answer "
            f"(shorten the prompt or load the model with a longer context)",
        )
    vocab = config.vocab_size
    bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise TesseraError("prompt", f"token id {bad} is outside the vocabulary (0..{vocab - 1})")


def generate(
    model: Qwen3MoeModel,
    cache: KVCache,  # holds the K/V of prompt_ids[:cache.length] (reused from the prefix cache), nothing else
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    decoder,  # streaming detokenizer: .add(token_id) -> str, .flush() -> str (never splits a UTF-8 character)
    eos_token_ids: tuple[int, ...] = (),
    context_length: int,
    cancel: threading.Event | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
    backend_name: str = "",
    bytes_per_expert: int = 0,
) -> Iterator[TokenEvent | DoneEvent]:
    check_prompt(model.config, prompt_ids, context_length)
    reused = cache.length
    assert cache.tokens == prompt_ids[:reused] and reused < len(prompt_ids)
    return _run(model, cache, prompt_ids, params, decoder, eos_token_ids, context_length, cancel, on_step,
                backend_name, bytes_per_expert)


def _run(model, cache, prompt_ids, params, decoder, eos_token_ids, context_length, cancel, on_step, backend_name,
         bytes_per_expert) -> Iterator[TokenEvent | DoneEvent]:
    t0 = time.perf_counter()
    m = RequestMetrics(prompt_tokens=len(prompt_ids), reused_tokens=cache.length, backend=backend_name)
    m.prefix_hit_rate = m.reused_tokens / m.prompt_tokens
    experts = model.experts
    has_cache = experts.take_step_stats() is not None  # the GPU expert cache (or its twin) reports hits; this call
    # also drops counts left from before this request
    pairs_total, pairs_on_device = 0, 0
    stop_ids = set() if params.ignore_eos else set(eos_token_ids)
    stop_ids |= set(params.stop_token_ids)
    stops = StopStrings(params.stop)
    cancelled = (lambda: cancel.is_set()) if cancel is not None else (lambda: False)
    history = list(prompt_ids[: cache.length])  # every token the model has seen in this request (NaN replay)

    def step(phase: str, ids: list[int]) -> torch.Tensor:
        nonlocal pairs_total, pairs_on_device
        stats = RoutingStats()
        ts = time.perf_counter()
        stop = cancelled if phase == "prefill" else None  # a decode step is one token: it finishes
        logits = model.forward(torch.tensor(ids, dtype=torch.long), cache, stats=stats, cancelled=stop)  # [1, V]
        history.extend(ids)
        check_logits(logits, model, history)  # NaN/Inf: a named error saying which tensor or layer, never a token
        seconds = time.perf_counter() - ts
        on_gpu = experts.take_step_stats()[1] if has_cache else 0
        pairs_total, pairs_on_device = pairs_total + stats.pairs, pairs_on_device + on_gpu
        if on_step is not None:
            on_step(StepMetrics(phase, len(ids), seconds, stats.pairs, on_gpu, stats.experts_hit() * bytes_per_expert))
        return logits[0]  # [V]

    def done(reason: str, text: str, ids: list[int]) -> DoneEvent:
        m.stop_reason = reason
        m.generated_tokens = len(ids)
        if has_cache:
            m.expert_cache_hit_rate = pairs_on_device / pairs_total if pairs_total else 0.0
        if m.prefill_s > 0:
            m.prefill_tok_s = (m.prompt_tokens - m.reused_tokens) / m.prefill_s
        if ids:
            m.decode_s = time.perf_counter() - t0 - m.ttft_s
            m.decode_tok_s = (len(ids) - 1) / m.decode_s if len(ids) > 1 and m.decode_s > 0 else 0.0
        return DoneEvent(text, list(ids), m)

    todo = prompt_ids[cache.length :]
    logits = None
    for i in range(0, len(todo), PREFILL_CHUNK):
        try:
            if cancelled():
                raise Cancelled("generation cancelled")
            logits = step("prefill", todo[i : i + PREFILL_CHUNK])
        except Cancelled:  # before this step or between two of its layers: the cache holds the steps before it
            m.prefill_s = time.perf_counter() - t0
            yield done("cancelled", "", [])
            return
    m.prefill_s = time.perf_counter() - t0

    generator = make_generator(params.seed)
    seen = torch.tensor(prompt_ids, dtype=torch.long)  # [n] ids the repetition penalty looks at (prompt + generated)
    out_ids: list[int] = []
    text_parts: list[str] = []
    while True:
        token = sample(logits, params, seen, generator, generated=len(out_ids))
        now = time.perf_counter() - t0
        if not out_ids:
            m.ttft_s = now
        out_ids.append(token)
        seen = torch.cat([seen, torch.tensor([token])])  # [n+1]
        if token in stop_ids:
            reason, piece, hit = "eos", "", False
        else:
            piece, hit = stops.feed(decoder.add(token))
            reason = "stop_string" if hit else ""
        if not reason and len(out_ids) >= params.max_tokens:
            reason = "max_tokens"
        if not reason and len(prompt_ids) + len(out_ids) >= context_length:
            reason = "context_full"
        if reason and not hit:
            piece += stops.feed(decoder.flush())[0] + stops.flush()
        text_parts.append(piece)
        yield TokenEvent(token, piece, len(out_ids) - 1, now)
        if reason:
            yield done(reason, "".join(text_parts), out_ids)
            return
        if cancelled():  # checked after the consumer saw the token: no further token is computed
            yield done("cancelled", "".join(text_parts), out_ids)
            return
        logits = step("decode", [token])
