"""Tool calls and mid-stream errors through the HTTP layer and the official `openai` client.

The demo model never writes a <tool_call>, so here the Session behind the server is a scripted stand-in that streams a
fixed Qwen3 answer through the real scheduler, Starlette app and uvicorn. What is under test is the server's output
(tool_calls deltas with their index, finish_reason, error events) as the official client reads it, not the model."""

from __future__ import annotations

import json

import openai
import pytest
from server_support import NAME, running_server

from tessera.engine.chat_tokens import ChatPrompt
from tessera.engine.errors import TesseraError
from tessera.engine.events import DoneEvent, RequestMetrics, TokenEvent

ANSWER = ("<think>\nThe user wants the weather.\n</think>\n\nChecking.\n"
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
          "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


class ScriptedSession:
    """Streams `text` in 3-character pieces (then fails, if `fail_after` is set); counts what it was asked."""

    context_length = 2048
    backend_name = "scripted"

    def __init__(self, text: str, fail_after: int | None = None):
        self.text, self.fail_after, self.tools_seen = text, fail_after, []

    def prepare_chat(self, messages, *, enable_thinking=True, tools=None, allow_special_tokens=False):
        self.tools_seen.append(tools)
        return ChatPrompt("<|im_start|>assistant\n", [1, 2, 3])

    def generate(self, prompt_ids, params, *, cancel=None, on_step=None):
        return self._stream()

    def _stream(self):
        pieces = [self.text[i:i + 3] for i in range(0, len(self.text), 3)]
        for i, piece in enumerate(pieces):
            if self.fail_after is not None and i == self.fail_after:
                raise TesseraError("engine", "ran out of memory")
            yield TokenEvent(i, piece, i, 0.001 * i)
        yield DoneEvent(self.text, list(range(len(pieces) + 1)),
                        RequestMetrics(prompt_tokens=10, reused_tokens=4, generated_tokens=len(pieces) + 1,
                                       stop_reason="eos"))


def client_of(srv):
    return openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=60)


def test_tool_calls_whole_and_streamed():
    session = ScriptedSession(ANSWER)
    with running_server(session) as srv:
        client = client_of(srv)
        reply = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Weather?"}],
                                               tools=TOOLS)
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls" and session.tools_seen == [TOOLS]
        assert message.content == "Checking." and message.model_extra["reasoning_content"] == \
            "The user wants the weather."
        assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
            ("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]
        assert reply.usage.prompt_tokens_details.cached_tokens == 4

        chunks = list(client.chat.completions.create(model=NAME, stream=True, tools=TOOLS,
                                                     messages=[{"role": "user", "content": "Weather?"}]))
        calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        assert [(tc.index, tc.function.name) for tc in calls] == [(0, "get_weather"), (1, "get_time")]
        assert all(tc.id.startswith("call_") and tc.type == "function" for tc in calls)
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks)
        assert content == "Checking." and reasoning == "The user wants the weather."
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_without_tools_the_call_text_stays_content():
    with running_server(ScriptedSession(ANSWER)) as srv:
        reply = client_of(srv).chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}])
    assert reply.choices[0].message.tool_calls is None and "<tool_call>" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


def test_an_engine_error_mid_stream_reaches_the_client():
    with running_server(ScriptedSession(ANSWER, fail_after=5)) as srv:
        client = client_of(srv)
        got = []
        with pytest.raises(openai.APIError) as e:
            for chunk in client.chat.completions.create(model=NAME, stream=True,
                                                        messages=[{"role": "user", "content": "x"}]):
                got.append(chunk)
        assert "ran out of memory" in str(e.value.message)
        assert got and srv.scheduler.stats["failed"] == 1
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}])
        assert "ran out of memory" in e.value.body["message"]
