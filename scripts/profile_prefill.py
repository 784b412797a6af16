"""Where one prefill's time goes, end to end on a real model file: routed experts vs dense projections vs attention vs
the rest, in seconds and shares of the prefill.

    python scripts/profile_prefill.py MODEL [--threads 2] [--prompt-tokens 512] [--context-length 4096] [--json]

Loads MODEL as `tessera-cli bench` does (default backend), warms up on 8 tokens, then prefills --prompt-tokens random
tokens once, timing (exclusive of each other, wall clock):
- experts: the expert backend's forward (engine.model.MoE minus its router);
- dense: every engine.dense.Linear and FusedLinears call (q/k/v/o projections, routers, lm_head; quantized files:
  quant_matmul, q/k/v in one quant_matmul_multi);
- attention: engine.model.Attention minus its projections (q/k norms, RoPE, KV-cache append, SDPA);
- other: the rest of the prefill (embedding, layer norms, residuals, sampling, Python).
Prints figures only.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tessera import engine
from tessera.engine import dense, model
from tessera.engine.sampling import SamplingParams

_spent: dict[str, float] = {"experts": 0.0, "dense": 0.0, "attention": 0.0}
_stack: list[list[float]] = []  # per open timed call: [start, time spent in timed calls inside it]


def _timed(name, fn):
    def wrapper(*args, **kwargs):
        _stack.append([time.perf_counter(), 0.0])
        try:
            return fn(*args, **kwargs)
        finally:
            start, inner = _stack.pop()
            total = time.perf_counter() - start
            _spent[name] += total - inner
            if _stack:
                _stack[-1][1] += total
    return wrapper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--context-length", type=int, default=4096)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()

    dense.Linear.__call__ = _timed("dense", dense.Linear.__call__)
    dense.FusedLinears.__call__ = _timed("dense", dense.FusedLinears.__call__)
    model.MoE.__call__ = _timed("experts", model.MoE.__call__)
    model.Attention.__call__ = _timed("attention", model.Attention.__call__)

    session = engine.load(a.model, threads=a.threads, context_length=a.context_length)
    try:
        vocab = session.config.vocab_size
        g = torch.Generator().manual_seed(0)
        warm = torch.randint(0, vocab, (8,), generator=g).tolist()
        prompt = torch.randint(0, vocab, (a.prompt_tokens,), generator=g).tolist()
        for _ in session.generate(warm, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)):
            pass
        session.reset_cache()
        for k in _spent:
            _spent[k] = 0.0
        params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        done = [e for e in session.generate(prompt, params) if hasattr(e, "metrics")][0]
    finally:
        session.close()
    m = done.metrics
    total = m.prefill_s
    parts = dict(_spent, other=total - sum(_spent.values()))
    result = {"prefill_s": total, "prefill_tok_s": m.prefill_tok_s, "prompt_tokens": m.prompt_tokens,
              "backend": m.backend, "seconds": parts, "share": {k: v / total for k, v in parts.items()}}
    if a.json:
        print(json.dumps(result))
        return
    print(f"prefill {m.prompt_tokens} tokens: {total:.2f} s, {m.prefill_tok_s:.1f} tok/s ({m.backend})")
    for k, v in parts.items():
        print(f"  {k:10s} {v:7.2f} s  {100 * v / total:5.1f} %")


if __name__ == "__main__":
    main()
