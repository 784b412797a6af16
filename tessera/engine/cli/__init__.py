"""`tessera-cli`: the headless twin of the app. Each subcommand lives in its own module of this package.

A subcommand module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`.
Errors a user can fix are `engine.errors.TesseraError`s: printed as `error: <subject>: <message>`, exit code 1
(2 for bad usage, as argparse does); a traceback only with `--debug`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from tessera.engine.errors import Cancelled, TesseraError

# name -> module under engine.cli. Keep in the order `--help` should list them.
# Subcommand modules must import quickly: import torch and friends inside run(), not at module top.
SUBCOMMANDS: dict[str, str] = {
    "make-model": "tessera.engine.cli.make_model",
    "convert": "tessera.engine.cli.convert",
    "compare": "tessera.engine.cli.compare",
    "check": "tessera.engine.cli.check",
    "generate": "tessera.engine.cli.generate",
    "chat": "tessera.engine.cli.chat",
    "serve": "tessera.engine.cli.serve",
    "bench": "tessera.engine.cli.bench",
    "eval-demo": "tessera.engine.cli.eval_demo",
    "bench-moe": "tessera.engine.cli.bench_moe",
    "tune": "tessera.engine.cli.tune",
    "cache": "tessera.engine.cli.cache",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera-cli", description="Tessera: local Qwen3-MoE inference, headless.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors")
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from tessera.engine.cli.resource_errors import address_space_problem

    if args.command != "cache" and address_space_problem():
        print("error: {}: {}".format(*address_space_problem()), file=sys.stderr)
        return 1
    try:
        return int(args._run(args) or 0)
    except TesseraError as e:
        if args.debug:
            raise
        from tessera.engine.text import terminal_safe  # names from files may carry terminal escape sequences

        print(f"error: {terminal_safe(e.subject)}: {terminal_safe(e.message)}", file=sys.stderr)
        return 1
    except Cancelled:
        print("error: cancelled", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except (MemoryError, ImportError, OSError, RuntimeError) as e:  # `ulimit -v` too small, ...: a sentence
        from tessera.engine.cli.resource_errors import explain

        said = explain(e)
        if said is None or args.debug:
            raise
        print(f"error: {said[0]}: {said[1]}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
