"""`--remote URL [--api-key KEY] [--model NAME]` for `generate` and `chat`: answer through an OpenAI-compatible server
(tessera-cli serve, vLLM, SGLang, llama-server) with engine.remote.RemoteClient instead of loading a model."""

from __future__ import annotations

import argparse
import os
import sys

from tessera.engine.cli.run_options import UsageError

API_KEY_ENV = "TESSERA_API_KEY"


def add_remote_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("remote server (instead of MODEL)")
    g.add_argument("--remote", default=None, metavar="URL",
                   help="an OpenAI-compatible server's base URL, e.g. http://127.0.0.1:8080/v1")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"its API key (default: ${API_KEY_ENV} if set)")
    g.add_argument("--model", dest="remote_model", default=None, metavar="NAME",
                   help="the model id to ask for (default: the first the server lists)")
    g.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="longest silence accepted from the server mid-answer, in seconds (default 300)")


def check_remote_arguments(args) -> None:
    """Exactly one of MODEL and --remote; the local-only flags make no sense with --remote."""
    if args.remote is None:
        if args.model is None:
            raise UsageError("MODEL", "give a model file or folder, or --remote URL")
        if args.remote_model is not None or args.api_key is not None:
            raise UsageError("--model/--api-key", "only apply with --remote")
        return
    if args.model is not None:
        raise UsageError("--remote", "give either MODEL or --remote URL, not both")
    local = [flag for flag, on in (("--placement", args.placement), ("--device", args.device),
                                   ("--gpu-experts", args.gpu_experts), ("--twin", args.twin),
                                   ("--threads", args.threads), ("--context-length", args.context_length),
                                   ("--backend", args.backend != "Auto"),
                                   ("--kv-cache-type", args.kv_cache_type != "bf16")) if on]
    if local:
        raise UsageError(local[0], "sets up a local model; the remote server has its own settings")
    if args.timeout <= 0:
        raise UsageError("--timeout", f"must be > 0, got {args.timeout}")


def remote_client(args):
    from tessera.engine.remote import RemoteClient

    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    return RemoteClient(args.remote, key, model=args.remote_model, read_timeout=args.timeout)


def print_partial_on_error(error) -> None:
    """A RemoteError mid-answer: the partial reply stays on screen, marked as cut short."""
    if getattr(error, "partial", ""):
        print("\n[answer cut short]", file=sys.stderr)
