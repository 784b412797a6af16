"""ModelConfig from HF config.json (published and transformers-5 forms) and GGUF metadata; every named error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.engine.config import PUBLISHED, ModelConfig
from tessera.engine.errors import ModelFormatError

# The published config.json values of the Qwen3-MoE checkpoints, copied from the team's reference notes.
REF = json.loads((Path(__file__).resolve().parents[1] / "data" / "qwen3-moe-configs.json").read_text())

PUBLISHED_30B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "moe_intermediate_size": 768,
    "intermediate_size": 6144, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_scaling": None, "max_position_embeddings": 40960,
    "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
    "attention_bias": False, "use_sliding_window": False,
}  # fmt: skip


def test_published_config():
    c = ModelConfig.from_hf_dict(PUBLISHED_30B, "Qwen3-30B-A3B/config.json")
    assert (c.hidden_size, c.num_hidden_layers, c.num_experts, c.num_experts_per_tok) == (2048, 48, 128, 8)
    assert c.rope_theta == 1e6 and c.head_dim == 128 and c.norm_topk_prob is True
    assert c.moe_layers == list(range(48)) and c.dense_layers == []
    assert c.eos_token_ids == (151645,)


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "Qwen3-235B-A22B"])
def test_reference_configs(name):
    c = ModelConfig.from_hf_dict(REF[name], name)
    assert c.num_hidden_layers == REF[name]["num_hidden_layers"] and c.head_dim == 128
    assert PUBLISHED[name.lower()] == c and PUBLISHED[name.lower()].source == name  # the engine's copy of the facts


def test_transformers_5_form_matches_hf_config():
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3MoeConfig(
        vocab_size=100, hidden_size=60, num_hidden_layers=5, num_attention_heads=6, num_key_value_heads=2, head_dim=14,
        num_experts=9, num_experts_per_tok=3, moe_intermediate_size=20, intermediate_size=44, decoder_sparse_step=2,
        mlp_only_layers=[4], norm_topk_prob=True, rope_parameters={"rope_type": "default", "rope_theta": 5e5},
        tie_word_embeddings=True, eos_token_id=[7, 8],
    )  # fmt: skip
    d = hf.to_dict()
    assert "rope_parameters" in d and "num_local_experts" in d  # the transformers-5 spellings
    c = ModelConfig.from_hf_dict(d, "cfg")
    assert c.rope_theta == 5e5 and c.num_experts == 9 and c.head_dim == 14 and c.tie_word_embeddings
    assert c.eos_token_ids == (7, 8)
    # is_moe_layer exactly as transformers builds the decoder layers
    model = transformers.Qwen3MoeForCausalLM(hf)
    for i, layer in enumerate(model.model.layers):
        assert c.is_moe_layer(i) == (type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock"), i
    assert c.dense_layers == [0, 2, 4]


def test_head_dim_defaults_and_roundtrip():
    d = dict(PUBLISHED_30B)
    del d["head_dim"]
    assert ModelConfig.from_hf_dict(d).head_dim == 64
    c = ModelConfig.from_hf_dict(PUBLISHED_30B)
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c
    tensors = ["output.weight"] + [f"blk.{i}.ffn_gate_inp.weight" for i in range(48)]
    assert ModelConfig.from_gguf(c.to_gguf_metadata(), "m.gguf", tensors) == c


def test_gguf_dense_and_tied_from_tensor_names():
    c = ModelConfig.from_hf_dict(dict(PUBLISHED_30B, num_hidden_layers=4, mlp_only_layers=[1],
                                      tie_word_embeddings=True))
    names = [f"blk.{i}.ffn_gate_inp.weight" for i in (0, 2, 3)]
    g = ModelConfig.from_gguf(c.to_gguf_metadata(), "m.gguf", names)
    assert g.dense_layers == [1] and g.tie_word_embeddings and g.intermediate_size == 6144
    assert [g.is_moe_layer(i) for i in range(4)] == [c.is_moe_layer(i) for i in range(4)]


def _hf_error(match: str, **changes):
    d = dict(PUBLISHED_30B)
    for k, v in changes.items():
        if v is KeyError:
            d.pop(k)
        else:
            d[k] = v
    with pytest.raises(ModelFormatError, match=match) as e:
        ModelConfig.from_hf_dict(d, "some/config.json")
    assert e.value.subject == "some/config.json"


@pytest.mark.parametrize(
    "match,changes",
    [
        ("key hidden_size is missing", {"hidden_size": KeyError}),
        ("key num_key_value_heads is missing", {"num_key_value_heads": KeyError}),
        ("key num_experts is missing", {"num_experts": KeyError}),
        ("key model_type: unsupported architecture 'llama'", {"model_type": "llama", "architectures": KeyError}),
        ("key architectures: unsupported", {"architectures": ["MixtralForCausalLM"]}),
        ("key model_type is missing", {"model_type": KeyError, "architectures": KeyError}),
        ("key num_key_value_heads: 5 key/value heads do not divide 32", {"num_key_value_heads": 5}),
        ("key num_attention_heads: 30 heads do not divide hidden size 2048",
         {"num_attention_heads": 30, "head_dim": KeyError, "num_key_value_heads": 5}),
        ("key num_experts_per_tok: 9 experts per token but only 8", {"num_experts": 8, "num_experts_per_tok": 9}),
        ("key hidden_size: must be positive, got 0", {"hidden_size": 0}),
        ("key moe_intermediate_size: must be positive", {"moe_intermediate_size": -3}),
        ("key vocab_size: 1099511627776 is absurdly large", {"vocab_size": 1 << 40}),
        ("key num_hidden_layers: expected an integer", {"num_hidden_layers": "48"}),
        ("key mlp_only_layers: layer 48 is not in 0..47", {"mlp_only_layers": [48]}),
        ("key decoder_sparse_step: must be positive", {"decoder_sparse_step": 0}),
        ("key rms_norm_eps: must be a positive number", {"rms_norm_eps": 0.0}),
        ("key rope_theta: must be a positive number", {"rope_theta": float("nan")}),
        ("key rope_scaling: rope_type 'yarn' is not supported", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}),
        ("key eos_token_id: token id 151936 is outside", {"eos_token_id": 151936}),
        ("key intermediate_size is missing", {"intermediate_size": KeyError, "mlp_only_layers": [3]}),
        ("key hidden_act", {"hidden_act": "gelu"}),
        ("key use_sliding_window", {"use_sliding_window": True}),
    ],
)
def test_hf_named_errors(match, changes):
    _hf_error(match, **changes)


def test_gguf_named_errors():
    c = ModelConfig.from_hf_dict(PUBLISHED_30B)
    md = c.to_gguf_metadata()
    names = [f"blk.{i}.ffn_gate_inp.weight" for i in range(48)] + ["output.weight"]

    def err(md2, match, names=names):
        with pytest.raises(ModelFormatError, match=match) as e:
            ModelConfig.from_gguf(md2, "x.gguf", names)
        assert e.value.subject == "x.gguf"

    err({k: v for k, v in md.items() if k != "qwen3moe.block_count"}, "key qwen3moe.block_count is missing")
    err({k: v for k, v in md.items() if k != "general.architecture"}, "key general.architecture is missing")
    err(dict(md, **{"general.architecture": "llama"}), "unsupported architecture 'llama'")
    err(dict(md, **{"qwen3moe.expert_used_count": 200}), "key qwen3moe.expert_used_count: 200 experts per token")
    err(dict(md, **{"qwen3moe.attention.head_count_kv": 3}), "key qwen3moe.attention.head_count_kv: 3 key/value")
    err(dict(md, **{"qwen3moe.embedding_length": "big"}), "key qwen3moe.embedding_length: expected int")
    err(dict(md, **{"qwen3moe.attention.value_length": 64}), "key qwen3moe.attention.value_length")
    err(dict(md, **{"qwen3moe.context_length": 0}), "key qwen3moe.context_length: must be positive")
    md_no_ffn = {k: v for k, v in md.items() if k != "qwen3moe.feed_forward_length"}
    ModelConfig.from_gguf(md_no_ffn, "x.gguf", names)  # fine while every block is MoE
    err(md_no_ffn, "key qwen3moe.feed_forward_length is missing", names=names[1:])


def test_gguf_defaults_follow_llama_cpp():
    c = ModelConfig.from_hf_dict(PUBLISHED_30B)
    md = {k: v for k, v in c.to_gguf_metadata().items() if k not in (
        "qwen3moe.attention.head_count_kv", "qwen3moe.rope.freq_base", "qwen3moe.attention.key_length",
        "qwen3moe.attention.value_length", "qwen3moe.vocab_size")}  # fmt: skip
    md["tokenizer.ggml.tokens"] = ["a"] * 151936
    g = ModelConfig.from_gguf(md, "x.gguf")
    assert g.num_key_value_heads == 32 and g.rope_theta == 10000.0 and g.head_dim == 64 and g.vocab_size == 151936
    assert g.norm_topk_prob is True  # llama.cpp renormalises qwen3moe top-k weights
