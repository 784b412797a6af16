"""make-model: HF folders transformers loads without missing/unexpected keys; GGUF equal to converting that folder."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

from tessera.engine.cli import main
from tessera.engine.errors import TesseraError
from tessera.engine.make_model import PRESETS, RandomWeights, make_model

CONFIGS = {
    "moe": {},
    "dense-tied-headdim": {"mlp_only_layers": [1], "tie_word_embeddings": True, "head_dim": 24},
    "sparse-step": {"decoder_sparse_step": 2, "num_hidden_layers": 4, "norm_topk_prob": False},
    "no-head-dim": {"head_dim": None, "hidden_size": 120, "num_attention_heads": 5, "num_key_value_heads": 1},
}


def _load_hf(folder):
    from transformers import Qwen3MoeForCausalLM

    model, info = Qwen3MoeForCausalLM.from_pretrained(str(folder), output_loading_info=True)
    return model.eval(), info


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hf_folder_loads_in_transformers_with_every_key(tmp_path, name):
    out = make_model(tmp_path / name, config_overrides=CONFIGS[name], seed=3)
    model, info = _load_hf(out)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    cfg = json.loads((out / "config.json").read_text())
    for key, value in CONFIGS[name].items():
        assert cfg.get(key) == value and (value is None or getattr(model.config, key) == value)
    weights = RandomWeights(cfg, 3, torch.float32)
    sd = model.state_dict()
    for key in (
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_norm.weight",
        "model.norm.weight",
        "model.layers.1.self_attn.o_proj.weight",
    ):
        assert torch.equal(sd[key], weights.get(key)), key
    assert ("lm_head.weight" in weights.shapes) == (not cfg["tie_word_embeddings"])
    if name == "dense-tied-headdim":
        assert torch.equal(
            sd["model.layers.1.mlp.gate_proj.weight"], weights.get("model.layers.1.mlp.gate_proj.weight")
        )
        assert model.model.layers[0].self_attn.q_proj.weight.shape == (6 * 24, 96)
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 400]])).logits
    assert torch.isfinite(logits).all() and logits.std() > 0.05


def test_published_config_form_and_sharding(tiny_hf_model):
    cfg = json.loads((tiny_hf_model / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    assert cfg["rope_theta"] == 1e6 and "rope_parameters" not in cfg and cfg["torch_dtype"] == "float32"
    assert cfg["vocab_size"] == PRESETS["tiny"]["vocab_size"]
    index = json.loads((tiny_hf_model / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 2 and all((tiny_hf_model / f).is_file() for f in files)
    assert "model.layers.2.mlp.experts.5.down_proj.weight" in index["weight_map"]
    assert index["metadata"]["total_size"] == sum((tiny_hf_model / f).stat().st_size for f in files) - sum(
        8 + int.from_bytes((tiny_hf_model / f).read_bytes()[:8], "little") for f in files
    )
    gen = json.loads((tiny_hf_model / "generation_config.json").read_text())
    assert gen["eos_token_id"][0] == cfg["eos_token_id"]


def test_bf16_folder_and_seeds(tmp_path):
    from safetensors.torch import load_file

    a = make_model(tmp_path / "a", dtype="bf16", seed=1)
    b = make_model(tmp_path / "b", dtype="bf16", seed=1)
    c = make_model(tmp_path / "c", dtype="bf16", seed=2)
    ta, tb, tc = (load_file(str(p / "model.safetensors")) for p in (a, b, c))
    name = "model.layers.0.mlp.experts.3.up_proj.weight"
    assert ta[name].dtype == torch.bfloat16 and torch.equal(ta[name], tb[name]) and not torch.equal(ta[name], tc[name])
    assert json.loads((a / "config.json").read_text())["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("dtype", ["f32", "bf16", "q8_0"])
def test_gguf_equals_converting_the_hf_folder(tmp_path, dtype):
    from tessera.engine.convert import convert

    overrides = {"mlp_only_layers": [0]}
    src_dtype = "bf16" if dtype == "bf16" else "f32"
    hf = make_model(tmp_path / "hf", dtype=src_dtype, seed=5, config_overrides=overrides)
    direct = make_model(tmp_path / "direct.gguf", fmt="gguf", dtype=dtype, seed=5, config_overrides=overrides)
    converted = convert(hf, tmp_path / "converted.gguf", dtype=dtype)
    ra, rb = gguf.GGUFReader(direct), gguf.GGUFReader(converted)
    assert [t.name for t in ra.tensors] == [t.name for t in rb.tensors]
    for ta, tb in zip(ra.tensors, rb.tensors):
        assert ta.tensor_type == tb.tensor_type and np.array_equal(ta.data, tb.data), ta.name
    keys_a = {k: f.contents() for k, f in ra.fields.items() if k != "general.name"}
    keys_b = {k: f.contents() for k, f in rb.fields.items() if k != "general.name"}
    assert keys_a == keys_b


def test_bad_requests_are_named(tmp_path):
    with pytest.raises(TesseraError, match="q8_0"):
        make_model(tmp_path / "x", dtype="q8_0", fmt="hf")
    with pytest.raises(TesseraError, match="--preset"):
        make_model(tmp_path / "y", preset="huge")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f.txt").write_text("x")
    with pytest.raises(TesseraError, match="not an empty folder"):
        make_model(tmp_path / "full")
    with pytest.raises(TesseraError, match="vocab_size"):
        make_model(tmp_path / "z", config_overrides={"vocab_size": 100})


def test_cli_make_model(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert main(["make-model", str(out), "--layers", "2", "--dtype", "q8_0", "--seed", "7"]) == 0
    reader = gguf.GGUFReader(out)
    assert reader.fields["qwen3moe.block_count"].contents() == 2
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.1.ffn_up_exps.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert main(["make-model", str(tmp_path / "h"), "--dtype", "q8_0", "--format", "hf"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: --dtype: ") and "gguf" in err


def test_failed_hf_write_leaves_no_folder(tmp_path, monkeypatch):
    import errno

    from tessera.engine import make_model as mm

    real = mm.RandomWeights.get
    calls = {"n": 0}

    def full(self, name):
        calls["n"] += 1
        if calls["n"] == 10:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, name)

    monkeypatch.setattr(mm.RandomWeights, "get", full)
    with pytest.raises(TesseraError, match="disk full"):
        make_model(tmp_path / "m")
    assert not (tmp_path / "m").exists()
    with pytest.raises(TesseraError, match="vocab_size"):  # a bad config fails before weights, also leaving nothing
        make_model(tmp_path / "n", config_overrides={"vocab_size": 10})
    assert not (tmp_path / "n").exists()


def test_qwen3_30b_preset_is_the_published_config(tmp_path):
    from tessera.engine.make_model import hf_config
    from tessera.engine.tokenizer_build import build_tokenizer

    tok = build_tokenizer(None, 300, tmp_path)
    cfg = hf_config("qwen3-30b-a3b", layers=None, dtype="bf16", tok=tok, overrides=None)
    published = {  # Qwen/Qwen3-30B-A3B config.json
        "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "moe_intermediate_size": 768, "intermediate_size": 6144, "num_experts": 128,
        "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "vocab_size": 151936, "tie_word_embeddings": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "max_position_embeddings": 40960, "hidden_act": "silu", "torch_dtype": "bfloat16", "model_type": "qwen3_moe",
    }  # fmt: skip
    assert {k: cfg[k] for k in published} == published
    assert hf_config("qwen3-30b-a3b", layers=4, dtype="bf16", tok=tok, overrides=None)["num_hidden_layers"] == 4
