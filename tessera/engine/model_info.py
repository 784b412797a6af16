"""`inspect_model(path) -> ModelInfo`: what a model is and how big, from its headers only (no weight is read).

For the model panel and the fit estimate. The tensor table is checked against the config exactly as loading will
check it, so a file that cannot load is reported here, before any memory is committed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import gguf

from tessera.engine.config import GGUF_ARCH, ModelConfig

if TYPE_CHECKING:
    from tessera.engine.weights import ModelFile


@dataclass(frozen=True)
class ModelInfo:
    """Header facts about a model. Byte counts: `total_bytes` as stored on disk, `loaded_bytes` in memory after load
    (engine.quantized.held_bytes: quantized routed experts and 2-D weights stay as their blocks; only a 2-D weight of
    a type the dense kernels do not read becomes float32), `type_bytes` the stored bytes per type (with
    `tensor_types`, the file's type mix), `expert_bytes` the routed experts' share of total_bytes, and
    `active_bytes_per_token` the weight bytes one decoded token reads: k/E of the experts plus every other matrix
    except the embedding table (of which one row is read)."""

    path: str
    format: str  # "gguf" | "hf"
    architecture: str
    name: str
    num_hidden_layers: int
    num_experts: int
    num_experts_per_tok: int
    hidden_size: int
    moe_intermediate_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    dense_layers: list[int] = field(default_factory=list)
    tie_word_embeddings: bool = False
    tensor_types: dict[str, int] = field(default_factory=dict)  # type name -> number of tensors
    type_bytes: dict[str, int] = field(default_factory=dict)  # type name -> bytes stored in that type
    expert_type: str = ""  # stored type of the routed experts (BF16, Q8_0, ...), "mixed" when layers differ
    expert_types: tuple[str, ...] = ()  # every stored type among the routed experts (Q4_K, Q6_K for a Q4_K_M file)
    num_tensors: int = 0
    total_bytes: int = 0
    loaded_bytes: int = 0
    expert_bytes: int = 0
    active_expert_bytes_per_token: int = 0
    active_bytes_per_token: int = 0
    parameters: int = 0
    ram: RamEstimate | None = None  # inspect_model fills it


def inspect_model(
    model: ModelFile | str | os.PathLike[str], *, context_length: int | None = None, backend: str = "Auto",
    kv_cache_type: str = "bf16",
) -> ModelInfo:
    """Header facts of an opened model (engine.weights.open_model), or of the model file or folder at a path, with
    `ram`: what loading it with expert backend `backend` and a KV cache of `context_length` (default: the model's)
    will hold (estimate_ram)."""
    from tessera.engine.quantized import held_bytes
    from tessera.engine.weights import ModelFile, open_model

    if not isinstance(model, ModelFile):
        model = open_model(model)
    sizes: _Sizes = []
    for t in model.tensors:  # the checked table: every stored tensor, and which are routed experts or the embedding
        embedding = t.kind == gguf.MODEL_TENSOR.TOKEN_EMBD
        if model.gguf is not None:
            g = model.gguf.info(t.name)
            n = math.prod(g.shape)
            loaded = held_bytes(g.ggml_type, n, g.nbytes, t.stacked, len(g.shape))  # the loader's rule
            sizes.append((g.type_name, n, g.nbytes, loaded, t.stacked, embedding))
        else:
            for src in t.sources:
                b = model.hf.nbytes(src)
                sizes.append((model.hf.dtype(src), math.prod(model.hf.shape(src)), b, b, t.stacked, embedding))
    if model.gguf is not None:
        name = str(model.gguf.metadata.get("general.name") or model.path.stem)
    else:
        name = model.path.name
    info = _info(str(model.path), model.format, name, model.config, sizes)
    return dataclasses.replace(info, ram=estimate_ram(info, context_length, backend, kv_cache_type))


_Sizes = list[tuple[str, int, int, int, bool, bool]]


def _info(path: str, fmt: str, name: str, cfg: ModelConfig, sizes: _Sizes) -> ModelInfo:
    """sizes: (type name, elements, stored bytes, loaded bytes, is a routed expert, is the embedding) per stored
    tensor."""
    types = Counter(s[0] for s in sizes)
    type_bytes: Counter[str] = Counter()
    for s in sizes:
        type_bytes[s[0]] += s[2]
    expert_types = {s[0] for s in sizes if s[4]}
    total = sum(s[2] for s in sizes)
    expert = sum(s[2] for s in sizes if s[4])
    rest = sum(s[2] for s in sizes if not s[4] and not s[5])
    embed_row = sum(s[2] // cfg.vocab_size for s in sizes if s[5])
    active_expert = expert * cfg.num_experts_per_tok // cfg.num_experts
    return ModelInfo(
        path=path,
        format=fmt,
        architecture=GGUF_ARCH,
        name=name,
        num_hidden_layers=cfg.num_hidden_layers,
        num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        hidden_size=cfg.hidden_size,
        moe_intermediate_size=cfg.moe_intermediate_size,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size,
        context_length=cfg.max_position_embeddings,
        dense_layers=cfg.dense_layers,
        tie_word_embeddings=cfg.tie_word_embeddings,
        tensor_types=dict(sorted(types.items())),
        type_bytes=dict(sorted(type_bytes.items())),
        expert_type=next(iter(expert_types)) if len(expert_types) == 1 else "mixed",
        expert_types=tuple(sorted(expert_types)),
        num_tensors=len(sizes),
        total_bytes=total,
        loaded_bytes=sum(s[3] for s in sizes),
        expert_bytes=expert,
        active_expert_bytes_per_token=active_expert,
        active_bytes_per_token=active_expert + rest + embed_row,
        parameters=sum(s[1] for s in sizes),
    )


@dataclass(frozen=True)
class RamEstimate:
    """What a load will hold in RAM, from header facts (engine.model_info.estimate_ram)."""

    backend: str  # the expert backend it is sized for ("Auto" resolved)
    context_length: int
    weights_bytes: int  # the tensors as the loader holds them (ModelInfo.loaded_bytes)
    packed_bytes: int  # the native backend's packed copy of the routed experts (0 for Torch, and for quantized
    # experts a native backend reads in place)
    kv_bytes: int  # the KV cache (bf16 or q8_0) at context_length, plus its float32 scratch of one layer
    transient_bytes: int  # the largest temporary while loading: one layer of quantized experts widened for packing
    # (0 when they are read in place)
    prefill_bytes: int = 0  # the expert layer's working buffers for one prefill step (prefill_scratch_bytes)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.packed_bytes + self.kv_bytes + self.transient_bytes + self.prefill_bytes


def prefill_scratch_bytes(info: ModelInfo, context_length: int) -> int:
    """The expert layer's buffers for one prefill step of min(generate.PREFILL_CHUNK, context_length) tokens: each
    routed slot's hidden activation and output in float32, T * k * (I + H) * 4 bytes (184.5 MB for Qwen3-30B-A3B at
    2048 tokens). The native kernels keep them on the calling thread from step to step (quant_driver.cpp `grown`,
    moe_body.inc `scratch`); the torch path makes tensors of the same sizes during the step."""
    from tessera.engine.generate import PREFILL_CHUNK

    if info.num_hidden_layers == len(info.dense_layers) or not info.num_experts:
        return 0
    T = min(PREFILL_CHUNK, context_length)
    return T * info.num_experts_per_tok * (info.moe_intermediate_size + info.hidden_size) * 4


def estimate_ram(info: ModelInfo, context_length: int | None = None, backend: str = "Auto",
                 kv_cache_type: str = "bf16") -> RamEstimate:
    """RAM a load of the model described by `info` takes with expert backend `backend` and a KV cache of
    `context_length` positions (default: the model's; a larger wish is clamped to it, as a load does). Weights as
    engine.weights holds them (the same held_bytes rule), the packed copy from engine.native's own packed-size function
    and its in-place rule (quantized experts that the block kernels read take no packed copy and no float32 layer; a
    file where only some layers have a type without a block kernel is sized as if every layer were widened), the KV
    cache (of `kv_cache_type`: "bf16" or "q8_0") from engine.kv_cache's, as the loaded model's cache reports it, and the
    expert layer's prefill buffers (prefill_scratch_bytes)."""
    import torch

    from tessera.engine.backends import TORCH, resolve
    from tessera.engine.kv_cache import kv_bytes, kv_dtype

    concrete, _ = resolve(backend)
    ctx = min(context_length or info.context_length, info.context_length)  # as engine.session clamps it
    kv = kv_bytes(info.num_hidden_layers, info.num_key_value_heads, info.head_dim, ctx, kv_dtype(kv_cache_type))
    kv += kv_bytes(1, info.num_key_value_heads, info.head_dim, ctx, torch.float32)  # the scratch of one layer
    moe_layers = info.num_hidden_layers - len(info.dense_layers)
    E, I, H = info.num_experts, info.moe_intermediate_size, info.hidden_size
    packed = transient = 0
    if concrete != TORCH and moe_layers:
        from tessera.engine.native import (
            has_block_kernel,
            packed_nbytes_for,
            reads_quantized_in_place,
            widened_layer_nbytes,
        )

        quantized = info.expert_type not in ("F32", "F16", "BF16")  # block types, or a mix of them (q4_k_m)
        types = info.expert_types or (info.expert_type,)
        in_place = quantized and reads_quantized_in_place(backend, concrete) and all(map(has_block_kernel, types))
        if not in_place:
            dtype = {"F16": torch.float16, "BF16": torch.bfloat16}.get(info.expert_type, torch.float32)
            packed = moe_layers * packed_nbytes_for(concrete, E, I, H, dtype)
            transient = widened_layer_nbytes(E, I, H) if quantized else 0
    return RamEstimate(concrete, ctx, info.loaded_bytes, packed, kv, transient, prefill_scratch_bytes(info, ctx))
