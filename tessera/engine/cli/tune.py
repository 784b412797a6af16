"""`tessera-cli tune`: measure the CPU-dependent kernel knobs on this machine (tessera/engine/calibrate.py) and store
them in the cache folder for this CPU and build (tessera/engine/tuned.py); every later load applies them."""

from __future__ import annotations

import argparse

HELP = "measure the kernel knobs that depend on this CPU (a few seconds) and store them for every later load"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tessera.engine.cli.bench_moe import SHAPES

    target = p.add_mutually_exclusive_group()
    target.add_argument("--model", metavar="PATH", help="tune on the layer shape of this GGUF file or HF folder")
    target.add_argument("--shape", choices=sorted(SHAPES), default=None,
                        help="tune on this layer shape (default qwen3-30b-a3b)")
    p.add_argument("--backend", default="Auto", help="expert backend whose knobs are measured (default Auto)")
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: physical cores)")
    p.add_argument("--seconds", type=float, default=3.0, help="timing budget, packing not included (default 3)")
    p.add_argument("--dir", default=None, help="tuning folder (default: TESSERA_TUNE_DIR, else the user cache folder)")
    p.add_argument("--show", action="store_true", help="print the stored record and the knobs in use; measure nothing")
    p.add_argument("--json", action="store_true", help="print the record as JSON")


def run(args: argparse.Namespace) -> int:
    import json

    from tessera.engine import calibrate, tuned
    from tessera.engine.errors import TesseraError

    if args.show:
        st = tuned.status(args.dir)
        print(json.dumps(st, indent=1) if args.json else "\n".join(tuned.describe(st)))
        return 0
    if args.seconds <= 0:
        raise TesseraError("--seconds", f"must be positive, got {args.seconds}")
    if args.threads is not None and args.threads < 1:
        raise TesseraError("--threads", f"must be at least 1, got {args.threads}")
    if args.model:
        from tessera.engine.hardware.verdict import model_shape

        cfg = model_shape(args.model, None)[0]
        E, H, I, k = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
        what = args.model
    else:
        from tessera.engine.cli.bench_moe import SHAPES

        what = args.shape or "qwen3-30b-a3b"
        E, H, I, k = SHAPES[what]
    say = (lambda _m: None) if args.json else (lambda m: print(m, flush=True))
    say(f"tune {what}: E={E} H={H} I={I} k={k}, backend {args.backend}, about {args.seconds:g} s of timing")
    record = calibrate.run(args.backend, E, H, I, k, threads=args.threads, seconds=args.seconds, progress=say)
    path = tuned.save(record, args.dir)
    if args.json:
        print(json.dumps(record))
    else:
        print(f"stored {path} ({record['seconds']:.1f} s); every later load on this CPU and build applies it")
    return 0
