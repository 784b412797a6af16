"""The tensors of a Qwen3-MoE model: for a `ModelConfig`, every tensor's llama.cpp (`qwen3moe`) GGUF name, the name the
loaded model uses (Hugging Face's, with routed experts stacked), its shape, and the HF checkpoint tensors it is made of.
The one GGUF <-> HF name table: the loader (what a file must hold), make-model (what to generate) and the converter
(what to expect, and where it goes) all read it.

Letters: V vocab, H hidden, nh/nkv query/kv heads, hd head_dim, E experts, I expert intermediate, Id dense intermediate.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import gguf

from tessera.engine.config import ModelConfig

T = gguf.MODEL_TENSOR
_ARCH = gguf.MODEL_ARCH.QWEN3MOE


def gguf_name(tensor: gguf.MODEL_TENSOR, bid: int | None = None) -> str:
    """The GGUF tensor name llama.cpp gives `tensor` (of block `bid`), with the `.weight` suffix."""
    base = gguf.TENSOR_NAMES[tensor]
    return (base.format(bid=bid) if bid is not None else base) + ".weight"


@dataclass(frozen=True)
class GGUFTensor:
    """One GGUF tensor and the HF checkpoint tensors it is made of (several when experts are stacked)."""

    name: str
    shape: tuple[int, ...]  # numpy/torch order, e.g. [E, I, H] for ffn_gate_exps
    sources: tuple[str, ...]  # HF names; one per expert (stacked along a new dim 0) for routed experts
    kind: gguf.MODEL_TENSOR
    canonical: str  # the loaded model's name: the HF name, `model.layers.{i}.mlp.experts.{proj}` for a stack

    @property
    def stacked(self) -> bool:
        """Routed experts: one [E, ...] tensor here, one HF tensor per expert."""
        return self.canonical != self.sources[0]


def gguf_tensors(cfg: ModelConfig) -> Iterator[GGUFTensor]:
    """Every tensor of a model of `cfg`, in GGUF writing order (embedding, blocks, final norm, head unless tied)."""
    H, hd, E, I, Id = cfg.hidden_size, cfg.head_dim, cfg.num_experts, cfg.moe_intermediate_size, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd

    def one(kind: T, bid: int | None, hf: str, shape: tuple[int, ...]) -> GGUFTensor:
        return GGUFTensor(gguf_name(kind, bid), shape, (hf,), kind, hf)

    yield one(T.TOKEN_EMBD, None, "model.embed_tokens.weight", (cfg.vocab_size, H))
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        yield one(T.ATTN_NORM, i, p + "input_layernorm.weight", (H,))
        yield one(T.ATTN_Q, i, p + "self_attn.q_proj.weight", (q, H))
        yield one(T.ATTN_Q_NORM, i, p + "self_attn.q_norm.weight", (hd,))
        yield one(T.ATTN_K, i, p + "self_attn.k_proj.weight", (kv, H))
        yield one(T.ATTN_K_NORM, i, p + "self_attn.k_norm.weight", (hd,))
        yield one(T.ATTN_V, i, p + "self_attn.v_proj.weight", (kv, H))
        yield one(T.ATTN_OUT, i, p + "self_attn.o_proj.weight", (H, q))
        yield one(T.FFN_NORM, i, p + "post_attention_layernorm.weight", (H,))
        if cfg.is_moe_layer(i):
            yield one(T.FFN_GATE_INP, i, p + "mlp.gate.weight", (E, H))
            for kind, proj, shape in (
                (T.FFN_GATE_EXP, "gate_proj", (I, H)),  # stacked: [E, I, H]
                (T.FFN_UP_EXP, "up_proj", (I, H)),  # [E, I, H]
                (T.FFN_DOWN_EXP, "down_proj", (H, I)),  # [E, H, I]
            ):
                srcs = tuple(f"{p}mlp.experts.{e}.{proj}.weight" for e in range(E))
                yield GGUFTensor(gguf_name(kind, i), (E, *shape), srcs, kind, f"{p}mlp.experts.{proj}")
        else:
            yield one(T.FFN_GATE, i, p + "mlp.gate_proj.weight", (Id, H))
            yield one(T.FFN_UP, i, p + "mlp.up_proj.weight", (Id, H))
            yield one(T.FFN_DOWN, i, p + "mlp.down_proj.weight", (H, Id))
    yield one(T.OUTPUT_NORM, None, "model.norm.weight", (H,))
    if not cfg.tie_word_embeddings:
        yield one(T.OUTPUT, None, "lm_head.weight", (cfg.vocab_size, H))


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF checkpoint name -> shape, for every tensor a Qwen3-MoE checkpoint of `cfg` stores (experts one by one)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for t in gguf_tensors(cfg):
        per_source = t.shape[1:] if t.stacked else t.shape
        for src in t.sources:
            shapes[src] = per_source
    return shapes


def is_norm(t: GGUFTensor) -> bool:
    return len(t.shape) == 1


def arch_name() -> str:
    return gguf.MODEL_ARCH_NAMES[_ARCH]
