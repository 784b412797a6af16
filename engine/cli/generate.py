"""`tessera-cli generate MODEL --prompt TEXT`: print a continuation (or a chat answer with --chat), then stats."""

from __future__ import annotations

import json
import sys

from engine.cli.run_options import (UsageError, add_load_arguments, add_sampling_arguments, check_load_arguments,
                                    load_session, sampling_params, stats_line)

HELP = "generate text from a prompt (raw text, or a chat message with --chat)"


def add_arguments(p) -> None:
    add_load_arguments(p)
    p.add_argument("--prompt", required=True, metavar="TEXT", help="the prompt (tokenized as is unless --chat)")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message through the chat template")
    p.add_argument("--system", default=None, metavar="TEXT", help="system message (with --chat)")
    p.add_argument("--no-thinking", action="store_true", help="with --chat: turn Qwen3's thinking off")
    add_sampling_arguments(p, max_tokens=256)
    p.add_argument("--json", action="store_true",
                   help='print one JSON object: {"text", "token_ids", "metrics"} (the continuation only)')


def run(args) -> int:
    from engine.cli.arg_checks import text_problem

    try:
        params = sampling_params(args)
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
    session = load_session(args)
    try:
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system is not None else [])
            messages.append({"role": "user", "content": args.prompt})
            events = session.chat(messages, params, enable_thinking=not args.no_thinking)
        else:
            events = session.generate(session.tokenizer.encode(args.prompt), params)
        done = None
        for event in events:
            if hasattr(event, "metrics"):
                done = event
            elif not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
    finally:
        session.close()
    if args.json:
        print(json.dumps({"text": done.text, "token_ids": done.token_ids, "metrics": done.metrics.as_dict()}))
    else:
        print()
        print(stats_line(done.metrics))
    return 0
