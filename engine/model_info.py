"""`inspect_model(path) -> ModelInfo`: what a model is and how big, from its headers only (no weight is read).

For the model panel and the fit estimate. The tensor table is checked against the config exactly as loading will
check it, so a file that cannot load is reported here, before any memory is committed.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import GGUF_ARCH, ModelConfig
from engine.errors import ModelFormatError

_GGUF_EXPERT = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)_exps\.weight$")
_HF_EXPERT = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.")
_EMBEDDING = ("token_embd.weight", "model.embed_tokens.weight")


@dataclass(frozen=True)
class ModelInfo:
    """Header facts about a model. Byte counts: `total_bytes` as stored on disk, `loaded_bytes` in memory after load
    (quantized types become float32), `expert_bytes` the routed experts' share of total_bytes, and
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
    num_tensors: int = 0
    total_bytes: int = 0
    loaded_bytes: int = 0
    expert_bytes: int = 0
    active_expert_bytes_per_token: int = 0
    active_bytes_per_token: int = 0
    parameters: int = 0


def inspect_model(path: str | os.PathLike[str]) -> ModelInfo:
    p = Path(path)
    if p.is_dir():
        return _inspect_hf(p)
    if p.suffix.lower() == ".safetensors" or p.name == "config.json":
        return _inspect_hf(p.parent)
    if p.suffix.lower() in (".bin", ".pt", ".pth", ".ckpt", ".pkl"):
        from engine.safetensors_reader import refuse_pickle

        raise refuse_pickle(p)
    return _inspect_gguf(p)


def _inspect_gguf(path: Path) -> ModelInfo:
    from engine import quants
    from engine.gguf_reader import open_gguf_model
    from engine.weights import check_gguf_tensors

    if not path.exists():
        raise ModelFormatError(str(path), "does not exist")
    f = open_gguf_model(path)
    cfg = ModelConfig.from_gguf(f.metadata, str(path), f.tensors.keys())
    check_gguf_tensors(cfg, {n: t.shape for n, t in f.tensors.items()}, str(path))
    sizes = []
    for t in f.tensors.values():
        n = 1
        for d in t.shape:
            n *= d
        loaded = t.nbytes if t.ggml_type in quants.FLOAT_TYPES else 4 * n
        sizes.append((t.name, t.type_name, n, t.nbytes, loaded, bool(_GGUF_EXPERT.match(t.name))))
    name = f.metadata.get("general.name") or path.stem
    f.close()
    return _info(str(path), "gguf", str(name), cfg, sizes)


def _inspect_hf(folder: Path) -> ModelInfo:
    from engine.safetensors_reader import open_hf_folder
    from engine.weights import plan_hf

    ckpt = open_hf_folder(folder)
    plan_hf(ckpt, str(folder))
    sizes = []
    for n in ckpt.names:
        if n == "lm_head.weight" and ckpt.config.tie_word_embeddings:
            continue
        count = 1
        for d in ckpt.shape(n):
            count *= d
        b = ckpt.nbytes(n)
        sizes.append((n, ckpt.dtype(n), count, b, b, bool(_HF_EXPERT.match(n))))
    return _info(str(folder), "hf", folder.name, ckpt.config, sizes)


_Sizes = list[tuple[str, str, int, int, int, bool]]


def _info(path: str, fmt: str, name: str, cfg: ModelConfig, sizes: _Sizes) -> ModelInfo:
    """sizes: (tensor, type name, elements, stored bytes, loaded bytes, is routed expert) per stored tensor."""
    types = Counter(t for _, t, _, _, _, _ in sizes)
    total = sum(s[3] for s in sizes)
    expert = sum(s[3] for s in sizes if s[5])
    rest = sum(s[3] for s in sizes if not s[5] and s[0] not in _EMBEDDING)
    embed_row = sum(s[3] // cfg.vocab_size for s in sizes if s[0] in _EMBEDDING)
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
        num_tensors=len(sizes),
        total_bytes=total,
        loaded_bytes=sum(s[4] for s in sizes),
        expert_bytes=expert,
        active_expert_bytes_per_token=active_expert,
        active_bytes_per_token=active_expert + rest + embed_row,
        parameters=sum(s[2] for s in sizes),
    )
