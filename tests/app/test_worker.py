"""EngineWorker against the engine test double: queued commands run on the worker thread; results come back as
signals with dataclass payloads; stop and cancel are honoured; failures become `failed` and the thread survives."""

from __future__ import annotations

from tessera.app.payloads import GenerationResult, LoadProgress, ModelState, TokenChunk, WorkerError

PARAMS = {"temperature": 0.0, "max_tokens": 64}


def load(qtbot, worker, path="/models/good.gguf") -> ModelState:
    with qtbot.waitSignal(worker.state_changed, timeout=5000) as sig:
        worker.load(path, "Auto", 2, 1024)
    return sig.args[0]


def test_load_runs_on_the_worker_thread_and_reports_progress(qtbot, worker, fake_api):
    progress: list[LoadProgress] = []
    worker.progress.connect(progress.append)
    state = load(qtbot, worker)
    assert state.loaded and state.backend == "AVX512" and state.backend_reason
    assert state.context_length == 1024 and state.name == "good.gguf"
    assert fake_api.threads_seen == ["tessera-engine"] or fake_api.threads_seen[0] != "MainThread"
    assert progress and progress[-1].done == progress[-1].total == 5


def test_the_gpu_placement_setting_reaches_the_engine_on_each_load(qtbot, worker, fake_api):
    load(qtbot, worker)
    with qtbot.waitSignal(worker.state_changed, timeout=5000):
        worker.load("/models/good.gguf", "Auto", 2, 1024, "twin", 2)
    assert fake_api.placements_seen == [("off", 0), ("twin", 2)]


def test_generate_streams_tokens_and_finishes(qtbot, worker):
    load(qtbot, worker)
    chunks: list[TokenChunk] = []
    worker.tokens.connect(chunks.append)
    with qtbot.waitSignal(worker.finished, timeout=5000) as sig:
        rid = worker.generate([{"role": "user", "content": "hi"}], PARAMS, True)
    result: GenerationResult = sig.args[0]
    assert result.request_id == rid and not result.error
    assert "".join(c.text for c in chunks) == result.text == "<think>\nlet me think\n</think>\n\nHello there!"
    assert chunks[-1].total_tokens == 8
    assert any(s.phase == "prefill" for c in chunks for s in c.steps)
    assert result.metrics["stop_reason"] == "eos" and result.metrics["decode_tok_s"] == 25.0


def test_stop_mid_stream(qtbot, worker, fake_api):
    fake_api.token_delay = 0.02
    load(qtbot, worker)
    fake_api.sessions[-1].reply_words = ["word "] * 500
    chunks: list[TokenChunk] = []
    worker.tokens.connect(chunks.append)
    worker.tokens.connect(lambda _c: worker.stop())
    with qtbot.waitSignal(worker.finished, timeout=10000) as sig:
        worker.generate([{"role": "user", "content": "go on"}], {"max_tokens": 500}, False)
    result: GenerationResult = sig.args[0]
    assert result.metrics["stop_reason"] == "cancelled"
    assert 1 <= result.metrics["generated_tokens"] < 20


def test_failing_load_emits_failed_and_worker_survives(qtbot, worker):
    errors: list[WorkerError] = []
    worker.failed.connect(errors.append)
    state = load(qtbot, worker, "/models/bad.gguf")
    assert not state.loaded
    assert errors[0].operation == "load" and errors[0].subject == "/models/bad.gguf"
    assert "bad magic" in errors[0].message and errors[0].detail == ""  # user-fixable: no traceback
    assert load(qtbot, worker).loaded  # the thread is still alive


def test_generate_error_is_reported(qtbot, worker, fake_api):
    load(qtbot, worker)
    fake_api.sessions[-1].fail_next = True
    errors: list[WorkerError] = []
    worker.failed.connect(errors.append)
    with qtbot.waitSignal(worker.finished, timeout=5000) as sig:
        worker.generate([{"role": "user", "content": "x"}], PARAMS, True)
    err, result = errors[0], sig.args[0]
    assert err.subject == "tensor blk.0.ffn_up_exps" and "NaN" in result.error


def test_generate_without_model_fails_cleanly(qtbot, worker):
    with qtbot.waitSignal(worker.failed, timeout=5000) as sig:
        worker.generate([{"role": "user", "content": "x"}], PARAMS, True)
    assert sig.args[0].subject == "model" and "no model is loaded" in sig.args[0].message


def test_cancel_load(qtbot, worker, fake_api):
    fake_api.load_delay = 2.0
    errors: list[WorkerError] = []
    worker.failed.connect(errors.append)
    with qtbot.waitSignal(worker.state_changed, timeout=5000) as sig:
        worker.load("/models/slow.gguf")
        qtbot.wait(100)
        worker.cancel_load()
    assert not sig.args[0].loaded and errors[0].cancelled and "cancelled" in errors[0].message
    assert errors[0].subject == "/models/slow.gguf"


def test_switch_backend_keeps_the_session(qtbot, worker, fake_api):
    load(qtbot, worker)
    session = fake_api.sessions[-1]
    progress: list[LoadProgress] = []
    worker.progress.connect(progress.append)
    with qtbot.waitSignal(worker.state_changed, timeout=5000) as sig:
        worker.set_backend("Reference")
    assert sig.args[0].backend == "Reference" and fake_api.sessions[-1] is session
    assert {p.operation for p in progress} == {"repack"} and progress[-1].done == progress[-1].total == 3
    with qtbot.waitSignal(worker.failed, timeout=5000) as sig:
        worker.set_backend("AMXInt8")
    assert sig.args[0].operation == "backend" and "amx_int8" in sig.args[0].message


def test_unload_closes_the_session(qtbot, worker, fake_api):
    load(qtbot, worker)
    with qtbot.waitSignal(worker.state_changed, timeout=5000) as sig:
        worker.unload()
    assert not sig.args[0].loaded and fake_api.sessions[-1].closed


def test_closing_a_model_with_packs_left_to_write_says_so(qtbot, worker, fake_api):
    """Unloading (or replacing) a model whose first load's packs are still being written waits for them
    (engine.pack_store); the wait is said on `progress`, not left silent."""
    load(qtbot, worker)
    progress: list[LoadProgress] = []
    worker.progress.connect(progress.append)
    fake_api.pack_writes = 2_340_000_000
    assert worker.pack_writes_left() == 2_340_000_000  # answered on the calling thread, at once
    with qtbot.waitSignal(worker.state_changed, timeout=5000):
        worker.unload()
    assert [p.stage for p in progress] == ["saving good.gguf's packed weights: 2.34 GB left to write"]
    assert fake_api.sessions[-1].closed
    fake_api.pack_writes = 0
    load(qtbot, worker)
    with qtbot.waitSignal(worker.state_changed, timeout=5000):
        worker.unload()
    assert sum("packed weights" in p.stage for p in progress) == 1  # nothing left: nothing said
    fake_api.pack_writes, fake_api.pack_hashing = 3_000_000_000, 1_000_000_000  # a new file version's keys first
    assert worker.pack_hashing_left() == 1_000_000_000
    load(qtbot, worker)
    with qtbot.waitSignal(worker.state_changed, timeout=5000):
        worker.unload()
    assert progress[-1].stage == ("saving good.gguf's packed weights: 2.00 GB left to write, after hashing 1.00 GB of "
                                  "the model file")
    fake_api.pack_writes = fake_api.pack_hashing = 0
    worker.skip_pack_writes()
    assert fake_api.writes_skipped


def test_backend_list(qtbot, worker):
    with qtbot.waitSignal(worker.backends, timeout=5000) as sig:
        worker.query_backends()
    assert sig.args[0].status["AMXInt8"] == (False, "CPU lacks amx_int8")
