"""`tessera-cli check`: validate this machine for Tessera (CPU flags, AMX permission, memory bandwidth, GPUs,
verdict)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "validate this machine: CPU flags, AMX, memory bandwidth, GPUs, backends, expected speed for a model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tessera.engine.config import PUBLISHED

    p.add_argument("--json", action="store_true", help="print the report as one JSON object instead of Markdown")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--model", metavar="PATH",
                        help="a GGUF file or Hugging Face folder to estimate fit and speed for")
    target.add_argument("--preset", choices=list(PUBLISHED),
                        help="estimate fit and speed for a published Qwen3-MoE model")
    from tessera.engine import backends
    from tessera.engine.hardware import MODEL_CONTEXT

    names = backends.names()
    p.add_argument("--context-length", type=int, default=MODEL_CONTEXT, metavar="N",
                   help=f"with --model: size the KV cache for N tokens (default {MODEL_CONTEXT}, the app's default "
                        "setting; clamped to the model's own, as a load does)")
    p.add_argument("--kv-cache-type", default="bf16", choices=("bf16", "q8_0"), metavar="TYPE",
                   help="with --model or --preset: size a KV cache of this type (bf16, the default, or q8_0: int8 "
                        "with a scale per 32 values, as generate/chat/serve's --kv-cache-type)")
    p.add_argument("--backend", default="Auto", choices=names, metavar="NAME",
                   help=f"with --model: size the load for this expert backend ({', '.join(names)}; default Auto), "
                        "its packed copy of the experts included")
    from tessera.engine.quant_mix import OUTPUT_TYPES

    p.add_argument("--dtype", default="bf16", choices=list(OUTPUT_TYPES),
                   help="with --preset: size the GGUF make-model / convert would write in this type (default bf16, "
                        "the published checkpoint's), on paper")
    p.add_argument("--seconds", type=float, default=None,
                   help="length of the multi-threaded bandwidth measurement (default 3; the one-thread run takes half)")
    p.add_argument("--quick", action="store_true",
                   help="short bandwidth measurement (0.4 s), for tests and a first look")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for the bandwidth probe (default: physical cores)")
    p.add_argument("--no-gpu", action="store_true", help="skip the CUDA probe")
    p.add_argument("--save", metavar="FILE", help="also write the report to FILE (.json for JSON, else Markdown)")


def run(args: argparse.Namespace) -> int:
    from tessera.engine import hardware  # heavy imports inside run()
    from tessera.engine.errors import TesseraError

    if args.seconds is not None and args.seconds <= 0:
        raise TesseraError("--seconds", f"must be positive, got {args.seconds}")
    if args.threads is not None and args.threads < 1:
        raise TesseraError("--threads", f"must be at least 1, got {args.threads}")
    if args.context_length < 2:
        raise TesseraError("--context-length", f"must be 2 or more, got {args.context_length}")
    seconds = args.seconds or (hardware.QUICK_SECONDS if args.quick else hardware.DEFAULT_SECONDS)
    tty = sys.stderr.isatty()

    def progress(ev) -> None:
        if tty:
            print(f"\r[{ev.done:2d}/{ev.total}] {ev.stage}: {ev.detail}"[:100].ljust(100), end="", file=sys.stderr)

    report = hardware.probe(seconds=seconds, threads=args.threads, model=args.model, preset=args.preset,
                            gpu=not args.no_gpu, context_length=args.context_length, backend=args.backend,
                            preset_dtype=args.dtype, kv_cache_type=args.kv_cache_type,
                            progress=progress)
    if tty:
        print("\r" + " " * 100 + "\r", end="", file=sys.stderr)
    text = hardware.to_json(report) if args.json else hardware.to_markdown(report)
    from tessera.engine.text import terminal_safe  # the model's name and keys come from its file

    print(terminal_safe(text.rstrip("\n"), keep_newlines=True))
    if args.save:
        out = Path(args.save)
        body = hardware.to_json(report) if out.suffix.lower() == ".json" else hardware.to_markdown(report)
        try:
            out.write_text(body + ("\n" if not body.endswith("\n") else ""))
        except OSError as e:
            raise TesseraError(str(out), f"cannot write the report: {e.strerror}") from e
    return 0
