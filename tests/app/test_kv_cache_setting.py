"""The KV cache type setting (Settings "model/kv_cache_type"): the worker loads with it and sizes the fit estimate for
it, on the real engine (engine.load's kv_cache_type)."""

from __future__ import annotations

import pytest

from tessera.app.settings import TABLE


@pytest.fixture(scope="module")
def kquant_model(tmp_path_factory):
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("kv-setting") / "m.gguf", preset="tiny-kquant", fmt="gguf", dtype="q8_0")


def test_the_setting_offers_bf16_and_q8_0_and_reloads():
    setting = next(s for s in TABLE if s.key == "model/kv_cache_type")
    assert setting.default == "bf16" and tuple(setting.choices) == ("bf16", "q8_0") and setting.reload


def test_the_worker_loads_with_the_q8_0_cache_and_sizes_it(qtbot, real_worker, kquant_model):
    with qtbot.waitSignal(real_worker.inspected, timeout=60000) as bf16:
        real_worker.inspect(str(kquant_model), 512, "Torch", "bf16")
    with qtbot.waitSignal(real_worker.inspected, timeout=60000) as q8:
        real_worker.inspect(str(kquant_model), 512, "Torch", "q8_0")
    assert q8.args[0].info["ram"]["kv_bytes"] < bf16.args[0].info["ram"]["kv_bytes"]
    with qtbot.waitSignal(real_worker.state_changed, timeout=60000) as sig:
        real_worker.load(str(kquant_model), "Torch", 2, 256, "off", 0, "q8_0")
    assert sig.args[0].loaded
    assert real_worker._session.kv_cache_type == "q8_0" and real_worker._session.model.new_cache(4).quantized
    with qtbot.waitSignal(real_worker.finished, timeout=60000) as done:
        real_worker.generate([{"role": "user", "content": "Hello"}], {"temperature": 0.0, "max_tokens": 4}, False)
    assert not done.args[0].error
