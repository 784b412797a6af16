"""GPU section. This machine has no CUDA device, so the real probe can only show the normal "no CUDA device" answer;
the CUDA path's report assembly is exercised with a stand-in torch module (a test double of the few calls it makes —
it proves field names, units and the copy/timing flow, not real bandwidth; tests/hardware runs on a GPU machine for
that).
"""

from __future__ import annotations

import sys
import types

import pytest

from tessera.engine.hardware import gpu


def test_no_cuda_is_a_normal_answer():
    import torch

    gpus, status = gpu.probe_gpus()
    if torch.cuda.is_available():
        assert gpus and all(g["h2d_gbs"] > 0 and g["d2h_gbs"] > 0 for g in gpus)
    else:
        assert gpus == [] and status.startswith("no CUDA device")


class _Tensor:
    def __init__(self, n):
        self.n = n

    def pin_memory(self):
        return self

    def numel(self):
        return self.n

    def element_size(self):
        return 4

    def copy_(self, other, non_blocking=False):
        assert other.n == self.n and non_blocking
        return self


def _fake_torch(calls):
    cuda = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 1,
        get_device_properties=lambda i: types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0,
                                                              multi_processor_count=132, total_memory=150e9),
        mem_get_info=lambda i: (140e9, 150e9),
        synchronize=lambda: calls.append("sync"), empty_cache=lambda: None)

    class _Dev:
        def __enter__(self):
            return None

        def __exit__(self, *a):
            return False

    cuda.device = lambda i: _Dev()
    return types.SimpleNamespace(
        __version__="2.9.0+cu128", version=types.SimpleNamespace(cuda="12.8"), cuda=cuda, float32="f32",
        ones=lambda n, dtype: _Tensor(n), empty=lambda n, dtype, device: _Tensor(n),
        _C=types.SimpleNamespace(_cuda_getDriverVersion=lambda: 12080))


def test_cuda_report_fields_with_a_stand_in_torch(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(calls))
    events = []
    gpus, status = gpu.probe_gpus(copy_bytes=1 << 20, progress=events.append)
    (g,) = gpus
    assert g["name"] == "NVIDIA H200" and g["compute_capability"] == "9.0" and g["driver_version"] == "12.8"
    assert g["vram_total_gb"] == pytest.approx(150.0) and g["vram_free_gb"] == pytest.approx(140.0)
    assert g["h2d_gbs"] > 0 and g["d2h_gbs"] > 0 and g["cuda_runtime"] == "12.8"
    assert calls.count("sync") == 2 * (gpu.COPY_REPEATS + 1)  # warm-up + timed copies, each direction
    assert status.startswith("1 CUDA device(s)") and events[-1].done == 1
