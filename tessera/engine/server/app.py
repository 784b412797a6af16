"""The OpenAI-compatible HTTP API over one engine: a Starlette app. Qt-free.

Routes: GET /health (no key needed), GET /v1/models, POST /v1/chat/completions, POST /v1/completions. Requests are
validated and tokenized in a worker thread, then queued on the EngineScheduler (429 when its queue is full); answers
stream as server-sent events through Starlette's StreamingResponse. A client that disconnects cancels its request:
Starlette cancels the streaming task, whose cleanup sets the request's cancel flag, which the engine checks before
every forward step; a non-streaming request watches for the disconnect itself.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tessera.engine.errors import TesseraError
from tessera.engine.events import DoneEvent, TokenEvent
from tessera.engine.scheduler import EngineScheduler, QueueFullError, SchedulerClosedError
from tessera.engine.server.chat_output import THINK_OPEN, ChatOutputParser, Delta, collect, tool_call_json
from tessera.engine.server.errors import ApiError, from_engine_error, server_error
from tessera.engine.server.requests import parse_chat, parse_completion

DEFAULT_MAX_BODY_BYTES = 4 << 20  # 4 MiB: some 1 M tokens of text, far beyond any context Tessera runs


@dataclass(frozen=True)
class ServerOptions:
    model_name: str  # the id /v1/models lists and requests must name
    api_key: str | None = None  # required as "Authorization: Bearer KEY" on /v1/* when set
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


def _error_response(e: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def _finish_reason(stop_reason: str, tool_calls: int) -> str:
    if tool_calls:
        return "tool_calls"
    return "length" if stop_reason in ("max_tokens", "context_full") else "stop"


def _usage(done: DoneEvent) -> dict:
    m = done.metrics
    return {"prompt_tokens": m.prompt_tokens, "completion_tokens": m.generated_tokens,
            "total_tokens": m.prompt_tokens + m.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": m.reused_tokens}}


def _event_stream(chunks) -> StreamingResponse:
    """Server-sent events from an async iterator of `data: ...` chunks, never cached or buffered by a proxy."""
    return StreamingResponse(chunks, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class OpenAIServer:
    """Holds the scheduler and options; `app` is the Starlette application."""

    def __init__(self, scheduler: EngineScheduler, options: ServerOptions):
        self.scheduler, self.options = scheduler, options
        self.created = int(time.time())
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
        ]
        self.app = Starlette(routes=routes, exception_handlers={HTTPException: self._http_error,
                                                                 ApiError: self._api_error})

    @property
    def session(self):
        return self.scheduler.session

    # ---- plumbing ----------------------------------------------------------------------------------------------------

    async def _http_error(self, request: Request, exc: HTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return _error_response(ApiError(exc.status_code, message, type=kind))

    async def _api_error(self, request: Request, exc: ApiError) -> Response:
        return _error_response(exc)

    def _authorize(self, request: Request) -> None:
        key = self.options.api_key
        if not key:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            what = "No API key given" if not given else "Incorrect API key given"
            raise ApiError(401, f"{what}: send the server's key as 'Authorization: Bearer KEY'",
                           type="invalid_request_error", code="invalid_api_key")

    async def _json_body(self, request: Request):
        limit = self.options.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"the request body of {int(declared)} bytes is over this server's limit of {limit} "
                                f"bytes (tessera-cli serve --max-body-bytes)", code="request_too_large")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ApiError(413, f"the request body is over this server's limit of {limit} bytes "
                                    f"(tessera-cli serve --max-body-bytes)", code="request_too_large")
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None

    def _submit(self, events, cancel: threading.Event) -> tuple[asyncio.Queue, object]:
        """Queue the request on the engine; its events arrive on an asyncio queue of this event loop."""
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        try:
            ticket = self.scheduler.submit(events, cancel=cancel,
                                           on_event=lambda e: loop.call_soon_threadsafe(inbox.put_nowait, e))
        except QueueFullError as e:
            raise ApiError(429, f"the engine is busy: {e.message}", type="rate_limit_error",
                           code="rate_limit_exceeded") from None
        except SchedulerClosedError as e:
            raise ApiError(503, f"{e.subject} {e.message}", type="server_error", code="unavailable") from None
        return inbox, ticket

    def _prepare(self, make_events):
        """Run make_events(cancel) in a worker thread: templating and tokenizing; request errors become 400s."""

        def prepare():
            cancel = threading.Event()
            try:
                return make_events(cancel), cancel
            except TesseraError as e:
                raise from_engine_error(e) from None

        return run_in_threadpool(prepare)

    async def _collect(self, request: Request, inbox: asyncio.Queue, ticket, on_event) -> DoneEvent | None:
        """Feed events to on_event until the DoneEvent (returned); None when the client went away first."""

        async def consume():
            while True:
                event = await inbox.get()
                if isinstance(event, BaseException):
                    raise server_error(f"generation failed: {event}")
                on_event(event)
                if isinstance(event, DoneEvent):
                    return event

        consumer = asyncio.ensure_future(consume())
        watcher = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if consumer.done():
                return consumer.result()
            return None
        finally:
            ticket.cancel()  # no-op when finished; stops the engine within one token when the client left
            consumer.cancel()
            watcher.cancel()

    # ---- routes ------------------------------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        s = self.scheduler
        return JSONResponse({"status": "ok", "model": self.options.model_name, "busy": s.busy, "waiting": s.waiting,
                             "max_waiting": s.max_waiting, "requests": dict(s.stats)})

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        session = self.session
        model = {"id": self.options.model_name, "object": "model", "created": self.created, "owned_by": "tessera",
                 "max_model_len": session.context_length, "backend": session.backend_name}
        return JSONResponse({"object": "list", "data": [model]})

    async def chat_completions(self, request: Request) -> Response:
        self._authorize(request)
        body = await self._json_body(request)
        session = self.session
        req = parse_chat(body, served=self.options.model_name, context_length=session.context_length)

        def make_events(cancel):
            # one render: its text says whether the template opened <think>, its ids are what runs; message
            # content is tokenized without special tokens (a client cannot forge turns inside its content)
            prompt = session.prepare_chat(req.messages, enable_thinking=req.enable_thinking, tools=req.tools)
            events = session.generate(prompt.ids, req.params, cancel=cancel)
            return events, prompt.text.rstrip().endswith(THINK_OPEN)

        (events, think_open), cancel = await self._prepare(make_events)
        inbox, ticket = self._submit(events, cancel)
        parser = ChatOutputParser(think_open=think_open, tools=req.tools is not None)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.options.model_name}
        if req.stream:
            return _event_stream(self._chat_stream(head, req, inbox, ticket, parser))
        deltas: list[Delta] = []
        done = await self._collect(request, inbox, ticket, lambda e: deltas.extend(
            parser.feed(e.text) if isinstance(e, TokenEvent) else parser.finish()))
        if done is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        reasoning, content, calls = collect(deltas)
        message = {"role": "assistant", "content": content if content is not None or calls else "",
                   "reasoning_content": reasoning}
        if calls:
            message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "logprobs": None,
                  "finish_reason": _finish_reason(done.metrics.stop_reason, len(calls))}
        return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": _usage(done)})

    async def _chat_stream(self, head, req, inbox: asyncio.Queue, ticket, parser: ChatOutputParser):
        def chunk(delta: dict, finish_reason=None) -> str:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return _sse({**head, "object": "chat.completion.chunk", "choices": [choice]})

        sent_calls = 0

        def render(deltas: list[Delta]):
            nonlocal sent_calls
            for d in deltas:
                if d.kind == "tool_call":
                    yield chunk({"tool_calls": [tool_call_json(d, sent_calls)]})
                    sent_calls += 1
                elif d.kind == "reasoning":
                    yield chunk({"reasoning_content": d.text})
                else:
                    yield chunk({"content": d.text})

        try:
            yield chunk({"role": "assistant", "content": ""})
            while True:
                event = await inbox.get()
                if isinstance(event, BaseException):
                    yield _sse(server_error(f"generation failed: {event}").body())
                    break
                if isinstance(event, TokenEvent):
                    for piece in render(parser.feed(event.text)):
                        yield piece
                    continue
                for piece in render(parser.finish()):
                    yield piece
                yield chunk({}, _finish_reason(event.metrics.stop_reason, parser.calls))
                if req.include_usage:
                    yield _sse({**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage(event)})
                break
            yield "data: [DONE]\n\n"
        finally:
            ticket.cancel()  # the client disconnected (this task was cancelled) or the answer is complete

    async def completions(self, request: Request) -> Response:
        self._authorize(request)
        body = await self._json_body(request)
        session = self.session
        req = parse_completion(body, served=self.options.model_name, context_length=session.context_length)

        def make_events(cancel):
            ids = req.prompt if isinstance(req.prompt, list) else session.tokenizer.encode(req.prompt)
            return session.generate(ids, req.params, cancel=cancel)

        events, cancel = await self._prepare(make_events)
        inbox, ticket = self._submit(events, cancel)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.options.model_name}
        if req.stream:
            return _event_stream(self._completion_stream(head, req, inbox, ticket))
        done = await self._collect(request, inbox, ticket, lambda e: None)
        if done is None:
            return Response(status_code=499)
        choice = {"index": 0, "text": done.text, "logprobs": None,
                  "finish_reason": _finish_reason(done.metrics.stop_reason, 0)}
        return JSONResponse({**head, "object": "text_completion", "choices": [choice], "usage": _usage(done)})

    async def _completion_stream(self, head, req, inbox: asyncio.Queue, ticket):
        def chunk(text: str, finish_reason=None) -> str:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            return _sse({**head, "object": "text_completion", "choices": [choice]})

        try:
            while True:
                event = await inbox.get()
                if isinstance(event, BaseException):
                    yield _sse(server_error(f"generation failed: {event}").body())
                    break
                if isinstance(event, TokenEvent):  # one chunk per token, its text "" while a character is incomplete
                    yield chunk(event.text)
                    continue
                yield chunk("", _finish_reason(event.metrics.stop_reason, 0))
                if req.include_usage:
                    yield _sse({**head, "object": "text_completion", "choices": [], "usage": _usage(event)})
                break
            yield "data: [DONE]\n\n"
        finally:
            ticket.cancel()


def create_app(scheduler: EngineScheduler, options: ServerOptions) -> Starlette:
    return OpenAIServer(scheduler, options).app
