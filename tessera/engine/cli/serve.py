"""`tessera-cli serve MODEL`: serve a model over the OpenAI API (chat completions, completions, models, health).

Loopback (127.0.0.1) by default; any other address needs --api-key. Requests run one at a time in arrival order;
at most --max-queue wait behind the running one (HTTP 429 beyond). Ctrl-C stops the server.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tessera.engine.cli.run_options import (
    UsageError,
    add_load_arguments,
    check_load_arguments,
    close_session,
    load_session,
)

HELP = "serve a model over the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models)"
API_KEY_ENV = "TESSERA_API_KEY"


def add_arguments(p) -> None:
    add_load_arguments(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                   help="address to listen on (default 127.0.0.1, this machine only; any other needs --api-key)")
    g.add_argument("--port", type=int, default=8080, metavar="N", help="port (default 8080; 0 picks a free one)")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV} if set, else none)")
    g.add_argument("--model-name", default=None, metavar="NAME",
                   help="the model id clients name (default: the file or folder name without .gguf)")
    g.add_argument("--max-queue", type=int, default=8, metavar="N",
                   help="requests that may wait behind the running one; more get HTTP 429 (default 8)")
    g.add_argument("--max-body-bytes", type=int, default=4 << 20, metavar="N",
                   help="largest request body accepted; larger get HTTP 413 (default 4 MiB)")
    g.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level (default info; request bodies and keys are never logged)")


def served_name(model: str) -> str:
    path = Path(model)
    return path.stem if path.suffix.lower() == ".gguf" else path.resolve().name


def run(args) -> int:
    from tessera.engine.server.run import bind_socket, check_bind

    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    try:
        check_load_arguments(args)
        if args.max_queue < 0:
            raise UsageError("--max-queue", f"must be >= 0, got {args.max_queue}")
        if args.max_body_bytes < 1024:
            raise UsageError("--max-body-bytes", f"must be >= 1024, got {args.max_body_bytes}")
        if api_key is not None and not api_key.strip():
            raise UsageError("--api-key", "is empty")
    except UsageError as e:
        return e.report()
    # Before loading: a keyless open server or a taken port should not wait for the model.
    check_bind(args.host, api_key)
    sock = bind_socket(args.host, args.port)

    from tessera.engine.scheduler import EngineScheduler
    from tessera.engine.server.app import ServerOptions
    from tessera.engine.server.run import base_url, serve_forever

    name = args.model_name or served_name(args.model)
    print(f"loading {args.model} ...", file=sys.stderr)
    try:
        session = load_session(args)
    except BaseException:
        sock.close()
        raise
    scheduler = EngineScheduler(session, max_waiting=args.max_queue)
    url = base_url(args.host, sock.getsockname()[1])
    print(f"serving {name} ({session.backend_name}, context {session.context_length}) at {url}; "
          f"{'API key required' if api_key else 'no API key'}. Ctrl-C stops.", file=sys.stderr, flush=True)
    try:
        serve_forever(scheduler, ServerOptions(name, api_key, args.max_body_bytes), sock, log_level=args.log_level)
    except KeyboardInterrupt:  # uvicorn shuts down gracefully on Ctrl-C, then re-raises it: a normal way to stop
        pass
    finally:
        scheduler.close()
        close_session(session)
    print("server stopped", file=sys.stderr)
    return 0
