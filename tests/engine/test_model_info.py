"""inspect_model: header facts and byte counts for GGUF and HF, consistent with what load_weights produces."""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest
from gguf_factory import Q, tiny_config, write_gguf, write_sparse_gguf

from tessera.engine.errors import ModelFormatError
from tessera.engine.model_info import inspect_model
from tessera.engine.weights import load_weights


@pytest.mark.parametrize("fixture", ["tiny_hf_model", "tiny_gguf_model"])
def test_counts_match_loaded_weights(fixture, request):
    path = request.getfixturevalue(fixture)
    info = inspect_model(path)
    w = load_weights(path)
    assert info.format == ("hf" if fixture == "tiny_hf_model" else "gguf") and info.architecture == "qwen3moe"
    assert info.num_hidden_layers == w.config.num_hidden_layers and info.num_experts == w.config.num_experts
    assert info.loaded_bytes == w.nbytes == info.total_bytes  # f32 files: nothing expands
    assert info.parameters == sum(t.numel() for t in w.tensors.values())
    experts = sum(t.numel() * t.element_size() for n, t in w.tensors.items() if ".mlp.experts." in n)
    assert info.expert_bytes == experts
    assert info.active_expert_bytes_per_token == experts * info.num_experts_per_tok // info.num_experts
    assert info.tensor_types == ({"F32": info.num_tensors})
    assert dataclasses.asdict(info)["context_length"] == w.config.max_position_embeddings


def test_quantized_expands(tmp_path):
    cfg = tiny_config(hidden_size=256, moe_intermediate_size=256, head_dim=64)
    path = write_gguf(tmp_path / "q.gguf", cfg, qtype=Q.Q8_0)
    info = inspect_model(path)
    assert info.tensor_types["Q8_0"] > 0 and info.tensor_types["F32"] > 0 and info.expert_type == "Q8_0"
    # Q8_0 has kernels for experts and 2-D weights alike (engine.quantized): every tensor is held as stored.
    assert info.loaded_bytes == info.total_bytes and info.expert_bytes > 0
    # Q5_0 (llama-quantize's fallback for rows that do not split into 256) has no dense kernel: a 2-D Q5_0 weight
    # expands to float32, a Q5_0 routed expert stays blocks.
    q5 = write_gguf(tmp_path / "q5.gguf", cfg, qtype={"blk.0.attn_q.weight": Q.Q5_0,
                                                       "blk.0.ffn_up_exps.weight": Q.Q5_0})  # fmt: skip
    attn_q = next(t for t in gguf.GGUFReader(q5).tensors if t.name == "blk.0.attn_q.weight")
    expanded = 4 * int(np.prod(attn_q.shape)) - int(attn_q.n_bytes)
    assert expanded > 0 and inspect_model(q5).loaded_bytes == inspect_model(q5).total_bytes + expanded
    mixed = write_gguf(tmp_path / "mixed.gguf", tiny_config(), qtype={"blk.0.ffn_up_exps.weight": Q.BF16})
    assert inspect_model(mixed).expert_type == "mixed"


def test_qwen3_30b_shapes_header_only(tmp_path):
    """A Qwen3-30B-A3B-shaped bf16 GGUF (2 of its 48 layers, data a sparse hole): active expert bytes per token per
    layer = 8 experts x 3 x 2048 x 768 x 2 bytes (reference: 3.62 GB over 48 layers)."""
    import json
    from pathlib import Path

    from tessera.engine.config import ModelConfig

    published = Path(__file__).resolve().parents[1] / "data" / "qwen3-moe-configs.json"
    d = json.loads(published.read_text())["Qwen3-30B-A3B"]
    cfg = ModelConfig.from_hf_dict(dict(d, num_hidden_layers=2))
    info = inspect_model(write_sparse_gguf(tmp_path / "big.gguf", cfg))
    per_layer = 8 * 3 * 2048 * 768 * 2
    assert info.active_expert_bytes_per_token == 2 * per_layer
    assert abs(per_layer * 48 / 1e9 - 3.62) < 0.01
    assert info.expert_bytes == 2 * 128 * 3 * 2048 * 768 * 2
    assert info.tensor_types == {"BF16": 2 + 2 * 8, "F32": 1 + 2 * 4} and info.expert_type == "BF16"


def test_errors(tmp_path):
    with pytest.raises(ModelFormatError, match="does not exist"):
        inspect_model(tmp_path / "nope.gguf")
    p = write_gguf(tmp_path / "m.gguf", tiny_config(), drop=("blk.0.attn_k.weight",))
    with pytest.raises(ModelFormatError, match="tensor blk.0.attn_k.weight is missing"):
        inspect_model(p)
