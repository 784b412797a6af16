"""`tessera-cli eval-demo [MODEL] [--backend B] [--n N] [--turns T] [--json]`: the demo model's exact-match accuracy
per skill on held-out generated prompts, greedy, through the full chat pipeline (template, tokenizer, generation,
detokenization)."""

from __future__ import annotations

import json
import sys

from tessera.engine import backends

HELP = "score the built-in demo model (or MODEL) on held-out arithmetic, letter, list and Tessera questions"
DEFAULT_N = 12


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="a .gguf file or HF folder (default: the demo model in tessera/resources/demo/)")
    p.add_argument("--backend", default="Auto", choices=backends.names(), metavar="NAME",
                   help=f"expert backend: {', '.join(backends.names())} (default Auto)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads (default: PyTorch's choice)")
    p.add_argument("--n", type=int, default=DEFAULT_N, metavar="N",
                   help=f"held-out prompts per skill (default {DEFAULT_N}; the same prompts on every run)")
    p.add_argument("--skill", action="append", default=None, metavar="NAME",
                   help="only this skill (repeatable): addition, subtraction, count_letters, reverse_list, "
                        "sort_list, tessera")
    p.add_argument("--turns", type=int, default=1, metavar="T",
                   help="score each question as the last turn of a T-turn chat (earlier turns: other held-out "
                        "problems with right answers; default 1)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="which held-out prompts (default 0)")
    p.add_argument("--show-failures", action="store_true", help="print each wrong reply with the expected one")
    p.add_argument("--json", action="store_true",
                   help='print {"skills": {NAME: {"accuracy": percent, "n": int}}, "overall": percent, '
                        '"backend": NAME, "turns": T}')


def run(args) -> int:
    from tessera.engine.demo import DEMO_GGUF
    from tessera.engine.demo.skills import SKILLS
    from tessera.engine.errors import TesseraError

    if args.n < 1:
        print(f"error: --n: must be >= 1, got {args.n}", file=sys.stderr)
        return 2
    if args.turns < 1:
        print(f"error: --turns: must be >= 1, got {args.turns}", file=sys.stderr)
        return 2
    if args.threads is not None and args.threads < 1:
        print(f"error: --threads: must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    for name in args.skill or []:
        if name not in SKILLS:
            print(f"error: --skill: unknown skill {name!r}; choose from {', '.join(SKILLS)}", file=sys.stderr)
            return 2
    model = args.model or DEMO_GGUF
    if args.model is None and not DEMO_GGUF.is_file():
        raise TesseraError(str(DEMO_GGUF), "the demo model is missing; retrain it with `python scripts/train_demo.py`")

    from tessera import engine
    from tessera.engine.cli.run_options import close_session
    from tessera.engine.demo.evaluate import evaluate

    session = engine.load(model, backend=args.backend, threads=args.threads)
    try:
        result = evaluate(session, args.n, skills=args.skill, seed=args.seed, turns=args.turns)
    finally:
        close_session(session)
    if args.json:
        print(json.dumps(result.as_json()))
        return 0
    chat = f"  as turn {args.turns} of a chat" if args.turns > 1 else ""
    print(f"model {model}  backend {result.backend}  {args.n} held-out prompts per skill{chat}  "
          f"{result.seconds:.1f} s")
    for name, res in result.skills.items():
        print(f"  {name:<14} {res.accuracy:6.1f} %  ({res.correct}/{res.n})")
        if args.show_failures:
            for p, got in res.failures:
                print(f"      prompt:   {p.prompt}\n      expected: {p.answer}\n      got:      {got.strip()}")
    print(f"  {'overall':<14} {result.overall:6.1f} %")
    return 0
