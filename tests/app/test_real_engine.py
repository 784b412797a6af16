"""The worker and the window against the real engine and a tiny generated model (make-model preset tiny, f32 GGUF):
streams and finishes, stops mid-stream, switches backend mid-conversation keeping the KV, feeds the graphs."""

from __future__ import annotations

import pytest
from app_fakes import data_dir  # noqa: F401 - fixture

from tessera.app.payloads import GenerationResult, ModelState, TokenChunk, WorkerError
from tessera.app.worker import EngineWorker

GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "seed": 0}


def load(qtbot, worker, path, backend="Auto") -> ModelState:
    errors: list[WorkerError] = []
    worker.failed.connect(errors.append)
    with qtbot.waitSignal(worker.state_changed, timeout=60000) as sig:
        worker.load(str(path), backend, 2, 4096)
    assert sig.args[0].loaded, errors
    return sig.args[0]


def chat(qtbot, worker, messages, **params) -> tuple[GenerationResult, list[TokenChunk]]:
    chunks: list[TokenChunk] = []
    worker.tokens.connect(chunks.append)
    try:
        with qtbot.waitSignal(worker.finished, timeout=60000) as sig:
            worker.generate(messages, {**GREEDY, **params}, False)
    finally:
        worker.tokens.disconnect(chunks.append)
    return sig.args[0], chunks


def test_streams_tokens_and_finishes(qtbot, real_worker, tiny_gguf_model):
    state = load(qtbot, real_worker, tiny_gguf_model)
    assert state.context_length == 1024  # the setting (4096) is clamped to the model's trained context
    assert state.backend and state.backend_reason
    result, chunks = chat(qtbot, real_worker, [{"role": "user", "content": "Hello there"}], max_tokens=12)
    assert not result.error
    assert "".join(c.text for c in chunks) == result.text
    assert 1 <= chunks[-1].total_tokens == result.metrics["generated_tokens"] <= 12
    assert result.metrics["stop_reason"] in ("eos", "max_tokens")
    assert (result.metrics["generated_tokens"] == 12) == (result.metrics["stop_reason"] == "max_tokens")
    assert result.metrics["prompt_tokens"] > 0 and result.metrics["ttft_s"] > 0
    steps = [s for c in chunks for s in c.steps]
    assert steps[0].phase == "prefill" and any(s.phase == "decode" for s in steps) or len(steps) == 1


def test_stop_mid_stream(qtbot, real_worker, tiny_gguf_model):
    load(qtbot, real_worker, tiny_gguf_model)
    real_worker.tokens.connect(lambda _c: real_worker.stop())
    result, _ = chat(qtbot, real_worker, [{"role": "user", "content": "Count"}], max_tokens=900, ignore_eos=True)
    assert result.metrics["stop_reason"] == "cancelled"
    assert 1 <= result.metrics["generated_tokens"] < 900


def test_backend_switch_mid_conversation_keeps_conversation_and_kv(qtbot, real_worker, tiny_gguf_model):
    with qtbot.waitSignal(real_worker.backends, timeout=60000) as sig:
        real_worker.query_backends()
    available = [n for n, (ok, _r) in sig.args[0].status.items() if ok and n not in ("Auto",)]
    load(qtbot, real_worker, tiny_gguf_model, backend="Torch")
    first = [{"role": "user", "content": "Remember seven"}]
    r1, _ = chat(qtbot, real_worker, first, max_tokens=8)
    target = next((n for n in ("Reference", "AVX512", "AVX2") if n in available), "Torch")
    with qtbot.waitSignal(real_worker.state_changed, timeout=60000) as sig:
        real_worker.set_backend(target)
    assert sig.args[0].backend == target
    history = first + [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "Which number?"}]
    r2, _ = chat(qtbot, real_worker, history, max_tokens=8)
    assert not r2.error and r2.metrics["backend"] == target
    assert r2.metrics["reused_tokens"] > 0 and r2.metrics["prefix_hit_rate"] > 0  # the KV of turn 1 was kept


def test_a_backend_without_room_anywhere_brings_the_model_back_on_its_backend(qtbot, real_worker, tiny_gguf_model,
                                                                             tmp_path, monkeypatch):
    """The new backend's packs fit neither beside the one in use nor alone (engine.native._check_room_to_pack, with no
    RAM free): the worker closes the model, tries the new backend, and loads the model back on its old one, whose
    packs the cache holds by then (written at the close); the user is told, and the next message is answered."""
    import tessera.engine.native as N

    monkeypatch.setenv("TESSERA_PACK_CACHE_DIR", str(tmp_path / "packed"))
    state = load(qtbot, real_worker, tiny_gguf_model, backend="Reference")
    errors: list[WorkerError] = []
    states: list[ModelState] = []
    real_worker.failed.connect(errors.append)
    real_worker.state_changed.connect(states.append)
    monkeypatch.setattr(N, "free_ram", lambda: 0)
    real_worker.set_backend("AMXBF16-emulated")
    qtbot.waitUntil(lambda: bool(errors) and any(s.loaded for s in states), timeout=60000)
    (error,) = errors
    assert "GB are free" in error.text and error.text.endswith(f"{tiny_gguf_model.name} was loaded again")
    assert states[-1].loaded and states[-1].backend == state.backend == "Reference"
    result, _ = chat(qtbot, real_worker, [{"role": "user", "content": "Still there?"}], max_tokens=4)
    assert not result.error and result.metrics["backend"] == "Reference"


@pytest.mark.slow
def test_window_chats_with_a_real_model(qtbot, data_dir, tiny_gguf_model):  # noqa: F811
    from tessera.app import paths
    from tessera.app.main_window import MainWindow
    from tessera.app.settings import Settings
    from tessera.app.store import ConversationStore

    settings = Settings(paths.settings_path())
    settings.set("sampling/max_tokens", 16)
    store = ConversationStore(paths.database_path())
    worker = EngineWorker()
    worker.start()
    w = MainWindow(settings, store, worker)
    qtbot.addWidget(w)
    try:
        with qtbot.waitSignal(w.model_ready, timeout=60000) as sig:
            w.load_model(str(tiny_gguf_model))
        assert sig.args[0] is True
        w.chat.prompt.setPlainText("Hi")
        w.chat.send_button.click()
        qtbot.waitUntil(lambda: w.controller.messages and not w.controller.busy, timeout=60000)
        reply = w.controller.messages[-1]
        assert reply.state == "done" and reply.metrics["generated_tokens"] >= 1
        assert w.graphs.requests == 1 and len(w.graphs.ttft) == 1
        assert store.messages(w.controller.conversation_id)[-1].metrics["stop_reason"] in ("eos", "max_tokens")
    finally:
        w.close()
        worker.shutdown()
        store.close()


@pytest.mark.slow
def test_test_drive_button_makes_and_loads_a_random_model(qtbot, data_dir):  # noqa: F811
    from tessera.app import paths
    from tessera.app.main_window import MainWindow
    from tessera.app.settings import Settings
    from tessera.app.store import ConversationStore

    store = ConversationStore(paths.database_path())
    worker = EngineWorker()
    worker.start()
    w = MainWindow(Settings(paths.settings_path()), store, worker)
    qtbot.addWidget(w)
    try:
        with qtbot.waitSignal(w.model_ready, timeout=120000) as sig:
            w.welcome.buttons["test_drive"].click()
        assert sig.args[0] is True, w.last_error
        made = list((data_dir / "test-drive").glob("*.gguf"))
        assert len(made) == 1 and w.state.path == str(made[0])
        assert w.pages.currentWidget() is w.chat
    finally:
        w.close()
        worker.shutdown()
        store.close()


def test_a_broken_file_fails_with_its_name_and_the_worker_survives(qtbot, real_worker, tmp_path, tiny_gguf_model):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    errors: list[WorkerError] = []
    real_worker.failed.connect(errors.append)
    with qtbot.waitSignal(real_worker.state_changed, timeout=60000) as sig:
        real_worker.load(str(bad))
    assert not sig.args[0].loaded
    assert errors and errors[0].operation == "load" and "broken.gguf" in errors[0].text
    assert errors[0].detail == ""  # a TesseraError: shown as a message, no traceback
    assert load(qtbot, real_worker, tiny_gguf_model).loaded
