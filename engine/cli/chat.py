"""`tessera-cli chat MODEL`: an interactive terminal chat that keeps the KV cache between turns.

Type a message and press Enter. Commands: /reset (new conversation), /exit (or end of input). Ctrl-C stops an answer.
"""

from __future__ import annotations

import sys
import threading

from engine.cli.run_options import (UsageError, add_load_arguments, add_sampling_arguments, check_load_arguments,
                                    load_session, sampling_params, stats_line)

HELP = "chat with a model in the terminal (keeps the KV cache between turns)"


def add_arguments(p) -> None:
    add_load_arguments(p)
    p.add_argument("--system", default=None, metavar="TEXT", help="system message")
    p.add_argument("--no-thinking", action="store_true", help="turn Qwen3's thinking off")
    p.add_argument("--no-stats", action="store_true", help="do not print the stats line after each answer")
    add_sampling_arguments(p, max_tokens=2048)


def run(args) -> int:
    try:
        params = sampling_params(args)
        check_load_arguments(args)
    except UsageError as e:
        return e.report()
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"loading {args.model} ...", file=sys.stderr)
    session = load_session(args)
    if interactive:
        print(f"ready ({session.backend_name}: {session.backend_reason}). /reset starts over, /exit quits.",
              file=sys.stderr)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    try:
        while True:
            if interactive:
                print("> ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
            if not line:
                break
            text = line.rstrip("\n")
            if text.strip() in ("/exit", "/quit"):
                break
            if text.strip() == "/reset":
                messages = list(system)
                continue
            if not text.strip():
                continue
            messages.append({"role": "user", "content": text})
            answer, done = _answer(session, messages, params, not args.no_thinking)
            messages.append({"role": "assistant", "content": answer})
            print()
            if done is not None and not args.no_stats:
                print(stats_line(done.metrics), flush=True)
    finally:
        session.close()
    return 0


def _answer(session, messages, params, enable_thinking):
    cancel = threading.Event()
    parts, done = [], None
    events = session.chat(messages, params, enable_thinking=enable_thinking, cancel=cancel)
    try:
        for event in events:
            if hasattr(event, "metrics"):
                done = event
            else:
                parts.append(event.text)
                sys.stdout.write(event.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        events.close()
        print("\n[stopped]", file=sys.stderr)
    return "".join(parts), done
