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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; `only`: a command's name, whose module alone is imported and whose arguments alone are
    added (the others stay names, for argparse's usage line). `main` builds that for a command line naming a command:
    importing every subcommand's module took ~0.08 s of each `generate` (the hardware probe's and the converter's
    modules among them), before any model work."""
    parser = argparse.ArgumentParser(prog="tessera-cli", description="Tessera: local Qwen3-MoE inference, headless.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name)
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors")
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand a command line names (its first word that is not --debug), when it is one; else None."""
    for word in argv:
        if word != "--debug":
            return word if word in SUBCOMMANDS else None
    return None


# Commands whose process ends without the interpreter's teardown when main() is the process's entry (argv None: the
# console script, `python -m tessera.engine`): with torch loaded, that teardown (module clean-up, libtorch's static
# destructors) took 0.3-0.35 s after the answer was printed (Zen 4, 2 cores, docs/BENCHMARKS.md session 8), a fifth
# of a short `generate`. Their work is done and written by then: the output is flushed, logging shut down, atexit
# handlers run (`_end_process`). A call with argv (tests, scripts) returns as before.
QUICK_EXIT = frozenset({"generate", "chat", "bench"})


def main(argv: list[str] | None = None) -> int:
    entry = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command(argv))
    args = parser.parse_args(argv)
    code = _main(args)
    if entry and args.command in QUICK_EXIT:
        _end_process(code)
    return code


def _end_process(code: int) -> None:
    """Ends the process now with `code`, as `sys.exit` would but without the interpreter's teardown."""
    import atexit
    import logging
    import os

    try:
        atexit._run_exitfuncs()  # what registered itself for the end (libraries' clean-ups) still runs
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said on it
        pass
    os._exit(code)


def _main(args) -> int:
    from tessera.engine.cli.resource_errors import address_space_problem

    if args.command != "cache" and address_space_problem():
        print("error: {}: {}".format(*address_space_problem()), file=sys.stderr)
        return 1
    from tessera.engine.cli.run_options import start_preload

    preloaded = start_preload(args)  # a model's torch-free load work, begun before anything imports torch
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
    finally:
        if preloaded:  # what no load took (a usage error, a remote run): its maps closed
            from tessera.engine import preload

            preload.discard(args.model)


if __name__ == "__main__":
    sys.exit(main())
