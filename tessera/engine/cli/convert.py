"""`tessera-cli convert SRC OUT`: convert a Hugging Face Qwen3-MoE folder to a llama.cpp-compatible GGUF file."""

from __future__ import annotations

import argparse

HELP = "convert a Hugging Face Qwen3-MoE folder to GGUF (llama.cpp qwen3moe layout)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", metavar="SRC", help="Hugging Face model folder (config.json, *.safetensors, tokenizer.json)")
    p.add_argument("out", metavar="OUT", help="GGUF file to write")
    p.add_argument(
        "--dtype",
        default="bf16",
        choices=["bf16", "q8_0", "f16", "f32", "q4_0", "q4_k_m", "q5_k_m", "q6_k", "iq4_xs"],
        help="type of the matrices (default bf16); q4_0 .. iq4_xs write llama-quantize's per-tensor type mix",
    )
    p.add_argument("--force", action="store_true",
                   help="replace OUT if it exists (never a file of SRC: converting over the source is always refused)")
    p.add_argument("--verify", action="store_true",
                   help="afterwards, judge the output: float types by the logits of source and output; quantized "
                        "types by each tensor's error against the source and the output's logits against its "
                        "dequantized-F32 twin (docs/FORMATS.md)")
    from tessera.engine import backends

    names = backends.names()
    p.add_argument("--backend", default="Auto", metavar="NAME",
                   help=f"expert backend --verify runs the models with: {', '.join(names)} (default Auto, the one "
                        "chat and the app pick on this CPU)")
    p.add_argument("--text", default=None, help="text for --verify (default: a built-in sample)")
    p.add_argument(
        "--prepack",
        metavar="BACKEND",
        default=None,
        help="afterwards, pre-pack the experts for BACKEND into the packed-weight cache",
    )


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    from tessera.engine.convert import convert
    from tessera.engine.events import ProgressEvent

    t0 = time.perf_counter()

    def progress(e: ProgressEvent) -> None:
        if e.done < e.total:
            print(f"\r[{e.done + 1}/{e.total}] {e.detail:<40}", end="", file=sys.stderr, flush=True)

    if args.verify:
        from tessera.engine import backends

        backends.resolve(args.backend)  # a backend --verify cannot use is a named error before the conversion runs
    _sigterm_as_interrupt()
    out = convert(args.src, args.out, dtype=args.dtype, progress=progress, force=args.force)
    print(f"\rwrote {out} in {time.perf_counter() - t0:.1f} s{' ' * 30}", file=sys.stderr)
    status = 0
    if args.verify:
        from tessera.engine.compare import format_report, verify_conversion

        report, ok, why = verify_conversion(args.src, out, args.dtype, text=args.text, backend=args.backend)
        print(format_report(report))
        print(f"verify: {'PASS' if ok else 'FAIL'} ({why})")
        status = 0 if ok else 1
    if args.prepack:
        from tessera.engine.convert import prepack

        print(prepack(out, args.prepack), file=sys.stderr)
    return status


def _sigterm_as_interrupt() -> None:
    """Let `kill` stop a conversion the way Ctrl-C does, so the temporary output is removed on the way out."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.default_int_handler)
