"""engine.remote.RemoteClient and `tessera-cli generate/chat --remote` against a real `serve` on 127.0.0.1: greedy
answers equal the local engine's; a server that is down, slow, malformed or failing mid-stream gives a named error
that keeps the partial reply."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import threading

import pytest
from server_support import NAME, serving_app, wait_until
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tessera.engine.cli import main as cli
from tessera.engine.remote import (
    RemoteClient,
    RemoteDoneEvent,
    RemoteProtocolError,
    RemoteServerError,
    RemoteTimeoutError,
    RemoteUnavailableError,
    iter_sse,
)
from tessera.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=120)
SUM = [{"role": "user", "content": "What is 347 + 589?"}]


def answer_of(text: str) -> str:
    return text.split("</think>")[-1].strip()


@pytest.fixture
def remote(server):
    with RemoteClient(server.url) as client:
        yield client


def test_models_and_connection_check(remote):
    assert remote.models() == [NAME]
    check = remote.check()
    assert check["models"] == [NAME] and check["seconds"] > 0
    assert remote.resolved_model() == NAME


def test_remote_chat_equals_local_greedy_with_metrics(remote, server, reference_session):
    server.scheduler.call(lambda s: s.reset_cache()).result(30)
    events = list(remote.chat(SUM, GREEDY))
    done = events[-1]
    local = list(reference_session.chat(SUM, GREEDY))[-1]
    assert isinstance(done, RemoteDoneEvent) and done.finish_reason == "stop"
    assert answer_of(done.text) == answer_of(local.text) and "936" in done.text
    assert "".join(e.text for e in events[:-1]) == done.text
    m = done.metrics
    assert m.prompt_tokens == local.metrics.prompt_tokens and m.generated_tokens == len(local.token_ids)
    assert m.reused_tokens == 0 and m.ttft_s > 0 and m.decode_tok_s > 0 and m.stop_reason == "eos"
    again = list(remote.chat(SUM, GREEDY))[-1].metrics
    assert again.reused_tokens == m.prompt_tokens - 1 and again.prefix_hit_rate > 0.9  # the prefix cache, remotely


def test_remote_completion_equals_session_generate(remote, reference_session):
    prompt = "<|im_start|>user\nSort [3, 14, 1, 59].<|im_end|>\n<|im_start|>assistant\n"
    local = list(reference_session.generate(reference_session.tokenizer.encode(prompt),
                                            SamplingParams(temperature=0, max_tokens=40)))[-1]
    done = list(remote.complete(prompt, SamplingParams(temperature=0, max_tokens=40)))[-1]
    assert done.text == local.text


def test_cancel_closes_the_stream_and_the_server_stops(remote, server):
    cancel = threading.Event()
    before = server.scheduler.stats["cancelled"]
    events = []
    for event in remote.complete("Sort [1, 2].", SamplingParams(temperature=0, max_tokens=1500, ignore_eos=True),
                                 cancel=cancel):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    assert events[-1].metrics.stop_reason == "cancelled" and len(events) == 4
    wait_until(lambda: server.scheduler.stats["cancelled"] == before + 1, what="the server to cancel")


def test_cli_generate_remote_matches_local(server, reference_session, capsys):
    assert cli(["generate", "--remote", server.url, "--chat", "--prompt", "What is 347 + 589?", "--temperature", "0",
                "--max-tokens", "120", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    local = list(reference_session.chat(SUM, GREEDY))[-1]
    assert answer_of(out["text"]) == answer_of(local.text)
    assert out["metrics"]["prompt_tokens"] == local.metrics.prompt_tokens
    assert cli(["generate", "--remote", server.url, "--model", NAME, "--prompt", "Sort", "--temperature", "0",
                "--max-tokens", "5"]) == 0
    assert "stop max_tokens" in capsys.readouterr().out


def test_cli_chat_remote_keeps_the_conversation(server, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 12 + 30?\nSort [9, 2, 5].\n/exit\n"))
    assert cli(["chat", "--remote", server.url, "--temperature", "0", "--max-tokens", "120"]) == 0
    out = capsys.readouterr().out
    assert "12 + 30 = 42." in out and out.count("[prompt ") == 2
    reused = [int(part.split("reused ")[1].split(")")[0]) for part in out.split("[prompt ")[1:]]
    assert reused[1] > 0  # the second turn reused the first turn's KV on the server


def test_cli_remote_usage_errors(capsys):
    assert cli(["generate", "--prompt", "x"]) == 2
    assert "give a model file or folder, or --remote URL" in capsys.readouterr().err
    assert cli(["generate", "m.gguf", "--remote", "http://127.0.0.1:1/v1", "--prompt", "x"]) == 2
    assert cli(["generate", "--remote", "http://127.0.0.1:1/v1", "--threads", "2", "--prompt", "x"]) == 2
    assert "--threads" in capsys.readouterr().err


def test_wrong_key_is_a_server_error_with_the_status(served_session):
    from server_support import running_server

    with running_server(served_session, api_key="right") as srv, RemoteClient(srv.url, "wrong") as client:
        with pytest.raises(RemoteServerError) as e:
            client.models()
    assert e.value.status == 401 and "Incorrect API key" in e.value.message


def test_server_down_is_unavailable(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again at once: nothing listens there
    with RemoteClient(f"http://127.0.0.1:{port}", connect_timeout=5) as client, \
            pytest.raises(RemoteUnavailableError) as e:
        list(client.chat(SUM, GREEDY))
    assert e.value.subject == f"remote http://127.0.0.1:{port}/v1" and "is the server running" in e.value.message
    assert cli(["generate", "--remote", f"http://127.0.0.1:{port}", "--chat", "--prompt", "hi"]) == 1
    assert "error: remote http://127.0.0.1" in capsys.readouterr().err


# ---- misbehaving servers, scripted: each sends two good pieces, then its fault --------------------------------------

def _chunk(content: str) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}) \
        + "\n\n"


def scripted(fault: str):
    async def models(request):
        from starlette.responses import JSONResponse

        return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def chat(request):
        async def body():
            yield ": a comment line, ignored\n\n"
            yield _chunk("Hello")
            yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": " wor"}}]}) + "\n\n"
            if fault == "slow":
                await asyncio.sleep(5)
            elif fault == "malformed":
                yield "data: {not json\n\n"
            elif fault == "error":
                yield "data: " + json.dumps({"error": {"message": "out of memory on node 3", "code": 500}}) + "\n\n"
            elif fault == "cut":
                return
            yield _chunk("ld")
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.mark.parametrize("fault,error,words", [
    ("slow", RemoteTimeoutError, "sent nothing for 0.5 s"),
    ("malformed", RemoteProtocolError, "not JSON"),
    ("error", RemoteServerError, "out of memory on node 3"),
    ("cut", RemoteProtocolError, "ended before the answer was complete"),
])
def test_faults_mid_stream_keep_the_partial_reply(fault, error, words):
    with serving_app(scripted(fault)) as url, RemoteClient(url, read_timeout=0.5) as client:
        got = []
        with pytest.raises(error) as e:
            for event in client.chat(SUM, GREEDY):
                got.append(event.text)
    assert words in e.value.message
    assert e.value.partial == "Hello wor" == "".join(got)


def test_a_well_behaved_scripted_server_completes():
    with serving_app(scripted("none")) as url, RemoteClient(url) as client:
        done = list(client.chat(SUM, GREEDY))[-1]
    assert done.text == "Hello world" and done.metrics.generated_tokens == 3


def test_sse_parser_follows_the_format():
    lines = [": comment", "data: a", "data:b", "", "event: x", "id: 3", "", "data: {\"k\":", "data:  1}", ""]
    assert list(iter_sse(lines)) == ["a\nb", "{\"k\":\n 1}"]
