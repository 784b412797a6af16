"""A load that fails while reading the tensors (the header checked out), or is cancelled in the middle, keeps the model
loaded before it working (issue 15 item 3). The new model is loaded beside the old one when RAM has room for both;
where it has not, the old one is closed first, the user is told, and it is loaded again if the new one fails.

The window-level cases use the fake engine (tests/app/app_fakes.py); the last two run the real engine on a tiny Q8_0
GGUF whose block scale is damaged (inspect_model reads headers only, so it passes) and on a real cancelled load."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from app_fakes import FakeApi, data_dir  # noqa: F401 - fixture
from test_window import Harness

from tessera.app.payloads import LoadProgress, WorkerError
from tessera.engine.errors import NotEnoughMemoryError


@pytest.fixture
def harness(qtbot, data_dir):  # noqa: F811
    h = Harness(qtbot, FakeApi())
    yield h
    h.close()


def _closed_when(session, api: FakeApi) -> list[int]:
    """Record how many sessions the fake had made when `session` was closed (1: before the next load began)."""
    seen: list[int] = []
    close = session.close

    def recording_close():
        seen.append(len(api.sessions))
        close()

    session.close = recording_close
    return seen


def test_a_load_failing_in_the_tensors_keeps_the_loaded_model(harness, qtbot):
    w = harness.window
    harness.load("/models/good.gguf")
    kept = harness.api.sessions[-1]
    states = []
    harness.worker.state_changed.connect(states.append)
    harness.load("/models/damaged.gguf", ok=False)  # inspect passes; the fake fails at its fourth tensor
    assert "block 37 has a NaN or Inf scale; good.gguf stays loaded" in w.last_error.text
    assert not kept.closed and len(harness.api.sessions) == 1 and states == []
    assert w.state.loaded and w.state.path == "/models/good.gguf" and w.windowTitle() == "Tessera — good.gguf"
    assert w.error_box is not None and "stays loaded" in w.error_box.text() + w.error_box.informativeText()
    harness.send("still there?")
    assert w.controller.messages[-1].content == "Hello there!" and kept.calls


def test_a_load_cancelled_midway_keeps_the_loaded_model(harness, qtbot):
    w, api = harness.window, harness.api
    harness.load("/models/good.gguf")
    kept = api.sessions[-1]
    api.load_delay = 2.0

    def cancel_in_the_tensors(p: LoadProgress) -> None:
        if p.stage == "tensors" and p.done >= 2:
            harness.worker.cancel_load()

    harness.worker.progress.connect(cancel_in_the_tensors)
    harness.load("/models/second.gguf", ok=False)
    assert w.last_error.cancelled and not kept.closed and len(api.sessions) == 1
    assert w.state.path == "/models/good.gguf" and "good.gguf stays loaded" in w.status.message_text
    harness.send("still there?")
    assert w.controller.messages[-1].content == "Hello there!"


def test_the_old_model_is_closed_only_once_the_new_one_has_loaded(harness):
    api = harness.api
    harness.load("/models/good.gguf")
    closed_at = _closed_when(api.sessions[-1], api)
    harness.load("/models/second.gguf")
    assert closed_at == [2]  # both were held for a moment: RAM had room (the fake reports 64 GB free)
    assert harness.window.state.path == "/models/second.gguf"


def test_without_room_for_both_the_old_model_goes_first_and_comes_back_if_the_new_one_fails(harness, qtbot):
    w, api = harness.window, harness.api
    harness.load("/models/good.gguf")
    first = api.sessions[-1]
    closed_at = _closed_when(first, api)
    api.ram_free = 5_000_000  # the fake's inspect sizes a load at 8 MB
    stages: list[str] = []
    harness.worker.progress.connect(lambda p: stages.append(p.stage))
    harness.load("/models/damaged.gguf", ok=False)
    assert closed_at == [1]  # closed before the new load began
    assert stages[0] == ("closing good.gguf first: both do not fit in RAM (this load needs about 8.00 MB: weights "
                         "5.00 MB + packed experts 2.00 MB + KV cache 1.00 MB; 0.0 GB RAM free)")
    assert "loading good.gguf again" in stages
    assert w.last_error.text.endswith("block 37 has a NaN or Inf scale; good.gguf was loaded again")
    qtbot.waitUntil(lambda: len(api.sessions) == 2, timeout=3000)
    again = api.sessions[-1]
    assert again.path == "/models/good.gguf" and not again.closed and w.state.path == "/models/good.gguf"
    harness.send("still there?")
    assert again.calls and w.controller.messages[-1].content == "Hello there!"


def test_a_backend_chosen_after_loading_is_kept_when_the_model_is_loaded_again(harness, qtbot):
    api = harness.api
    harness.load("/models/good.gguf")
    harness.worker.set_backend("AVX2")
    qtbot.waitUntil(lambda: harness.window.state.backend == "AVX2", timeout=3000)
    api.ram_free = 0
    harness.load("/models/damaged.gguf", ok=False)
    qtbot.waitUntil(lambda: len(api.sessions) == 2, timeout=3000)
    assert api.sessions[-1].backend_name == "AVX2"


def test_a_backend_without_room_beside_the_one_in_use_is_loaded_again_with_it(harness, qtbot):
    """The engine refuses a switch whose packs do not fit beside the backend in use: the model is closed, loaded
    again with the new backend, the user told why, and the conversation goes on in the window."""
    w, api = harness.window, harness.api
    harness.load("/models/good.gguf")
    first = api.sessions[-1]
    harness.send("hello")
    first.refuse_switch = True
    stages: list[str] = []
    harness.worker.progress.connect(lambda p: stages.append(p.stage))
    harness.worker.set_backend("AVX2")
    qtbot.waitUntil(lambda: w.state.backend == "AVX2", timeout=3000)
    assert stages[0] == ("closing good.gguf first: AVX2's packs do not fit beside AVX512's (packing 3 layers of "
                         "bfloat16 experts takes 9.70 GB of RAM and 4.00 GB are free); loading it again with AVX2")
    assert first.closed and len(api.sessions) == 2 and api.sessions[-1].backend_name == "AVX2"
    assert w.state.path == "/models/good.gguf" and len(w.controller.messages) == 2
    harness.send("still there?")
    assert api.sessions[-1].calls[-1]["backend"] == "AVX2" and len(w.controller.messages) == 4


def test_a_backend_without_room_that_fails_to_load_brings_the_old_one_back(harness, qtbot):
    w, api = harness.window, harness.api
    harness.load("/models/good.gguf")
    api.sessions[-1].refuse_switch = True
    load = api.load

    def refusing(path, *, backend, **kw):
        if backend == "AVX2":
            raise NotEnoughMemoryError("backend AVX2", "packing 3 layers takes 9.70 GB of RAM and 4.00 GB are free")
        return load(path, backend=backend, **kw)

    api.load = refusing
    harness.worker.set_backend("AVX2")
    qtbot.waitUntil(lambda: len(api.sessions) == 2, timeout=3000)
    qtbot.waitUntil(lambda: w.last_error is not None, timeout=3000)
    assert w.last_error.text.endswith("4.00 GB are free; good.gguf was loaded again")
    assert api.sessions[-1].backend_name == "AVX512" and not api.sessions[-1].closed
    qtbot.waitUntil(lambda: w.state.loaded and w.state.backend == "AVX512", timeout=3000)


# ---- the real engine


def _damage_a_block_scale(path, tensor: str, block: int) -> None:
    """Write NaN into one Q8_0 block's f16 scale (its first two bytes): the header stays valid."""
    reader = gguf.GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == tensor)
    assert gguf.GGMLQuantizationType(t.tensor_type) == gguf.GGMLQuantizationType.Q8_0
    at = int(t.data_offset) + block * gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][1]
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(np.array([np.nan], np.float16).tobytes())


def _real_load(qtbot, worker, path, **kw):
    with qtbot.waitSignal(worker.state_changed, timeout=60000) as sig:
        worker.load(str(path), "Torch", 2, 256, **kw)
    assert sig.args[0].loaded
    return sig.args[0]


def _real_reply(qtbot, worker) -> str:
    with qtbot.waitSignal(worker.finished, timeout=60000) as sig:
        worker.generate([{"role": "user", "content": "Hello"}], {"temperature": 0.0, "max_tokens": 4}, False)
    assert not sig.args[0].error
    return sig.args[0].text


def test_real_engine_a_damaged_tensor_found_while_loading_keeps_the_model(qtbot, real_worker, tiny_gguf_model,
                                                                           tmp_path):
    from tessera import engine
    from tessera.engine.make_model import make_model

    damaged = make_model(tmp_path / "damaged.gguf", fmt="gguf", dtype="q8_0", seed=1)
    _damage_a_block_scale(damaged, "blk.1.ffn_up_exps.weight", 5)
    engine.inspect_model(damaged)  # the header checks out: only reading the tensors finds the damage
    _real_load(qtbot, real_worker, tiny_gguf_model)
    before = _real_reply(qtbot, real_worker)
    states, errors = [], []
    real_worker.state_changed.connect(states.append)
    with qtbot.waitSignal(real_worker.failed, timeout=60000) as sig:
        real_worker.load(str(damaged), "Torch", 2, 256)
    error: WorkerError = sig.args[0]
    real_worker.failed.connect(errors.append)
    assert "tensor blk.1.ffn_up_exps.weight: block 5 has a NaN or Inf scale" in error.text
    assert error.text.endswith("tiny.gguf stays loaded")
    assert _real_reply(qtbot, real_worker) == before and states == [] and errors == []


def test_real_engine_a_cancelled_load_keeps_the_model(qtbot, real_worker, tiny_gguf_model, tiny_hf_model):
    from PySide6.QtCore import Qt

    _real_load(qtbot, real_worker, tiny_gguf_model)
    before = _real_reply(qtbot, real_worker)

    def cancel_at_the_first_tensor(p: LoadProgress) -> None:  # runs in the worker thread, inside the load
        if p.operation == "load":
            real_worker.cancel_load()

    real_worker.progress.connect(cancel_at_the_first_tensor, Qt.ConnectionType.DirectConnection)
    with qtbot.waitSignal(real_worker.failed, timeout=60000) as sig:
        real_worker.load(str(tiny_hf_model), "Torch", 2, 256)
    real_worker.progress.disconnect(cancel_at_the_first_tensor)
    assert sig.args[0].cancelled and sig.args[0].text.endswith("tiny.gguf stays loaded")
    assert _real_reply(qtbot, real_worker) == before
