"""The worker's "Serve this model": the loaded demo model served with a fresh key while the app's chat keeps working
through the same engine; a backend switch while serving; unloading stops the server."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from app_fakes import data_dir  # noqa: F401 - fixture

DEMO = Path(__file__).resolve().parents[2] / "tessera" / "resources" / "demo" / "tessera-demo-moe.gguf"
GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "seed": 0,
          "max_tokens": 120}


def test_serve_toggle_shares_the_engine_with_the_chat(qtbot, real_worker):
    with qtbot.waitSignal(real_worker.state_changed, timeout=60000) as sig:
        real_worker.load(str(DEMO), "Auto", 2, 0)
    assert sig.args[0].loaded
    with qtbot.waitSignal(real_worker.serving, timeout=30000) as sig:
        real_worker.serve(True, port=0)
    state = sig.args[0]
    assert state.running and state.url.startswith("http://127.0.0.1:") and state.api_key.startswith("tsk-")
    assert state.model == "tessera-demo-moe"
    client = openai.OpenAI(base_url=state.url, api_key=state.api_key, max_retries=0, timeout=60)
    reply = client.chat.completions.create(model=state.model, temperature=0, max_tokens=120,
                                           messages=[{"role": "user", "content": "What is 12 + 30?"}])
    assert reply.choices[0].message.content.endswith("12 + 30 = 42.")
    with qtbot.waitSignal(real_worker.finished, timeout=60000) as sig:
        real_worker.generate([{"role": "user", "content": "What is 12 + 30?"}], GREEDY, False)
    result = sig.args[0]
    assert not result.error and result.text.endswith("12 + 30 = 42.")
    assert result.metrics["reused_tokens"] > 0  # the server's request left this prompt's prefix in the shared cache
    with qtbot.waitSignal(real_worker.state_changed, timeout=60000) as sig:
        real_worker.set_backend("Torch")
    assert sig.args[0].backend == "Torch"
    assert client.models.list().data[0].model_extra["backend"] == "Torch"
    with qtbot.waitSignal(real_worker.serving, timeout=30000) as sig:
        real_worker.unload()
    assert not sig.args[0].running
    with pytest.raises(httpx.ConnectError):
        httpx.get(state.url.removesuffix("/v1") + "/health", timeout=5)


def test_serving_without_a_model_says_so(qtbot, real_worker):
    with qtbot.waitSignal(real_worker.serving, timeout=30000) as sig:
        real_worker.serve(True, port=0)
    assert not sig.args[0].running and "no model is loaded" in sig.args[0].error
