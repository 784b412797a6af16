"""`tessera-cli generate MODEL --prompt TEXT`: print a continuation (or a chat answer with --chat), then stats."""

from __future__ import annotations

import json
import sys

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

HELP = "generate text from a prompt (raw text, or a chat message with --chat)"


def add_arguments(p) -> None:
    add_load_arguments(p, model_optional=True)
    p.add_argument("--prompt", required=True, metavar="TEXT", help="the prompt (tokenized as is unless --chat)")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message through the chat template")
    p.add_argument("--system", default=None, metavar="TEXT", help="system message (with --chat)")
    p.add_argument("--no-thinking", action="store_true", help="with --chat: turn Qwen3's thinking off")
    add_sampling_arguments(p, max_tokens=256)
    p.add_argument("--json", action="store_true",
                   help='print one JSON object: {"text", "token_ids", "metrics"} (the continuation only)')
    add_remote_arguments(p)


def run(args) -> int:
    from tessera.engine.cli.arg_checks import text_problem

    try:
        params = sampling_params(args)
        check_remote_arguments(args)
        check_load_arguments(args)
        if args.system is not None and not args.chat:
            raise UsageError("--system", "needs --chat")
        if not args.prompt:
            raise UsageError("--prompt", "is empty")
        for flag, value in (("--prompt", args.prompt), ("--system", args.system)):
            if value is not None and text_problem(value):
                raise UsageError(flag, text_problem(value))
    except UsageError as e:
        return e.report()
    if args.remote is not None:
        return _run_remote(args, params)
    session = load_session(args)
    try:
        if args.chat:
            events = session.chat(_messages(args), params, enable_thinking=not args.no_thinking)
        else:
            events = session.generate(session.tokenizer.encode(args.prompt), params)
        done = _print_stream(args, events)
    finally:
        close_session(session)
    return _report(args, done)


def _messages(args) -> list[dict]:
    """--system (if given) and --prompt as chat messages."""
    messages = [{"role": "system", "content": args.system}] if args.system is not None else []
    messages.append({"role": "user", "content": args.prompt})
    return messages


def _print_stream(args, events):
    """Writes the streamed text as it comes (not with --json); returns the closing event, the one with metrics."""
    done = None
    for event in events:
        if hasattr(event, "metrics"):
            done = event
        elif not args.json:
            sys.stdout.write(event.text)
            sys.stdout.flush()
    return done


def _report(args, done) -> int:
    if args.json:
        print(json.dumps({"text": done.text, "token_ids": done.token_ids, "metrics": done.metrics.as_dict()}))
    else:
        print()
        print(stats_line(done.metrics))
    return 0


def _run_remote(args, params) -> int:
    """The same answer through an OpenAI-compatible server: /v1/chat/completions with --chat, else /v1/completions."""
    from tessera.engine.remote import RemoteError

    with remote_client(args) as client:
        if args.chat:
            events = client.chat(_messages(args), params, enable_thinking=not args.no_thinking)
        else:
            events = client.complete(args.prompt, params)
        try:
            done = _print_stream(args, events)
        except RemoteError as e:
            print_partial_on_error(e)
            raise
    return _report(args, done)
