"""The worker's Remote engine: chat through a real `serve` on 127.0.0.1 (greedy equal to the local engine, TTFT and
prefix reuse from the stream); a server that is down or lacks the model is an error in words, nothing loaded."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from app_fakes import data_dir  # noqa: F401 - fixture

from tessera import engine
from tessera.engine.sampling import SamplingParams
from tessera.engine.scheduler import EngineScheduler
from tessera.engine.server.app import ServerOptions
from tessera.engine.server.run import ServerThread

DEMO = Path(__file__).resolve().parents[2] / "tessera" / "resources" / "demo" / "tessera-demo-moe.gguf"
GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "seed": 0,
          "max_tokens": 120}
ASK = [{"role": "user", "content": "What is 347 + 589?"}]


@pytest.fixture(scope="module")
def server():
    session = engine.load(DEMO)
    scheduler = EngineScheduler(session)
    srv = ServerThread(scheduler, ServerOptions("tessera-demo-moe", "k")).start()
    yield srv, session
    srv.stop()
    scheduler.close()
    session.close()


def test_remote_chat_matches_the_local_engine(qtbot, real_worker, server):
    srv, session = server
    # The local answer first, while the server is idle: the session serves one request at a time, and the server's
    # scheduler thread may still be finishing the stream's job (releasing the session) when the worker's `finished`
    # arrives, so calling the session directly after it raced with that thread.
    local = list(session.chat(ASK, SamplingParams(temperature=0, top_k=0, top_p=1.0, max_tokens=120)))[-1]
    with qtbot.waitSignal(real_worker.state_changed, timeout=30000) as sig:
        real_worker.connect_remote(srv.url, "k", "")
    state = sig.args[0]
    assert state.loaded and state.backend == "remote" and state.name == "tessera-demo-moe (remote)"
    chunks = []
    real_worker.tokens.connect(chunks.append)
    with qtbot.waitSignal(real_worker.finished, timeout=60000) as sig:
        real_worker.generate(ASK, GREEDY, True)
    result = sig.args[0]
    decode = [st for c in chunks for st in c.steps]
    assert decode and all(st.phase == "decode" and st.seconds >= 0 for st in decode)  # the tok/s graph's input
    assert not result.error and result.text.strip() == local.text.split("</think>")[-1].strip()
    assert result.metrics["ttft_s"] > 0 and result.metrics["prompt_tokens"] == local.metrics.prompt_tokens
    with qtbot.waitSignal(real_worker.finished, timeout=60000) as sig:
        real_worker.generate(ASK, GREEDY, True)
    assert sig.args[0].metrics["reused_tokens"] > 0  # the server's prefix cache, seen through cached_tokens
    errors = []
    real_worker.failed.connect(errors.append)
    with qtbot.waitSignal(real_worker.failed, timeout=10000):
        real_worker.set_backend("Torch")
    assert "chosen on the server" in errors[-1].message


def test_down_or_wrong_model_is_said_in_words(qtbot, real_worker, server):
    srv, _ = server
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with qtbot.waitSignal(real_worker.failed, timeout=30000) as sig:
        real_worker.connect_remote(f"http://127.0.0.1:{port}/v1", "", "")
    assert sig.args[0].operation == "connect" and "is the server running" in sig.args[0].message
    with qtbot.waitSignal(real_worker.failed, timeout=30000) as sig:
        real_worker.connect_remote(srv.url, "k", "qwen3-235b")
    assert "is not served there" in sig.args[0].message and "tessera-demo-moe" in sig.args[0].message
    with qtbot.waitSignal(real_worker.failed, timeout=30000) as sig:
        real_worker.connect_remote(srv.url, "wrong", "")
    assert "401" in sig.args[0].message
