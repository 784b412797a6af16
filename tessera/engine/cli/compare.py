"""`tessera-cli compare A B`: teacher-force the same text through two models and report how far their logits differ."""

from __future__ import annotations

import argparse

HELP = "compare two models' logits on the same text (max logit diff, top-1 agreement, mean KL)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tessera.engine import backends

    names = backends.names()
    p.add_argument("a", metavar="A", help="reference model (GGUF file or HF folder); its tokenizer is used")
    p.add_argument("b", metavar="B", help="model to compare (GGUF file or HF folder)")
    p.add_argument("--text", default=None, help="text to teacher-force (default: a built-in sample)")
    p.add_argument("--backend", default="Auto", metavar="NAME",
                   help=f"expert backend both models run with: {', '.join(names)} (default Auto: the one chat and "
                        "the app pick on this CPU, so the comparison judges the kernels a user runs; Torch is the "
                        "pure-PyTorch engine; the emulated AMX test backends are accepted too)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    import json

    from tessera.engine import backends
    from tessera.engine.compare import compare, format_report

    backends.resolve(args.backend)  # an unknown or unavailable name is a named error before any model is read
    report = compare(args.a, args.b, text=args.text, backend=args.backend)
    print(json.dumps(report.as_dict()) if args.json else format_report(report))
    return 0
