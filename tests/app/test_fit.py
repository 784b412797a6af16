"""The pre-flight fit estimate is the engine's RAM estimate for the load the settings ask for (packed copy, KV cache,
loading peak and prefill buffers included), read from the worker's dict of a real inspected model; nothing is
recomputed in the app."""

from __future__ import annotations

import pytest

from tessera.app.fit import estimate
from tessera.app.worker import EngineApi


def _packing_backend() -> str:
    """A native backend that runs here and keeps its own packed copy of float experts (int8 or bf16 weights)."""
    from tessera.engine import backends

    for b in backends.table():
        if b.available and b.weights in ("int8", "bf16"):
            return b.name
    pytest.skip("no native backend with a packed copy runs on this CPU")


@pytest.fixture(scope="module")
def info(tiny_gguf_model) -> dict:
    return EngineApi().inspect(str(tiny_gguf_model), context_length=512, backend=_packing_backend())


def test_the_estimate_is_the_engines_and_counts_the_packed_copy(info):
    from tessera.engine.model_info import estimate_ram, inspect_model

    ram = info["ram"]
    assert ram["backend"] == _packing_backend() and ram["context_length"] == 512
    assert ram["packed_bytes"] > 0 and ram["kv_bytes"] > 0  # an f32 file packed for a native backend
    fit = estimate(info, ram_available=100 * 2**30)
    # the one function: what the loader's estimate says for this backend and context, not weights + KV alone
    assert fit.needed_bytes == estimate_ram(inspect_model(info["path"]), 512, ram["backend"]).total_bytes
    assert fit.needed_bytes == (ram["weights_bytes"] + ram["packed_bytes"] + ram["kv_bytes"] + ram["transient_bytes"]
                                + ram["prefill_bytes"])
    assert fit.needed_bytes > info["loaded_bytes"] + ram["kv_bytes"]


def test_verdicts_follow_the_margin(info):
    need = info["ram"]["total_bytes"]
    assert estimate(info, ram_available=2 * need).verdict == "fits"
    # the margin is the engine's, the one `check` judges by: at 0.95 of free RAM both say "does not fit comfortably"
    from tessera.engine.hardware.verdict import FIT_SHARE

    assert info["fit_share"] == FIT_SHARE
    assert estimate(info, ram_available=int(need / (FIT_SHARE - 0.01))).verdict == "fits"
    assert estimate(info, ram_available=int(need / (FIT_SHARE + 0.05))).verdict == "tight"
    assert estimate(info, ram_available=need).verdict == "tight"
    assert estimate(info, ram_available=need // 2, vram_free=need // 2 - 1).verdict == "won't fit"
    text = estimate(info, ram_available=8 * 10**9, vram_free=2 * 10**9).text
    assert text.startswith(f"Fits: this load needs {info['ram_text']}")
    assert text.endswith("8.0 GB RAM free, 2.0 GB VRAM free")
    assert "packed experts for " + info["ram"]["backend"] in text and "KV cache for 512 tokens" in text


def test_the_context_is_clamped_to_the_models_as_the_load_does(tiny_gguf_model):
    info = EngineApi().inspect(str(tiny_gguf_model), context_length=10**6)
    assert info["ram"]["context_length"] == info["context_length"]
    assert info["ram"]["backend"] != "Auto"  # Auto resolved, as the Session does


def test_a_backend_that_cannot_run_here_is_sized_as_auto(tiny_gguf_model):
    from tessera.engine import backends

    info = EngineApi().inspect(str(tiny_gguf_model), context_length=512, backend="NoSuchBackend")
    assert info["ram"]["backend"] == backends.auto()[0]


def test_a_dict_without_the_engines_estimate_is_a_programming_error():
    with pytest.raises(KeyError, match="ram"):
        estimate({"loaded_bytes": 1}, ram_available=2**30)
