"""tessera/app/serving.py: the app's loaded Session served over the OpenAI API while the app's own chat keeps using it;
both go through one scheduler, so interleaved requests give the answers each would alone."""

from __future__ import annotations

import threading
from pathlib import Path

import openai
import pytest

from tessera import engine
from tessera.app.serving import LocalServer, new_api_key
from tessera.engine.events import DoneEvent
from tessera.engine.sampling import SamplingParams

DEMO = Path(__file__).resolve().parents[2] / "tessera" / "resources" / "demo" / "tessera-demo-moe.gguf"
GREEDY = SamplingParams(temperature=0, max_tokens=120)


def ask(text):
    return [{"role": "user", "content": text}]


def answer(text):
    return text.split("</think>")[-1].strip()


@pytest.fixture(scope="module")
def sessions():
    served, alone = engine.load(DEMO), engine.load(DEMO)
    yield served, alone
    served.close()
    alone.close()


def test_app_chat_and_server_clients_share_the_session(sessions):
    served, alone = sessions
    key = new_api_key()
    server = LocalServer(served, model_path=str(DEMO), port=0, api_key=key)
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.model_name == "tessera-demo-moe"
        client = openai.OpenAI(base_url=server.url, api_key=key, max_retries=0, timeout=120)
        remote_answers = {}

        def remote(text):
            reply = client.chat.completions.create(model=server.model_name, messages=ask(text), temperature=0,
                                                   max_tokens=120)
            remote_answers[text] = reply.choices[0].message.content

        threads = [threading.Thread(target=remote, args=(t,)) for t in ("Sort [9, 2, 5].", "What is 12 + 30?")]
        for t in threads:
            t.start()
        steps = []
        events = list(server.chat(ask("How many r's are in strawberry?"), GREEDY, on_step=steps.append))
        for t in threads:
            t.join(120)
        assert isinstance(events[-1], DoneEvent) and steps and steps[0].phase == "prefill"
        local = {t: answer(list(alone.chat(ask(t), GREEDY))[-1].text)
                 for t in ("Sort [9, 2, 5].", "What is 12 + 30?", "How many r's are in strawberry?")}
        assert answer(events[-1].text) == local["How many r's are in strawberry?"]
        assert remote_answers == {t: local[t] for t in remote_answers} and len(remote_answers) == 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0).models.list()
        assert server.call(lambda s: s.context_length) == served.context_length
    finally:
        server.stop()
    # the session is still loaded and usable directly once serving stops
    assert answer(list(served.chat(ask("What is 12 + 30?"), GREEDY))[-1].text) == "ones: 2 + 0 = 2. tens: 1 + 3 = 4. " \
        "So 12 + 30 = 42."


def test_stopping_early_cancels_the_app_request(sessions):
    served, _ = sessions
    server = LocalServer(served, model_path=str(DEMO), port=0)
    try:
        events = server.chat(ask("Sort [1, 2]."), SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True))
        for i, _ in enumerate(events):
            if i == 2:
                break
        events.close()
        server.call(lambda s: None)  # runs after the cancelled request has ended
        assert server.scheduler.stats["cancelled"] == 1 and server.scheduler.stats["cancelled_tokens"] < 200
    finally:
        server.stop()


def test_keys_are_random_and_long():
    a, b = new_api_key(), new_api_key()
    assert a != b and len(a) >= 30
