"""The pre-flight fit estimate reads ModelInfo's own field names from the worker's dict of a real inspected model."""

from __future__ import annotations

import dataclasses

import pytest

from app.fit import GiB, estimate, kv_cache_bytes


@pytest.fixture(scope="module")
def info(tiny_gguf_model) -> dict:
    from engine import inspect_model

    return dataclasses.asdict(inspect_model(tiny_gguf_model))  # what app/worker.py hands to the window


def test_kv_cache_bytes_of_a_real_model(info):
    per_position = 2 * info["num_hidden_layers"] * info["num_key_value_heads"] * info["head_dim"] * 2  # K, V bf16
    assert kv_cache_bytes(info, 1000) == 1000 * per_position


def test_verdicts_follow_the_margin(info):
    need = int((info["loaded_bytes"] + kv_cache_bytes(info, 512)) * 1.1)
    assert estimate(info, 512, ram_available=2 * need).verdict == "fits"
    assert estimate(info, 512, ram_available=need).verdict == "tight"
    assert estimate(info, 512, ram_available=need // 2, vram_free=need // 2 - 1).verdict == "won't fit"
    text = estimate(info, 512, ram_available=8 * GiB, vram_free=2 * GiB).text
    assert text.startswith("Fits: needs about") and "8.0 GiB RAM free, 2.0 GiB VRAM free" in text


def test_a_dict_without_the_model_info_fields_is_a_programming_error():
    with pytest.raises(KeyError, match="loaded_bytes"):
        estimate({"total_bytes": 1}, 512, ram_available=GiB)
