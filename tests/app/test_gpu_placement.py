"""GPU use in the app, with the real engine and a tiny model: the CPU twin feeds the expert-cache graph; asking for CUDA
on a machine without it explains why and falls back to the CPU only when the user accepts."""

from __future__ import annotations

import pytest
import torch
from app_fakes import data_dir  # noqa: F401 - fixture
from PySide6.QtWidgets import QMessageBox
from test_window import Harness

from tessera.app.worker import EngineApi


@pytest.fixture
def real(qtbot, data_dir):  # noqa: F811
    h = Harness(qtbot, EngineApi())
    h.settings.set("sampling/max_tokens", 6)
    h.settings.set("model/backend", "Torch")
    yield h
    h.close()


def test_twin_expert_cache_reaches_status_and_graph(real, tiny_gguf_model):
    real.settings.set("gpu/use", "twin")
    real.settings.set("gpu/expert_cache", 2)
    assert real.load(str(tiny_gguf_model))
    w = real.window
    assert w.state.device == "cpu (twin of the GPU half)"
    real.send("Hello there")
    panel = w.graphs
    assert len(panel.expert_hit) == 1 and 0.0 <= panel.expert_hit[0] <= 100.0
    assert "served by the GPU half (CPU twin)" in panel.expert_label.text()  # no GPU: not "on the GPU"


def test_without_gpu_use_the_graph_says_no_expert_cache(real, tiny_gguf_model):
    assert real.load(str(tiny_gguf_model))
    real.send("Hello there")
    assert real.window.graphs.expert_hit == []
    assert "no GPU expert cache" in real.window.graphs.expert_label.text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: nothing to fall back from")
@pytest.mark.parametrize("accept", [False, True])
def test_cuda_without_cuda_asks_before_falling_back(real, qtbot, tiny_gguf_model, accept):
    real.settings.set("gpu/use", "cuda")
    w = real.window
    w.model_panel.choose(str(tiny_gguf_model))
    w.load_model(str(tiny_gguf_model))
    qtbot.waitUntil(lambda: w.error_box is not None and w.error_box.isVisible(), timeout=60000)
    box = w.error_box
    assert "no CUDA device is available" in box.text()
    assert real.settings.get("gpu/use") == "cuda"  # nothing changes until the user answers
    if accept:
        with qtbot.waitSignal(w.model_ready, timeout=60000) as sig:
            box.button(QMessageBox.StandardButton.Yes).click()
        assert sig.args[0] is True
        assert real.settings.get("gpu/use") == "off" and w.state.device == "cpu"
    else:
        with qtbot.waitSignal(w.model_ready, timeout=5000) as sig:
            box.button(QMessageBox.StandardButton.No).click()
        assert sig.args[0] is False
        assert real.settings.get("gpu/use") == "cuda" and not w.state.loaded
