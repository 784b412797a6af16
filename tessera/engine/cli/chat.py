"""`tessera-cli chat MODEL`: an interactive terminal chat that keeps the KV cache between turns.

Type a message and press Enter. Commands: /reset (new conversation), /exit (or end of input). Ctrl-C stops an answer.
"""

from __future__ import annotations

import sys
import threading

from tessera.engine.cli.remote_options import (
    add_remote_arguments,
    check_remote_arguments,
    print_partial_on_error,
    remote_client,
)
from tessera.engine.cli.run_options import (
    UsageError,
    add_load_arguments,
    add_sampling_arguments,
    check_load_arguments,
    close_session,
    load_session,
    sampling_params,
    stats_line,
)

HELP = "chat with a model in the terminal (keeps the KV cache between turns)"


def add_arguments(p) -> None:
    add_load_arguments(p, model_optional=True)
    p.add_argument("--system", default=None, metavar="TEXT", help="system message")
    p.add_argument("--no-thinking", action="store_true", help="turn Qwen3's thinking off")
    p.add_argument("--no-stats", action="store_true", help="do not print the stats line after each answer")
    add_sampling_arguments(p, max_tokens=2048)
    add_remote_arguments(p)


def run(args) -> int:
    try:
        params = sampling_params(args)
        check_remote_arguments(args)
        check_load_arguments(args)
    except UsageError as e:
        return e.report()
    interactive = sys.stdin.isatty()
    if args.remote is not None:
        session = _RemoteSession(remote_client(args))
        if interactive:
            print(f"ready (remote {session.client.resolved_model()} at {session.client.base_url}). "
                  "/reset starts over, /exit quits.", file=sys.stderr)
    else:
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
        close_session(session)
    return 0


class _RemoteSession:
    """The two things the chat loop asks of a Session, answered by a remote server."""

    def __init__(self, client):
        self.client = client

    def chat(self, messages, params, *, enable_thinking=True, cancel=None):
        return self.client.chat(messages, params, enable_thinking=enable_thinking, cancel=cancel)

    def close(self):
        self.client.close()


def _answer(session, messages, params, enable_thinking):
    from tessera.engine.remote import RemoteError

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
    except RemoteError as e:  # the partial reply stays in the conversation, marked; the chat goes on
        print_partial_on_error(e)
        print(f"error: {e.subject}: {e.message}", file=sys.stderr)
    return "".join(parts), done
