"""estimate_ram counts the expert layer's buffers for one prefill step (model_info.prefill_scratch_bytes): every routed
slot's hidden activation and output in float32 at min(generate.PREFILL_CHUNK, context) tokens, which the native kernels
keep from step to step. Checked against the arithmetic on the 30B-A3B shape (184.5 MB at 2048 tokens) and on a real
file's header, for every backend, and in the words the model panel shows."""

import dataclasses

import pytest

from tessera.engine.generate import PREFILL_CHUNK
from tessera.engine.model_info import estimate_ram, inspect_model, prefill_scratch_bytes
from tessera.engine.model_summary import ram_dict, ram_text


def test_the_30b_shape_takes_184_mb_at_a_2048_token_step(tiny_gguf_model):
    info = dataclasses.replace(inspect_model(tiny_gguf_model), num_experts=128, num_experts_per_tok=8,
                               moe_intermediate_size=768, hidden_size=2048, dense_layers=[])
    assert PREFILL_CHUNK == 2048
    assert prefill_scratch_bytes(info, 40960) == 2048 * 8 * (768 + 2048) * 4 == 184_549_376
    assert prefill_scratch_bytes(info, 512) == 512 * 8 * (768 + 2048) * 4  # a step never exceeds the context


@pytest.mark.parametrize("backend", ["Reference", "Torch"])
def test_the_estimate_adds_the_buffers_to_its_total(tiny_gguf_model, backend):
    info = inspect_model(tiny_gguf_model)
    est = estimate_ram(info, 256, backend)
    T = min(PREFILL_CHUNK, 256)
    assert est.prefill_bytes == T * info.num_experts_per_tok * (info.moe_intermediate_size + info.hidden_size) * 4 > 0
    assert est.total_bytes == (est.weights_bytes + est.packed_bytes + est.kv_bytes + est.transient_bytes
                               + est.prefill_bytes)
    assert "prefill buffers" in ram_text(ram_dict(est))


def test_a_model_without_routed_experts_needs_none(tiny_gguf_model):
    info = dataclasses.replace(inspect_model(tiny_gguf_model), num_experts=0)
    assert prefill_scratch_bytes(info, 4096) == 0
