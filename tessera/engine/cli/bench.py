"""`tessera-cli bench MODEL`: prefill and decode speed on random prompt tokens (greedy, end-of-sequence ignored)."""

from __future__ import annotations

import json
import time

from tessera.engine.cli.run_options import (
    UsageError,
    add_load_arguments,
    check_load_arguments,
    close_session,
    load_session,
)

HELP = "measure prefill and decode tokens/s on a model"


def add_arguments(p) -> None:
    add_load_arguments(p)
    p.add_argument("--prompt-tokens", type=int, default=128, metavar="N", help="prompt length (default 128)")
    p.add_argument("--gen-tokens", type=int, default=32, metavar="N", help="tokens to generate (default 32)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the random prompt (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object with prefill_tok_s and decode_tok_s")


def run(args) -> int:
    try:
        check_load_arguments(args)
        if args.prompt_tokens < 1:
            raise UsageError("--prompt-tokens", f"must be >= 1, got {args.prompt_tokens}")
        if args.gen_tokens < 2:
            raise UsageError("--gen-tokens",
                             f"must be >= 2 (the first token belongs to prefill), got {args.gen_tokens}")
    except UsageError as e:
        return e.report()
    import torch

    from tessera.engine import readahead
    from tessera.engine.sampling import SamplingParams

    t0 = time.perf_counter()
    session = load_session(args)
    load_s = time.perf_counter() - t0
    try:
        vocab = session.config.vocab_size
        g = torch.Generator().manual_seed(args.seed)
        warm = torch.randint(0, vocab, (8,), generator=g).tolist()
        prompt = torch.randint(0, vocab, (args.prompt_tokens,), generator=g).tolist()
        for _ in session.generate(warm, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)):
            pass  # warm-up: first-call allocations and kernel set-up stay out of the figures
        session.reset_cache()
        params = SamplingParams(temperature=0, max_tokens=args.gen_tokens, ignore_eos=True)
        done = [e for e in session.generate(prompt, params) if hasattr(e, "metrics")][0]
        huge_share = readahead.huge_page_share(getattr(session, "mapped_files", []))
    finally:
        close_session(session)
    m = done.metrics
    result = {
        "prefill_tok_s": m.prefill_tok_s,
        "decode_tok_s": m.decode_tok_s,
        "prompt_tokens": m.prompt_tokens,
        "gen_tokens": m.generated_tokens,
        "ttft_s": m.ttft_s,
        "load_s": load_s,
        "backend": m.backend,
        "threads": torch.get_num_threads(),
        "expert_cache_hit_rate": m.expert_cache_hit_rate,  # None without a GPU expert cache (or its twin)
        # the model file's resident map on 2 MB pages (decode reads it faster; engine.readahead), None: not known
        "model_map_huge_share": huge_share,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"model    {args.model}")
        print(f"backend  {m.backend}, {result['threads']} threads, loaded in {load_s:.1f} s")
        print(f"prefill  {m.prompt_tokens} tokens in {m.prefill_s:.3f} s: {m.prefill_tok_s:.1f} tok/s")
        print(f"decode   {m.generated_tokens - 1} tokens in {m.decode_s:.3f} s: {m.decode_tok_s:.2f} tok/s")
        if huge_share is not None:
            print(f"pages    {100 * huge_share:.0f} % of the model file's resident map on 2 MB pages")
        if m.expert_cache_hit_rate is not None:
            print(f"experts  {100 * m.expert_cache_hit_rate:.1f} % of routed pairs served by the GPU expert cache")
    return 0
