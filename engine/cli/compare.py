"""`tessera-cli compare A B`: teacher-force the same text through two models and report how far their logits differ."""

from __future__ import annotations

import argparse

HELP = "compare two models' logits on the same text (max logit diff, top-1 agreement, mean KL)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="reference model (GGUF file or HF folder); its tokenizer is used")
    p.add_argument("b", metavar="B", help="model to compare (GGUF file or HF folder)")
    p.add_argument("--text", default=None, help="text to teacher-force (default: a built-in sample)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    import json

    from engine.compare import compare, format_report

    report = compare(args.a, args.b, text=args.text)
    print(json.dumps(report.as_dict()) if args.json else format_report(report))
    return 0
