"""Which GGML type each tensor of a written GGUF gets, for every `--dtype` Tessera writes (make-model and convert).

Float outputs (f32, f16, bf16) and q8_0 follow llama.cpp's convert_hf_to_gguf.py: 1-D tensors (norms) and the router
(`ffn_gate_inp`) F32, every other matrix the requested type, F16 where a row does not split into Q8_0's 32-element
blocks.

The quantized presets (q4_0, q4_k_m, q5_k_m, q6_k, iq4_xs) reproduce the per-tensor mix llama.cpp's `llama-quantize`
writes without an importance matrix: `llama_tensor_get_type` and `tensor_type_fallback` in llama.cpp's
src/llama-quant.cpp (ggml-org/llama.cpp, commit 007dbbf3), for the tensors a qwen3moe file holds. docs/FORMATS.md lists
the rules; tests/formats/test_quant_mix.py checks them on a 48-layer Qwen3-30B-A3B-shaped table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import gguf

from tessera.engine.checkpoint_layout import GGUFTensor, gguf_tensors, is_norm
from tessera.engine.config import ModelConfig
from tessera.engine.errors import TesseraError

Q = gguf.GGMLQuantizationType
K = gguf.MODEL_TENSOR
FT = gguf.LlamaFileType


@dataclass(frozen=True)
class OutputType:
    """One `--dtype` choice: its name, the general.file_type it writes, and the type most matrices take."""

    name: str
    file_type: gguf.LlamaFileType
    default: gguf.GGMLQuantizationType

    @property
    def is_mix(self) -> bool:
        """Whether llama-quantize's per-tensor rules apply (the block-quantized presets)."""
        return self.default not in (Q.F32, Q.F16, Q.BF16, Q.Q8_0)


OUTPUT_TYPES: dict[str, OutputType] = {
    o.name: o
    for o in (
        OutputType("f32", FT.ALL_F32, Q.F32),
        OutputType("f16", FT.MOSTLY_F16, Q.F16),
        OutputType("bf16", FT.MOSTLY_BF16, Q.BF16),
        OutputType("q8_0", FT.MOSTLY_Q8_0, Q.Q8_0),
        OutputType("q4_0", FT.MOSTLY_Q4_0, Q.Q4_0),
        OutputType("q4_k_m", FT.MOSTLY_Q4_K_M, Q.Q4_K),
        OutputType("q5_k_m", FT.MOSTLY_Q5_K_M, Q.Q5_K),
        OutputType("q6_k", FT.MOSTLY_Q6_K, Q.Q6_K),
        OutputType("iq4_xs", FT.MOSTLY_IQ4_XS, Q.IQ4_XS),
    )
}
QUANTIZED_NAMES = tuple(n for n, o in OUTPUT_TYPES.items() if o.default not in (Q.F32, Q.F16, Q.BF16))

# tensor_type_fallback: the type llama-quantize uses when a row does not split into the chosen type's blocks.
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0, Q.IQ4_XS: Q.IQ4_NL}


def parse_output_type(name: str, flag: str = "--dtype") -> OutputType:
    try:
        return OUTPUT_TYPES[name.lower()]
    except KeyError:
        raise TesseraError(flag, f"unknown type {name!r}; choose one of {', '.join(OUTPUT_TYPES)}") from None


def _fits(shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> bool:
    return shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third one between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _layer(t: GGUFTensor) -> int:
    m = re.match(r"blk\.(\d+)\.", t.name)
    assert m is not None, t.name
    return int(m.group(1))


def _mix_type(t: GGUFTensor, cfg: ModelConfig, out: OutputType) -> gguf.GGMLQuantizationType:
    """llama_tensor_get_type_impl for the tensors of a qwen3moe file and the presets in OUTPUT_TYPES (no imatrix)."""
    ft, new = out.file_type, out.default
    gqa = cfg.num_attention_heads // cfg.num_key_value_heads
    if t.kind == K.OUTPUT or (cfg.tie_word_embeddings and t.kind == K.TOKEN_EMBD):
        return Q.Q8_0 if not _fits(t.shape, new) else (new if new == Q.Q8_0 else Q.Q6_K)
    if t.kind == K.TOKEN_EMBD:
        return new
    if t.kind == K.ATTN_V:  # counted once per layer, in layer order, so i_attention_wv is the layer index
        if ft == FT.MOSTLY_IQ4_XS and gqa >= 4:
            new = Q.Q5_K
        elif ft in (FT.MOSTLY_Q4_K_M, FT.MOSTLY_Q5_K_M) and _use_more_bits(_layer(t), cfg.num_hidden_layers):
            new = Q.Q6_K
        if cfg.num_experts == 8:
            new = Q.Q8_0
        return new
    if t.kind == K.ATTN_K:
        return Q.Q8_0 if cfg.num_experts == 8 else new
    if t.kind in (K.FFN_DOWN, K.FFN_DOWN_EXP):
        i, n = _layer(t), cfg.num_hidden_layers
        if ft in (FT.MOSTLY_Q4_K_M, FT.MOSTLY_Q5_K_M) and _use_more_bits(i, n):
            return Q.Q6_K
        if ft == FT.MOSTLY_IQ4_XS and i < n // 8:
            return Q.Q5_K
        return new
    if t.kind == K.ATTN_OUT and cfg.num_experts == 8 and ft in (FT.MOSTLY_Q4_K_M, FT.MOSTLY_IQ4_XS):
        return Q.Q5_K
    return new


def tensor_type(t: GGUFTensor, cfg: ModelConfig, out: OutputType) -> gguf.GGMLQuantizationType:
    """The GGML type tensor `t` of a model of `cfg` is written in, for output type `out`."""
    if is_norm(t) or t.kind == K.FFN_GATE_INP:
        return Q.F32
    if out.default in (Q.F32, Q.F16, Q.BF16):
        return out.default
    chosen = _mix_type(t, cfg, out) if out.is_mix else out.default
    if not _fits(t.shape, chosen):
        chosen = _FALLBACK.get(chosen, Q.F16)
        if not _fits(t.shape, chosen):  # llama.cpp: "must use F16 due to unusual shape"
            chosen = Q.F16
    return chosen


def tensor_types(cfg: ModelConfig, out: OutputType) -> dict[str, gguf.GGMLQuantizationType]:
    """GGUF tensor name -> type, for every tensor of the file, in writing order."""
    return {t.name: tensor_type(t, cfg, out) for t in gguf_tensors(cfg)}
