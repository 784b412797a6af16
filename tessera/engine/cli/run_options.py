"""Options shared by `generate`, `chat` and `bench`: model loading (backend, threads, context) and sampling flags."""

from __future__ import annotations

import argparse
import sys

from tessera.engine import backends

KV_CACHE_TYPES = ("bf16", "q8_0")  # engine.kv_cache.KV_DTYPES' user choices (its f32 is for reference checks)


def add_load_arguments(p: argparse.ArgumentParser, *, model_optional: bool = False) -> None:
    if model_optional:  # commands that can also run on a remote server (--remote URL)
        p.add_argument("model", metavar="MODEL", nargs="?", default=None,
                       help="a .gguf file or a Hugging Face folder (or none, with --remote)")
    else:
        p.add_argument("model", metavar="MODEL", help="a .gguf file or a Hugging Face folder")
    names = backends.names()
    p.add_argument("--backend", default="Auto", choices=names, metavar="NAME",
                   help=f"expert backend: {', '.join(names)} (default Auto: the best this CPU supports; "
                        f"Torch: {backends.TORCH_DESCRIPTION}; `tessera-cli check` says which run here and why)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads (default: PyTorch's choice)")
    p.add_argument("--context-length", type=int, default=None, metavar="N",
                   help="context length in tokens (default: the model's)")
    p.add_argument("--kv-cache-type", default="bf16", choices=KV_CACHE_TYPES, metavar="TYPE",
                   help="KV cache storage: bf16 (default) or q8_0 (int8 with a scale per 32 values, as llama.cpp's "
                        "-ctk/-ctv q8_0: about half the RAM, faster decode at long contexts; CPU only)")
    g = p.add_argument_group("placement (hybrid CPU/GPU)")
    g.add_argument("--placement", default=None, metavar="RULES",
                   help="placement rules file (KTransformers-style YAML; see tessera/resources/placement/); "
                        "default: everything on the CPU, or --device")
    g.add_argument("--device", default=None, choices=("cpu", "cuda"),
                   help="where attention, norms, router and lm_head run (default cpu); experts stay on the CPU backend")
    g.add_argument("--gpu-experts", type=int, default=None, metavar="N",
                   help="hot-expert cache: experts per MoE layer kept on the GPU (with --device cuda or --twin)")
    g.add_argument("--twin", action="store_true",
                   help="run the GPU half on the CPU with the same code path (the CPU twin; no GPU needed)")
    g.add_argument("--explain", action="store_true", help="print the placement plan on stderr before running")


# The CLI's own sampling defaults (Qwen3's recommended thinking-mode values; never read from generation_config.json).
# They equal SamplingParams' defaults (tests/engine/test_cli.py checks); written out so that --help needs no torch.
DEFAULTS = argparse.Namespace(temperature=0.6, top_k=20, top_p=0.95, min_p=0.0, repetition_penalty=1.0)


def add_sampling_arguments(p: argparse.ArgumentParser, *, max_tokens: int) -> None:
    d = DEFAULTS
    p.add_argument("--max-tokens", type=int, default=max_tokens, metavar="N", help=f"default {max_tokens}")
    p.add_argument("--temperature", type=float, default=d.temperature, metavar="T",
                   help=f"0 is greedy (default {d.temperature})")
    p.add_argument("--top-k", type=int, default=d.top_k, metavar="K", help=f"0 disables (default {d.top_k})")
    p.add_argument("--top-p", type=float, default=d.top_p, metavar="P", help=f"in (0, 1] (default {d.top_p})")
    p.add_argument("--min-p", type=float, default=d.min_p, metavar="P", help=f"in [0, 1) (default {d.min_p})")
    p.add_argument("--repetition-penalty", type=float, default=d.repetition_penalty, metavar="R",
                   help=f"1 disables (default {d.repetition_penalty})")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="seed for reproducible sampling")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")


def sampling_params(args):
    """SamplingParams from the flags; a bad value is a usage error (printed, exit code 2) raised as UsageError."""
    from tessera.engine.errors import TesseraError
    from tessera.engine.sampling import SamplingParams

    try:
        return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                              repetition_penalty=args.repetition_penalty, seed=args.seed, max_tokens=args.max_tokens,
                              stop=tuple(args.stop))
    except TesseraError as e:
        raise UsageError(e.subject, e.message) from None


class UsageError(Exception):
    """A flag with a bad value: reported like argparse's errors, exit code 2."""

    def __init__(self, subject: str, message: str):
        super().__init__(f"{subject}: {message}")
        self.subject, self.message = subject, message

    def report(self) -> int:
        print(f"error: {self.subject}: {self.message}", file=sys.stderr)
        return 2


def check_load_arguments(args) -> None:
    if args.placement is not None and (args.device is not None or args.gpu_experts is not None):
        raise UsageError("--placement", "the rules file sets devices and the expert cache; drop --device/--gpu-experts")
    if args.gpu_experts is not None and args.gpu_experts < 0:
        raise UsageError("--gpu-experts", f"must be >= 0, got {args.gpu_experts}")
    from tessera.engine.cli.arg_checks import threads_problem

    if threads_problem(args.threads):
        raise UsageError("--threads", threads_problem(args.threads))
    if args.context_length is not None and args.context_length < 2:
        raise UsageError("--context-length", f"must be >= 2, got {args.context_length}")


def placement_of(args):
    """The placement the flags describe: a rules file, settings, or None (all on the CPU)."""
    from tessera.engine.hybrid import PlacementSettings

    if args.placement is not None:
        return args.placement
    if args.device is None and args.gpu_experts is None and not args.twin:
        return None
    device = args.device or ("cuda" if args.twin or args.gpu_experts else "cpu")
    return PlacementSettings(device=device, gpu_experts_per_layer=args.gpu_experts or 0)


def _print_load_notice(event) -> None:
    """A load's one-line notices come as a "pack" event before any layer (engine.native.make_backend: what widening a
    quantized file's experts for a bf16 backend costs); print them before the load goes on."""
    if event.stage == "pack" and event.done == 0 and event.detail:
        print(f"note: {event.detail}", file=sys.stderr)


def start_preload(args) -> bool:
    """For a command that loads a local model on the CPU (generate, chat, bench, serve: the load flags): begin the
    torch-free part of its load on a thread (engine.preload), so that it runs while torch is imported. True when one
    was begun (cli.main drops it if no load takes it). Not with a placement (rules file, --device, --gpu-experts,
    --twin) or --remote: those loads are left as they were."""
    if not hasattr(args, "placement") or getattr(args, "remote", None) is not None or args.model is None:
        return False  # not a command with the load flags (`check` has --kv-cache-type and a model, not these)
    if args.placement is not None or args.device is not None or args.gpu_experts is not None or args.twin:
        return False
    from tessera.engine import preload

    return preload.start(args.model, backend=args.backend) is not None


def load_session(args):
    from tessera import engine

    session = engine.load(args.model, backend=args.backend, threads=args.threads, context_length=args.context_length,
                          kv_cache_type=args.kv_cache_type, placement=placement_of(args), twin=args.twin,
                          progress=_print_load_notice)
    if args.explain:
        print(session.explain(), file=sys.stderr)
    return session


def close_session(session) -> None:
    """Closes a command's session; a first load's packs still being written are finished first, and said."""
    finish_pack_writes()
    session.close()


def finish_pack_writes() -> None:
    """A first load's packs still on their way to the packed-weight cache (engine.pack_store: written behind the load
    and paused while it generated) are written before the command ends, which is said: it can take a BF16 file's
    ~16 s on a slow disk. Ctrl+C gives them up (the next load packs those layers again)."""
    store = sys.modules.get("tessera.engine.pack_store")  # not imported: nothing was packed
    left = store.pending_bytes() if store is not None else 0
    if not left:
        return
    sys.stdout.flush()  # the answer first
    work = store.work_left(left, store.pending_hash_bytes())  # hashing: a new file version's keys, before the writes
    print(f"tessera: saving the packed weights to the cache, so that the next load is quick: {work} (Ctrl+C skips)",
          file=sys.stderr, flush=True)
    try:
        store.finish_all()
    except KeyboardInterrupt:
        store.skip_all()
        store.finish_all()  # the write in progress gives up at its next piece
        print("tessera: skipped; the next load packs the layers not written again", file=sys.stderr, flush=True)


def stats_line(m) -> str:
    """One line of request metrics for humans."""
    parts = [
        f"prompt {m.prompt_tokens} tok (reused {m.reused_tokens})",
        f"generated {m.generated_tokens} tok",
        f"ttft {m.ttft_s:.3f} s",
        f"prefill {m.prefill_tok_s:.1f} tok/s",
        f"decode {m.decode_tok_s:.1f} tok/s",
        f"stop {m.stop_reason}",
        f"backend {m.backend}",
    ]
    return "[" + " | ".join(parts) + "]"
