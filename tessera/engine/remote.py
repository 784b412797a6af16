"""A client for any OpenAI-compatible server (tessera-cli serve, vLLM, SGLang, llama-server, KTransformers), streaming
server-sent events with httpx. Used by `tessera-cli generate/chat --remote` and the app's Remote engine. Qt-free.

It yields the engine's own events, so callers treat a remote answer like a local one: `TokenEvent`s (token_id -1: the
server sends text, not ids) whose text is the answer in Qwen3's raw form (`reasoning_content` wrapped in
`<think>...</think>`, as a local model writes it), then a `RemoteDoneEvent` with RequestMetrics from the stream's timing
(TTFT, decode tok/s) and the server's `usage` (prompt tokens, `cached_tokens` as the prefix-cache reuse) when it
sends one. A server that is down, slow, sends malformed SSE or an error mid-stream raises a RemoteError whose
`.partial` keeps the text received so far.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from tessera.engine.errors import TesseraError
from tessera.engine.events import DoneEvent, RequestMetrics, TokenEvent
from tessera.engine.sampling import SamplingParams


class RemoteError(TesseraError):
    """A remote server did not give a whole answer. `partial`: the text received before the problem."""

    def __init__(self, subject: str, message: str, partial: str = ""):
        super().__init__(subject, message)
        self.partial = partial


class RemoteUnavailableError(RemoteError):
    """Nothing answers at the URL (refused, unknown host, connect timeout)."""


class RemoteTimeoutError(RemoteError):
    """The server accepted the request but sent nothing for longer than the read timeout."""


class RemoteProtocolError(RemoteError):
    """The server's answer is not the OpenAI API: malformed SSE or JSON, or the stream broke off."""


class RemoteServerError(RemoteError):
    """The server answered with an error (an HTTP status, or an error event mid-stream). `status`: HTTP status or 0."""

    def __init__(self, subject: str, message: str, partial: str = "", status: int = 0):
        super().__init__(subject, message, partial)
        self.status = status


@dataclass(frozen=True)
class RemoteDoneEvent(DoneEvent):
    """DoneEvent plus what only a remote answer has: parsed tool calls and the server's finish_reason."""

    tool_calls: list = field(default_factory=list)
    finish_reason: str = ""


def iter_sse(lines: Iterable[str]) -> Iterator[str]:
    """The data of each server-sent event (multi-line data joined by newlines); comments and other fields skipped."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


_STOP_REASONS = {"stop": "eos", "length": "max_tokens", "tool_calls": "eos", "content_filter": "stop_string"}


class _Answer:
    """Accumulates a streamed answer: raw Qwen3-form text, tool calls, timing; makes the events."""

    def __init__(self, backend: str):
        self.t0 = time.perf_counter()
        self.parts: list[str] = []
        self.in_reasoning = False
        self.first_t: float | None = None
        self.last_t = 0.0
        self.pieces = 0
        self.calls: dict[int, dict] = {}
        self.finish_reason = ""
        self.usage: dict | None = None
        self.backend = backend

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def piece(self, text: str) -> TokenEvent:
        now = time.perf_counter() - self.t0
        if self.first_t is None:
            self.first_t = now
        self.last_t = now
        self.parts.append(text)
        self.pieces += 1
        return TokenEvent(-1, text, self.pieces - 1, now)

    def reasoning(self, text: str) -> list[TokenEvent]:
        out = []
        if not self.in_reasoning:
            self.in_reasoning = True
            text = "<think>\n" + text
        out.append(self.piece(text))
        return out

    def content(self, text: str) -> list[TokenEvent]:
        if self.in_reasoning:
            self.in_reasoning = False
            text = "\n</think>\n\n" + text
        return [self.piece(text)] if text else []

    def tool_call_delta(self, delta: dict) -> None:
        index = delta.get("index", len(self.calls))
        call = self.calls.setdefault(index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        call["id"] = delta.get("id") or call["id"]
        fn = delta.get("function") or {}
        call["function"]["name"] += fn.get("name") or ""
        call["function"]["arguments"] += fn.get("arguments") or ""

    def done(self, cancelled: bool = False) -> RemoteDoneEvent:
        m = RequestMetrics(backend=self.backend)
        usage = self.usage or {}
        m.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        m.reused_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        m.prefix_hit_rate = m.reused_tokens / m.prompt_tokens if m.prompt_tokens else 0.0
        m.generated_tokens = int(usage.get("completion_tokens") or self.pieces)
        m.ttft_s = self.first_t or 0.0
        m.prefill_s = m.ttft_s
        if m.prefill_s > 0 and m.prompt_tokens:
            m.prefill_tok_s = (m.prompt_tokens - m.reused_tokens) / m.prefill_s
        if self.first_t is not None:
            m.decode_s = self.last_t - self.first_t
            m.decode_tok_s = (m.generated_tokens - 1) / m.decode_s if m.generated_tokens > 1 and m.decode_s > 0 else 0.0
        m.stop_reason = "cancelled" if cancelled else _STOP_REASONS.get(self.finish_reason, self.finish_reason)
        calls = [self.calls[i] for i in sorted(self.calls)]
        return RemoteDoneEvent(self.text, [], m, calls, self.finish_reason)


class RemoteClient:
    """One OpenAI-compatible endpoint. base_url: e.g. http://127.0.0.1:8080/v1 (a URL without /v1 gets it added).
    model: the id to request (default: the first of /v1/models). Timeouts in seconds: connect, and read (the longest
    silence tolerated between two pieces of an answer)."""

    def __init__(self, base_url: str, api_key: str | None = None, *, model: str | None = None,
                 connect_timeout: float = 10.0, read_timeout: float = 300.0):
        import httpx

        url = base_url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise TesseraError("--remote", f"{base_url!r} is not an http:// or https:// URL")
        if not url.endswith("/v1"):
            url += "/v1"
        self.base_url, self.model, self.read_timeout = url, model, read_timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=url, headers=headers,
                                  timeout=httpx.Timeout(read_timeout, connect=connect_timeout))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RemoteClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- plain requests ----------------------------------------------------------------------------------------------

    def models(self) -> list[str]:
        """The model ids the server lists (GET /v1/models)."""
        body = self._json(self._request("GET", "/models"))
        try:
            return [m["id"] for m in body["data"]]
        except (KeyError, TypeError):
            raise RemoteProtocolError(self._subject, "GET /v1/models did not return a list of models") from None

    def check(self) -> dict:
        """A connection test: {"models": [...], "seconds": round trip}. Raises RemoteError with the reason."""
        t0 = time.perf_counter()
        models = self.models()
        return {"models": models, "seconds": time.perf_counter() - t0}

    def resolved_model(self) -> str:
        if self.model is None:
            models = self.models()
            if not models:
                raise RemoteServerError(self._subject, "lists no models (GET /v1/models)")
            self.model = models[0]
        return self.model

    # ---- streaming ---------------------------------------------------------------------------------------------------

    def chat(self, messages: list[dict], params: SamplingParams, *, enable_thinking: bool = True,
             tools: list[dict] | None = None,
             cancel: threading.Event | None = None) -> Iterator[TokenEvent | RemoteDoneEvent]:
        """Stream a chat answer (POST /v1/chat/completions). Assistant messages given in raw form (with a think block)
        are sent as the template renders them; the server's template drops earlier turns' thinking anyway."""
        body = {"model": self.resolved_model(), "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, **_sampling_fields(params),
                "chat_template_kwargs": {"enable_thinking": enable_thinking}}
        if tools:
            body["tools"] = tools
        return self._stream("/chat/completions", body, cancel, chat=True)

    def complete(self, prompt: str, params: SamplingParams, *,
                 cancel: threading.Event | None = None) -> Iterator[TokenEvent | RemoteDoneEvent]:
        """Stream a raw continuation (POST /v1/completions)."""
        body = {"model": self.resolved_model(), "prompt": prompt, "stream": True,
                "stream_options": {"include_usage": True}, **_sampling_fields(params)}
        return self._stream("/completions", body, cancel, chat=False)

    @property
    def _subject(self) -> str:
        return f"remote {self.base_url}"

    def _request(self, method: str, path: str, **kw):
        import httpx

        try:
            response = self._http.request(method, path, **kw)
        except httpx.TimeoutException as e:
            raise self._timeout_error(e, "") from None
        except httpx.TransportError as e:
            raise self._transport_error(e, "") from None
        self._raise_for_status(response, "")
        return response

    def _json(self, response):
        try:
            return response.json()
        except ValueError:
            raise RemoteProtocolError(self._subject, f"{response.request.url.path} did not answer JSON") from None

    def _timeout_error(self, e, partial: str) -> RemoteError:
        import httpx

        if isinstance(e, (httpx.ConnectTimeout, httpx.PoolTimeout)):
            return RemoteUnavailableError(self._subject, "did not accept the connection in time: is it running and "
                                                         "reachable?", partial)
        return RemoteTimeoutError(self._subject, f"sent nothing for {self.read_timeout:g} s: the server is too slow "
                                                 "or stuck", partial)

    def _transport_error(self, e, partial: str) -> RemoteError:
        import httpx

        if isinstance(e, httpx.ConnectError):
            return RemoteUnavailableError(self._subject, f"cannot connect ({e}): is the server running?", partial)
        return RemoteProtocolError(self._subject, f"the connection broke off mid-answer ({type(e).__name__}: {e})",
                                   partial)

    def _raise_for_status(self, response, partial: str) -> None:
        if response.status_code < 400:
            return
        try:
            response.read()
            error = response.json().get("error")
            message = error.get("message") if isinstance(error, dict) else str(error)
        except (ValueError, AttributeError):
            message = response.text[:300] or response.reason_phrase
        raise RemoteServerError(self._subject, f"answered HTTP {response.status_code}: {message}", partial,
                                response.status_code)

    def _stream(self, path: str, body: dict, cancel: threading.Event | None, *, chat: bool):
        import httpx

        answer = _Answer(backend=f"remote {self.model}")
        try:
            with self._http.stream("POST", path, json=body) as response:
                self._raise_for_status(response, "")
                finished = False
                for data in iter_sse(response.iter_lines()):
                    if cancel is not None and cancel.is_set():
                        break  # leaving the block closes the connection: the server cancels the generation
                    if data.strip() == "[DONE]":
                        finished = True
                        break
                    yield from self._events(data, answer, chat)
                if cancel is not None and cancel.is_set():
                    yield answer.done(cancelled=True)
                    return
                if not finished and not answer.finish_reason:
                    raise RemoteProtocolError(self._subject, "the stream ended before the answer was complete",
                                              answer.text)
        except httpx.TimeoutException as e:
            raise self._timeout_error(e, answer.text) from None
        except httpx.TransportError as e:
            raise self._transport_error(e, answer.text) from None
        yield answer.done()

    def _events(self, data: str, answer: _Answer, chat: bool) -> list[TokenEvent]:
        try:
            obj = json.loads(data)
        except ValueError:
            raise RemoteProtocolError(self._subject, f"sent an event that is not JSON: {data[:80]!r}",
                                      answer.text) from None
        if not isinstance(obj, dict):
            raise RemoteProtocolError(self._subject, f"sent an event that is not a JSON object: {data[:80]!r}",
                                      answer.text)
        if "error" in obj:
            error = obj["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise RemoteServerError(self._subject, f"stopped with an error: {message}", answer.text)
        if obj.get("usage"):
            answer.usage = obj["usage"]
        choices = obj.get("choices")
        if not isinstance(choices, list):
            raise RemoteProtocolError(self._subject, f"sent an event without choices: {data[:80]!r}", answer.text)
        events: list[TokenEvent] = []
        for choice in choices:
            if not isinstance(choice, dict):
                raise RemoteProtocolError(self._subject, "sent a malformed choice", answer.text)
            if chat:
                delta = choice.get("delta") or {}
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning:
                    events += answer.reasoning(reasoning)
                if delta.get("content"):
                    events += answer.content(delta["content"])
                for call in delta.get("tool_calls") or []:
                    answer.tool_call_delta(call)
            elif choice.get("text"):
                events.append(answer.piece(choice["text"]))
            if choice.get("finish_reason"):
                answer.finish_reason = choice["finish_reason"]
        return events


def _sampling_fields(p: SamplingParams) -> dict:
    """The request fields for SamplingParams (top_k, min_p and repetition_penalty are vLLM/llama-server extensions)."""
    fields = {"temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_tokens}
    if p.top_k:
        fields["top_k"] = p.top_k
    if p.min_p:
        fields["min_p"] = p.min_p
    if p.repetition_penalty != 1.0:
        fields["repetition_penalty"] = p.repetition_penalty
    if p.presence_penalty:
        fields["presence_penalty"] = p.presence_penalty
    if p.frequency_penalty:
        fields["frequency_penalty"] = p.frequency_penalty
    if p.seed is not None:
        fields["seed"] = p.seed
    if p.stop:
        fields["stop"] = list(p.stop)
    if p.ignore_eos:
        fields["ignore_eos"] = True
    return fields
