"""Tessera's quantizer (tessera/engine/quantize.py) against gguf.quants.dequantize, and the files make-model / convert
write with llama-quantize's per-tensor type mix (tessera/engine/quant_mix.py)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from tessera.engine.config import ModelConfig
from tessera.engine.quant_mix import OUTPUT_TYPES, QUANTIZED_NAMES, parse_output_type, tensor_types
from tessera.engine.quantize import QUANTIZABLE, QuantizeError, quantize

Q = gguf.GGMLQuantizationType

# Relative RMS error bound per type on normal(0, 0.02) weights, |decoded - x|_2 / |x|_2. Measured (2026-12-03):
# Q8_0 0.0054, Q4_0 0.086, IQ4_NL 0.080, Q4_K 0.078, Q5_K 0.038, Q6_K 0.019, IQ4_XS 0.080, Q5_0 0.043, Q5_1 0.038.
# Each bound is about 15 % above the measurement and below the next coarser grid's error (a 4-bit grid's ideal on
# Gaussian data is ~0.07-0.08, 5-bit ~0.037, 6-bit ~0.018, 8-bit ~0.005), so a layout or scale mistake (which decodes
# to garbage: error ~1) or a lost bit of precision fails.
RMS_BOUND = {
    Q.Q8_0: 0.0065,
    Q.Q4_0: 0.099,
    Q.IQ4_NL: 0.092,
    Q.Q4_K: 0.090,
    Q.Q5_K: 0.044,
    Q.Q6_K: 0.022,
    Q.IQ4_XS: 0.092,
    Q.Q5_0: 0.050,
    Q.Q5_1: 0.044,
}
# Largest error of one element, as a fraction of its block's largest |x|: half a grid step plus the stored-scale
# rounding for the affine K-quants and Q8_0; the symmetric types whose extreme maps to the grid's longer side (Q4_0 and
# Q5_0 to -8 / -16, IQ4 to -127 of a table that ends at +113) clip a value of the other sign near the extreme by up to
# 1/8, 1/16 and 14/127 of it (ggml's reference does the same).
MAX_BOUND = {
    Q.Q8_0: 0.006,
    Q.Q4_0: 0.13,
    Q.IQ4_NL: 0.13,
    Q.Q4_K: 0.10,
    Q.Q5_K: 0.05,
    Q.Q6_K: 0.03,
    Q.IQ4_XS: 0.13,
    Q.Q5_0: 0.07,
    Q.Q5_1: 0.05,
}


def _weights(shape, seed=0, std=0.02):
    return (std * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def test_every_type_is_covered_by_a_bound():
    assert set(QUANTIZABLE) == set(RMS_BOUND) == set(MAX_BOUND)


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda q: q.name)
def test_round_trip_through_gguf_dequantize(qtype):
    x = _weights((96, 1024))
    # Rows with structure random normals lack: an outlier, an all-positive row (min > 0), a constant row, tiny values.
    x[0, 5] = 0.5
    x[1] = np.abs(x[1]) + 0.01
    x[2] = 0.013
    x[3] *= 1e-2  # block scales below f16's normal range (subnormals, as in ggml)
    blocks = quantize(x, qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    assert blocks.dtype == np.uint8 and blocks.shape == (96, 1024 // block * size)
    y = dequantize(blocks, qtype)  # the reference decoder shipped with llama.cpp's gguf package
    assert y.shape == x.shape and np.isfinite(y).all()
    rel_rms = np.linalg.norm(y[4:] - x[4:]) / np.linalg.norm(x[4:])
    assert rel_rms < RMS_BOUND[qtype], rel_rms

    def worst(rows):  # largest element error of any block, relative to that block's largest |x|
        xb, yb = x[rows].reshape(-1, block), y[rows].reshape(-1, block)
        return (np.abs(yb - xb).max(axis=1) / np.abs(xb).max(axis=1)).max()

    assert worst(np.r_[0:3, 4:96]) < MAX_BOUND[qtype]
    # Row 3's scales sit in f16's subnormal range, where a stored scale keeps only a few bits (Q6_K's d = max / 4096 is
    # hit hardest, as in ggml): measured up to 0.15; the bound catches a scale flushed to zero or overflowing.
    assert worst([3]) < 0.25


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda q: q.name)
def test_zero_blocks_decode_to_zero_and_3d_shapes_keep_leading_dims(qtype):
    x = np.zeros((2, 3, 2 * 256), np.float32)
    x[1] = _weights((3, 512), seed=1)
    blocks = quantize(x, qtype)
    assert blocks.shape[:2] == (2, 3)
    y = dequantize(blocks, qtype)
    assert y.shape == x.shape and np.all(y[0] == 0)
    assert np.linalg.norm(y[1] - x[1]) / np.linalg.norm(x[1]) < RMS_BOUND[qtype]


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0])
def test_legacy_types_equal_ggml_reference_bytes(qtype):
    x = _weights((64, 512), seed=2)
    assert np.array_equal(quantize(x, qtype), gguf.quants.quantize(x, qtype))


def test_bad_input_is_a_named_error():
    with pytest.raises(QuantizeError, match=r"tensor blk.0.ffn_up_exps.weight: shape \[4, 96\] .* multiple of 256"):
        quantize(np.zeros((4, 96), np.float32), Q.Q4_K, "tensor blk.0.ffn_up_exps.weight")
    with pytest.raises(QuantizeError, match="multiple of 32"):
        quantize(np.zeros((4, 40), np.float32), Q.Q8_0)
    x = np.zeros((2, 512), np.float32)
    x[1, 300] = np.nan
    with pytest.raises(QuantizeError, match=r"tensor w: holds NaN or Inf \(first in block 3\)"):
        quantize(x, Q.Q4_K, "tensor w")
    with pytest.raises(QuantizeError, match="cannot write type Q2_K"):
        quantize(np.zeros((1, 256), np.float32), Q.Q2_K)


# ---- llama-quantize's per-tensor mix ------------------------------------------------------------------------------

_PUBLISHED = json.loads((Path(__file__).resolve().parents[1] / "data" / "qwen3-moe-configs.json").read_text())
QWEN3_30B_A3B = ModelConfig.from_hf_dict(_PUBLISHED["Qwen3-30B-A3B"], "Qwen3-30B-A3B")
# use_more_bits(i, 48): i < 6, i >= 42, or (i - 6) % 3 == 2 (llama.cpp src/llama-quant.cpp).
MORE_BITS_48 = {0, 1, 2, 3, 4, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 42, 43, 44, 45, 46, 47}


def _mix(name):
    return tensor_types(QWEN3_30B_A3B, parse_output_type(name))


def test_q4_k_m_mix_of_qwen3_30b_a3b_matches_llama_quantize():
    t = _mix("q4_k_m")
    assert t["token_embd.weight"] == Q.Q4_K and t["output.weight"] == Q.Q6_K and t["output_norm.weight"] == Q.F32
    for i in range(48):
        more = Q.Q6_K if i in MORE_BITS_48 else Q.Q4_K
        assert t[f"blk.{i}.attn_v.weight"] == more, i
        assert t[f"blk.{i}.ffn_down_exps.weight"] == more, i
        for name in ("attn_q", "attn_k", "attn_output", "ffn_gate_exps", "ffn_up_exps"):
            assert t[f"blk.{i}.{name}.weight"] == Q.Q4_K, (i, name)
        for name in ("attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm", "ffn_gate_inp"):
            assert t[f"blk.{i}.{name}.weight"] == Q.F32, (i, name)
    # The resulting size is the published Qwen3-30B-A3B-Q4_K_M's (18.6 GB, 17.3 GiB) within 1 %.
    sizes = _bytes(QWEN3_30B_A3B, t)
    assert abs(sum(sizes.values()) / 18.56e9 - 1) < 0.01, sum(sizes.values())


def _bytes(cfg, types):
    from tessera.engine.checkpoint_layout import gguf_tensors

    out = {}
    for t in gguf_tensors(cfg):
        block, size = gguf.GGML_QUANT_SIZES[types[t.name]]
        out[t.name] = int(np.prod(t.shape)) // block * size
    return out


def test_other_presets_of_qwen3_30b_a3b():
    q5 = _mix("q5_k_m")
    assert q5["blk.8.attn_v.weight"] == q5["blk.8.ffn_down_exps.weight"] == Q.Q6_K
    assert q5["blk.9.attn_v.weight"] == q5["blk.9.ffn_down_exps.weight"] == q5["blk.9.ffn_up_exps.weight"] == Q.Q5_K
    assert q5["output.weight"] == Q.Q6_K and q5["token_embd.weight"] == Q.Q5_K
    q6 = _mix("q6_k")
    assert {v for k, v in q6.items() if v != Q.F32} == {Q.Q6_K}
    q8 = _mix("q8_0")
    assert {v for k, v in q8.items() if v != Q.F32} == {Q.Q8_0}
    q4 = _mix("q4_0")
    assert q4["output.weight"] == Q.Q6_K and q4["token_embd.weight"] == q4["blk.3.ffn_down_exps.weight"] == Q.Q4_0
    iq = _mix("iq4_xs")  # GQA 32/4 = 8 >= 4: attn_v Q5_K; ffn_down of the first eighth of the layers Q5_K
    assert all(iq[f"blk.{i}.attn_v.weight"] == Q.Q5_K for i in range(48))
    assert [iq[f"blk.{i}.ffn_down_exps.weight"] for i in (5, 6)] == [Q.Q5_K, Q.IQ4_XS]
    assert iq["output.weight"] == Q.Q6_K and iq["token_embd.weight"] == iq["blk.0.ffn_up_exps.weight"] == Q.IQ4_XS


def test_rows_that_do_not_split_fall_back_as_llama_quantize_does():
    tiny = ModelConfig(vocab_size=437, hidden_size=96, intermediate_size=224, moe_intermediate_size=160,
                       num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, head_dim=16, num_experts=8,
                       num_experts_per_tok=2, tie_word_embeddings=True)  # 8 experts, tied embeddings
    t = tensor_types(tiny, parse_output_type("q4_k_m"))
    assert t["token_embd.weight"] == Q.Q8_0  # tied: output rules; 96 % 256 != 0 -> Q8_0
    assert t["blk.0.ffn_up_exps.weight"] == t["blk.0.ffn_down_exps.weight"] == Q.Q5_0  # Q4_K -> Q5_0
    assert t["blk.2.ffn_down_exps.weight"] == Q.Q8_0  # use_more_bits(2, 3): Q6_K -> Q8_0
    assert t["blk.0.attn_v.weight"] == Q.Q8_0 and t["blk.0.attn_k.weight"] == Q.Q8_0  # the 8-expert rule
    assert t["blk.1.attn_output.weight"] == Q.Q5_1  # 8 experts: Q5_K, which falls back to Q5_1
    iq = tensor_types(tiny, parse_output_type("iq4_xs"))
    assert iq["blk.1.ffn_gate_exps.weight"] == Q.IQ4_NL
    odd = ModelConfig(vocab_size=437, hidden_size=40, intermediate_size=40, moe_intermediate_size=40,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=20, num_experts=4,
                      num_experts_per_tok=2)  # rows of 40 split into neither 32 nor 256
    assert tensor_types(odd, parse_output_type("q4_k_m"))["blk.0.ffn_up_exps.weight"] == Q.F16


# ---- files -----------------------------------------------------------------------------------------------------------


def test_cli_choices_match_the_engine():
    from tessera.engine.cli import convert as cli_convert
    from tessera.engine.cli import make_model as cli_make_model
    from tessera.engine.make_model import MAKE_MODEL_DTYPES, PRESETS

    assert cli_make_model.DTYPE_NAMES == MAKE_MODEL_DTYPES and cli_make_model.PRESET_NAMES == tuple(PRESETS)
    assert set(MAKE_MODEL_DTYPES) == {"f32", "bf16", *QUANTIZED_NAMES}
    import argparse

    p = argparse.ArgumentParser()
    cli_convert.add_arguments(p)
    choices = next(a.choices for a in p._actions if a.dest == "dtype")
    assert set(choices) == set(OUTPUT_TYPES)


@pytest.mark.parametrize("dtype", QUANTIZED_NAMES)
def test_make_model_writes_the_mix_and_valid_blocks(tmp_path, dtype):
    import torch

    from tessera.engine.checkpoint_layout import gguf_tensors
    from tessera.engine.make_model import RandomWeights, hf_config, make_model

    path = make_model(tmp_path / f"{dtype}.gguf", preset="tiny-kquant", fmt="gguf", dtype=dtype, seed=4)
    reader = gguf.GGUFReader(path)
    out_type = parse_output_type(dtype)
    assert reader.fields["general.file_type"].contents() == int(out_type.file_type)
    cfg = hf_config("tiny-kquant", layers=None, dtype="f32", tok=_tok(tmp_path), overrides={})
    config = ModelConfig.from_hf_dict(cfg)
    expected = tensor_types(config, out_type)
    got = {t.name: Q(t.tensor_type) for t in reader.tensors}
    assert got == expected
    mix = collections.Counter(got.values())
    assert mix[out_type.default] >= 4 * 5  # every layer's q, k, output, gate/up experts at least
    if dtype in ("q4_k_m", "q5_k_m"):  # 4 layers: use_more_bits picks layers 2 and 3
        assert [got[f"blk.{i}.ffn_down_exps.weight"] for i in range(4)] == [out_type.default] * 2 + [Q.Q6_K] * 2
    # Each quantized tensor decodes (gguf.quants.dequantize) to make-model's random weights within its type's bound.
    weights = RandomWeights(cfg, 4, torch.float32)
    sources = {t.name: t.sources for t in gguf_tensors(config)}
    for t in reader.tensors:
        qtype = Q(t.tensor_type)
        if qtype == Q.F32:
            continue
        want = torch.stack([weights.get(s) for s in sources[t.name]]) if len(sources[t.name]) > 1 else None
        want = (want if want is not None else weights.get(sources[t.name][0])).numpy()
        got_values = dequantize(np.asarray(t.data), qtype).reshape(want.shape)
        rel = np.linalg.norm(got_values - want) / np.linalg.norm(want)
        assert rel < RMS_BOUND[qtype], (t.name, qtype.name, rel)


def _tok(tmp_path):
    from tessera.engine.make_model import TOKENIZER_BPE_SIZE
    from tessera.engine.tokenizer_build import build_tokenizer

    folder = tmp_path / "tok"
    folder.mkdir(exist_ok=True)
    return build_tokenizer(None, TOKENIZER_BPE_SIZE, folder)


def test_convert_writes_the_same_quantized_file_as_make_model(tmp_path):
    from tessera.engine.convert import convert, output_bytes, read_source
    from tessera.engine.make_model import make_model

    hf = make_model(tmp_path / "hf", preset="tiny-kquant", seed=6)
    direct = make_model(tmp_path / "direct.gguf", preset="tiny-kquant", fmt="gguf", dtype="q4_k_m", seed=6)
    converted = convert(hf, tmp_path / "converted.gguf", dtype="q4_k_m")
    ra, rb = gguf.GGUFReader(direct), gguf.GGUFReader(converted)
    assert [(t.name, t.tensor_type) for t in ra.tensors] == [(t.name, t.tensor_type) for t in rb.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(ra.tensors, rb.tensors))
    data = sum(int(t.n_bytes) for t in rb.tensors)
    assert output_bytes(read_source(hf), "q4_k_m") == data


def test_quantized_tiny_model_loads_and_runs_in_the_engine(tmp_path):
    """The tiny preset's rows (96, 160) do not split into 256: llama.cpp's fallback types (Q5_0, Q5_1, Q8_0) appear,
    and the engine reads them; its logits stay close to the f32 file's."""
    from tessera.engine.compare import compare
    from tessera.engine.make_model import make_model

    f32 = make_model(tmp_path / "f32.gguf", fmt="gguf", dtype="f32", seed=2)
    q = make_model(tmp_path / "q.gguf", fmt="gguf", dtype="q4_k_m", seed=2)
    types = {Q(t.tensor_type) for t in gguf.GGUFReader(q).tensors}
    assert {Q.Q5_0, Q.Q8_0, Q.F32} <= types and Q.Q4_K not in types
    report = compare(f32, q)
    # Random-weight logits are nearly flat (range ~2), so 4/5-bit weights flip many near-ties: KL is the measure.
    assert report.mean_kl < 0.02, report
