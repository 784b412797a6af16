"""The server over plain HTTP (httpx): malformed requests, OpenAI error shapes and statuses, API keys, the bounded
queue (429), body and prompt limits, concurrent clients, and clients that disconnect (queued, streaming, waiting)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_support import NAME, engine_held, running_server, wait_until

from tessera.engine.errors import TesseraError
from tessera.engine.sampling import SamplingParams
from tessera.engine.server.run import check_bind


def chat_body(text="What is 347 + 589?", **kw):
    return {"model": NAME, "messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 120,
            **kw}


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def error_of(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize("body,param,words", [
    ({"model": NAME}, "messages", "non-empty list"),
    ({"model": NAME, "messages": "hi"}, "messages", "non-empty list"),
    (chat_body() | {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "wizard"),
    (chat_body() | {"messages": [{"role": "user"}]}, "messages[0].content", "missing"),
    (chat_body() | {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]", "image_url"),
    (chat_body(temperature="hot"), "temperature", "number"),
    (chat_body(temperature=3), "temperature", "[0, 2]"),
    (chat_body(top_p=0), "top_p", "(0, 1]"),
    (chat_body(max_tokens=0), "max_tokens", ">= 1"),
    (chat_body(stop=["a", "b", "c", "d", "e"]), "stop", "at most 4"),
    (chat_body(n=2), "n", "n = 1"),
    (chat_body(logprobs=True), "logprobs", "not supported"),
    (chat_body(response_format={"type": "json_object"}), "response_format", "JSON"),
    (chat_body(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="required"), "tool_choice",
     "auto"),
    (chat_body(tools=[{"type": "retrieval"}]), "tools[0]", "function"),
    (chat_body(chat_template_kwargs={"enable_thinking": "no"}), "enable_thinking", "true or false"),
    (chat_body(chat_template_kwargs={"add_vision_id": True}), "chat_template_kwargs.add_vision_id", "enable_thinking"),
    (chat_body(stream_options=True), "stream_options", "include_usage"),
])
def test_bad_fields_are_400s_that_name_the_field(http, body, param, words):
    error = error_of(http.post("/chat/completions", json=body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param or error["message"].startswith(param)
    assert words in error["message"]


def test_malformed_bodies(http):
    assert error_of(http.post("/chat/completions", content=b"{nope"), 400)["code"] == "invalid_json"
    assert error_of(http.post("/chat/completions", content=b"\xff\xfe"), 400)["code"] == "invalid_json"
    assert "JSON object" in error_of(http.post("/chat/completions", json=[1, 2]), 400)["message"]
    assert error_of(http.post("/completions", json={"model": NAME, "prompt": ["a", "b"]}), 400)["param"] == "prompt"
    assert error_of(http.post("/completions", json={"model": NAME, "prompt": [1, 99999]}), 400)["message"].startswith(
        "prompt: token id 99999")


def test_unknown_routes_and_methods_use_the_error_shape(http):
    assert error_of(http.get("/nowhere"), 404)["type"] == "not_found_error"
    assert error_of(http.get("/chat/completions"), 405)["message"].startswith("GET /v1/chat/completions")


def test_model_must_be_the_served_one(http):
    error = error_of(http.post("/chat/completions", json=chat_body() | {"model": "gpt-4o"}), 404)
    assert error["code"] == "model_not_found" and NAME in error["message"]
    assert error_of(http.post("/chat/completions", json={"messages": []}), 400)["param"] == "model"


def test_prompt_longer_than_the_context_is_refused_before_queueing(http, served_session):
    long_text = "count " * (served_session.context_length + 10)
    error = error_of(http.post("/chat/completions", json=chat_body(long_text)), 400)
    assert error["code"] == "context_length_exceeded" and "do not fit" in error["message"]


def test_health_reports_the_engine(server):
    health = httpx.get(server.root + "/health").json()
    assert health["status"] == "ok" and health["model"] == NAME and health["max_waiting"] == 8
    assert set(health["requests"]) >= {"completed", "cancelled", "failed"}


def test_api_key_is_required_on_v1_but_not_health(served_session):
    with running_server(served_session, api_key="s3cret") as srv:
        assert httpx.get(srv.root + "/health").status_code == 200
        assert error_of(httpx.get(srv.url + "/models"), 401)["code"] == "invalid_api_key"
        bad = httpx.get(srv.url + "/models", headers={"Authorization": "Bearer nope"})
        assert "Incorrect API key" in error_of(bad, 401)["message"]
        assert error_of(httpx.post(srv.url + "/chat/completions", json=chat_body()), 401)["code"] == "invalid_api_key"
        good = httpx.get(srv.url + "/models", headers={"Authorization": "Bearer s3cret"})
        assert good.status_code == 200 and good.json()["data"][0]["id"] == NAME


def test_other_addresses_need_a_key():
    with pytest.raises(TesseraError) as e:
        check_bind("0.0.0.0", None)
    assert e.value.subject == "--host" and "--api-key" in e.value.message
    check_bind("0.0.0.0", "k")
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("localhost", None)


def test_request_bodies_are_bounded(served_session):
    with running_server(served_session, max_body_bytes=2048) as srv:
        big = chat_body("x" * 5000)
        error = error_of(httpx.post(srv.url + "/chat/completions", json=big), 413)
        assert error["code"] == "request_too_large" and "2048" in error["message"]

        def chunks():  # no Content-Length: the limit is enforced while reading
            data = json.dumps(big).encode()
            for i in range(0, len(data), 512):
                yield data[i:i + 512]

        assert error_of(httpx.post(srv.url + "/chat/completions", content=chunks()), 413)["code"] == \
            "request_too_large"
        assert httpx.post(srv.url + "/chat/completions", json=chat_body()).status_code == 200


def test_full_queue_answers_429_and_a_freed_slot_is_reusable(served_session):
    with running_server(served_session, max_waiting=1) as srv, httpx.Client(timeout=60) as client:
        with engine_held(srv.scheduler):
            with client.stream("POST", srv.url + "/chat/completions", json=chat_body(stream=True)) as queued:
                assert queued.status_code == 200
                wait_until(lambda: srv.scheduler.waiting == 1, what="the first request to queue")
                error = error_of(client.post(srv.url + "/chat/completions", json=chat_body()), 429)
                assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
            wait_until(lambda: srv.scheduler.waiting == 0, what="the disconnected request to leave the queue")
            # a client that disconnected while queued frees its slot without running
            assert srv.scheduler.stats["cancelled"] == 1 and srv.scheduler.stats["cancelled_tokens"] == 0
            with pytest.raises(httpx.ReadTimeout):  # a non-streaming client that gives up while queued
                client.post(srv.url + "/chat/completions", json=chat_body(), timeout=httpx.Timeout(60, read=0.5))
            wait_until(lambda: srv.scheduler.waiting == 0, what="the timed-out request to leave the queue")
            assert srv.scheduler.stats["cancelled"] == 2
        reply = client.post(srv.url + "/chat/completions", json=chat_body())
        assert reply.status_code == 200 and srv.scheduler.stats["completed"] == 1


def test_disconnect_mid_stream_cancels_the_generation(server, http):
    body = {"model": NAME, "prompt": "Sort [5, 3].", "temperature": 0, "max_tokens": 1500, "ignore_eos": True,
            "stream": True}
    stats = server.scheduler.stats
    before = dict(stats)
    with http.stream("POST", "/completions", json=body) as response:
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen == 5:
                break
    wait_until(lambda: stats["cancelled"] == before["cancelled"] + 1, what="the generation to be cancelled")
    cancelled_tokens = stats["cancelled_tokens"] - before["cancelled_tokens"]
    # Far fewer than asked for: the engine stopped once the server saw the disconnect (a token or so later).
    assert 5 <= cancelled_tokens < 500
    assert not server.scheduler.busy


def test_concurrent_clients_each_get_their_own_answer(http, reference_session):
    prompts = ["What is 347 + 589?", "Sort [3, 14, 1, 59].", "How many r's are in strawberry?",
               "Reverse the list [3, 14, 1, 59].", "Subtract 289 from 734.", "What is 12 + 30?"]

    def ask(text):
        reply = http.post("/chat/completions", json=chat_body(text, stream=False))
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(ask, prompts))
    for text, answer in zip(prompts, answers):
        done = list(reference_session.chat([{"role": "user", "content": text}],
                                           SamplingParams(temperature=0, max_tokens=120)))[-1]
        assert answer == done.text.split("</think>")[-1].strip()


def test_streams_from_threads_interleave_without_mixing(server, reference_session):
    results = {}

    def stream(text):
        parts = []
        with httpx.Client(base_url=server.url, timeout=120) as client, \
                client.stream("POST", "/chat/completions", json=chat_body(text, stream=True)) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    parts.append(delta.get("content") or "")
        results[text] = "".join(parts)

    texts = ["Sort [9, 8, 7].", "Sort [1, 5, 2]."]
    threads = [threading.Thread(target=stream, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results["Sort [9, 8, 7]."] == "[7, 8, 9]"
    for text in texts:
        done = list(reference_session.chat([{"role": "user", "content": text}],
                                           SamplingParams(temperature=0, max_tokens=120)))[-1]
        assert results[text] == done.text.split("</think>")[-1].strip()
