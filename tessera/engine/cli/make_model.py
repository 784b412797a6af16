"""`tessera-cli make-model OUT`: write a random-weight Qwen3-MoE model (HF folder or GGUF file)."""

from __future__ import annotations

import argparse

# Kept literal so the CLI imports quickly (no torch); tests/formats/test_quantize.py checks them against
# engine.make_model.
PRESET_NAMES = ("tiny", "tiny-kquant", "qwen3-30b-a3b")
DTYPE_NAMES = ("f32", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k", "iq4_xs")

HELP = "write a random-weight Qwen3-MoE model (HF folder or GGUF) for tests, benchmarks and trying the app"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="OUT", help="output folder (--format hf) or .gguf file (--format gguf)")
    p.add_argument("--preset", default="tiny", choices=PRESET_NAMES, help="model shapes (default tiny)")
    p.add_argument("--layers", type=int, default=None, help="number of layers (default: the preset's)")
    p.add_argument(
        "--dtype",
        default="f32",
        choices=DTYPE_NAMES,
        help="weight type (default f32); q8_0, q4_0, q4_k_m, q5_k_m, q6_k, iq4_xs: gguf only, with the per-tensor type "
        "mix llama-quantize writes for that preset",
    )
    p.add_argument(
        "--format",
        dest="fmt",
        choices=["gguf", "hf"],
        default=None,
        help="gguf or hf (default: gguf when OUT ends in .gguf, else hf)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def run(args: argparse.Namespace) -> int:
    import sys

    from tessera.engine.make_model import make_model

    fmt = args.fmt or ("gguf" if args.out.lower().endswith(".gguf") else "hf")
    out = make_model(args.out, preset=args.preset, layers=args.layers, dtype=args.dtype, fmt=fmt, seed=args.seed)
    print(f"wrote {fmt} model to {out}", file=sys.stderr)
    return 0
