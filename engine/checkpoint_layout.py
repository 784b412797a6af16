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

from engine.config import ModelConfig
from engine.errors import ModelFormatError

T = gguf.MODEL_TENSOR
_ARCH = gguf.MODEL_ARCH.QWEN3MOE


def gguf_name(tensor: gguf.MODEL_TENSOR, bid: int | None = None) -> str:
    """The GGUF tensor name llama.cpp gives `tensor` (of block `bid`), with the `.weight` suffix."""
    base = gguf.TENSOR_NAMES[tensor]
    return (base.format(bid=bid) if bid is not None else base) + ".weight"


@dataclass(frozen=True)
class Dims:
    """The sizes of a Qwen3-MoE model, read from an HF config dict (published or current-transformers form)."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    experts_per_tok: int
    moe_inter: int
    dense_inter: int
    tied: bool
    moe_layers: tuple[bool, ...]  # per layer: True when the MLP is the sparse MoE block

    @classmethod
    def from_hf_config(cls, cfg: dict, subject: str = "config.json") -> Dims:
        def need(key: str, alias: str | None = None) -> int:
            if cfg.get(key) is None and alias is not None and cfg.get(alias) is not None:
                key = alias
            if cfg.get(key) is None:
                raise ModelFormatError(subject, f"missing key {key!r}")
            value = cfg[key]
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelFormatError(subject, f"key {key!r} must be a positive integer, got {value!r}")
            return value

        hidden, heads, layers = need("hidden_size"), need("num_attention_heads"), need("num_hidden_layers")
        head_dim = cfg.get("head_dim") or hidden // heads
        kv_heads = need("num_key_value_heads")
        if heads % kv_heads:
            raise ModelFormatError(
                subject, f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        experts = need("num_experts", "num_local_experts")  # the latter as transformers 5 writes it
        step = cfg.get("decoder_sparse_step", 1) or 1
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        moe_layers = tuple(i not in mlp_only and (i + 1) % step == 0 for i in range(layers))
        top_k = need("num_experts_per_tok")
        if top_k > experts:
            raise ModelFormatError(subject, f"num_experts_per_tok {top_k} exceeds num_experts {experts}")
        return cls(
            vocab=need("vocab_size"),
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=int(head_dim),
            experts=experts,
            experts_per_tok=top_k,
            moe_inter=need("moe_intermediate_size"),
            dense_inter=need("intermediate_size") if not all(moe_layers) else int(cfg.get("intermediate_size") or 0),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            moe_layers=moe_layers,
        )


@dataclass(frozen=True)
class GGUFTensor:
    """One GGUF tensor and the HF checkpoint tensors it is made of (several when experts are stacked)."""

    name: str
    shape: tuple[int, ...]  # numpy/torch order, e.g. [E, I, H] for ffn_gate_exps
    sources: tuple[str, ...]  # HF names; stacked along a new dim 0 when more than one
    kind: gguf.MODEL_TENSOR
    canonical: str = ""  # the loaded model's name: the HF name, `model.layers.{i}.mlp.experts.{proj}` for a stack

    @property
    def stacked(self) -> bool:
        """Routed experts: one [E, ...] tensor here, one HF tensor per expert."""
        return self.canonical != self.sources[0]


def model_tensors(cfg: ModelConfig) -> Iterator[GGUFTensor]:
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


def hf_checkpoint_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF checkpoint name -> shape, for every tensor a Qwen3-MoE checkpoint of `cfg` stores (experts one by one)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for t in model_tensors(cfg):
        per_source = t.shape[1:] if t.stacked else t.shape
        for src in t.sources:
            shapes[src] = per_source
    return shapes


def gguf_tensors(d: Dims) -> Iterator[GGUFTensor]:
    """Every tensor of the GGUF file for dims `d`, in writing order, with the HF tensors each is built from."""

    def one(kind: T, bid: int | None, hf: str, shape: tuple[int, ...]) -> GGUFTensor:
        return GGUFTensor(gguf_name(kind, bid), shape, (hf,), kind)

    yield one(T.TOKEN_EMBD, None, "model.embed_tokens.weight", (d.vocab, d.hidden))
    for i in range(d.layers):
        p = f"model.layers.{i}."
        q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
        yield one(T.ATTN_NORM, i, p + "input_layernorm.weight", (d.hidden,))
        yield one(T.ATTN_Q, i, p + "self_attn.q_proj.weight", (q, d.hidden))
        yield one(T.ATTN_Q_NORM, i, p + "self_attn.q_norm.weight", (d.head_dim,))
        yield one(T.ATTN_K, i, p + "self_attn.k_proj.weight", (kv, d.hidden))
        yield one(T.ATTN_K_NORM, i, p + "self_attn.k_norm.weight", (d.head_dim,))
        yield one(T.ATTN_V, i, p + "self_attn.v_proj.weight", (kv, d.hidden))
        yield one(T.ATTN_OUT, i, p + "self_attn.o_proj.weight", (d.hidden, q))
        yield one(T.FFN_NORM, i, p + "post_attention_layernorm.weight", (d.hidden,))
        if d.moe_layers[i]:
            yield one(T.FFN_GATE_INP, i, p + "mlp.gate.weight", (d.experts, d.hidden))
            for kind, proj, shape in (
                (T.FFN_GATE_EXP, "gate_proj", (d.moe_inter, d.hidden)),
                (T.FFN_UP_EXP, "up_proj", (d.moe_inter, d.hidden)),
                (T.FFN_DOWN_EXP, "down_proj", (d.hidden, d.moe_inter)),
            ):
                srcs = tuple(f"{p}mlp.experts.{e}.{proj}.weight" for e in range(d.experts))
                yield GGUFTensor(gguf_name(kind, i), (d.experts, *shape), srcs, kind)
        else:
            yield one(T.FFN_GATE, i, p + "mlp.gate_proj.weight", (d.dense_inter, d.hidden))
            yield one(T.FFN_UP, i, p + "mlp.up_proj.weight", (d.dense_inter, d.hidden))
            yield one(T.FFN_DOWN, i, p + "mlp.down_proj.weight", (d.hidden, d.dense_inter))
    yield one(T.OUTPUT_NORM, None, "model.norm.weight", (d.hidden,))
    if not d.tied:
        yield one(T.OUTPUT, None, "lm_head.weight", (d.vocab, d.hidden))


def hf_shapes(d: Dims) -> dict[str, tuple[int, ...]]:
    """HF checkpoint name -> shape, for every tensor a Qwen3-MoE checkpoint of dims `d` stores (experts one by one)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for t in gguf_tensors(d):
        per_source = t.shape[1:] if len(t.sources) > 1 else t.shape
        for src in t.sources:
            shapes[src] = per_source
    return shapes


def is_norm(t: GGUFTensor) -> bool:
    return len(t.shape) == 1


def arch_name() -> str:
    return gguf.MODEL_ARCH_NAMES[_ARCH]
