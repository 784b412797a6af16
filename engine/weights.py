"""Checkpoint (GGUF or HF safetensors) -> `ModelWeights`: a ModelConfig and tensors under canonical (HF) names.

ONE table (`_GLOBAL`, `_LAYER`, `_MOE`, `_DENSE`) gives every canonical tensor, its llama.cpp GGUF name and its shape
from the config. Loading checks the checkpoint against it both ways: a tensor the table does not know, a tensor the
config needs but the file lacks, and a wrong shape are each a ModelFormatError naming the tensor.

Routed experts are stacked per layer: gate_proj/up_proj [E, I, H], down_proj [E, H, I] (GGUF stores them stacked
already; HF stores `model.layers.{i}.mlp.experts.{e}.{proj}.weight` one by one and they are copied into one tensor).
Stored dtypes are kept (bf16 stays bf16, zero-copy from the memory map); quantized GGUF types become float32.

Letters: V vocab, H hidden, nh/nkv query/kv heads, hd head_dim, E experts, I moe_intermediate, Id dense intermediate.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.errors import Cancelled, ModelFormatError
from engine.events import ProgressEvent

Shape = Callable[[ModelConfig], tuple[int, ...]]

# (canonical name, GGUF name, shape). Names with {i} are per decoder layer.
_GLOBAL: list[tuple[str, str, Shape]] = [
    ("model.embed_tokens.weight", "token_embd.weight", lambda c: (c.vocab_size, c.hidden_size)),
    ("model.norm.weight", "output_norm.weight", lambda c: (c.hidden_size,)),
    ("lm_head.weight", "output.weight", lambda c: (c.vocab_size, c.hidden_size)),  # absent when tied
]
_LAYER: list[tuple[str, str, Shape]] = [
    ("model.layers.{i}.input_layernorm.weight", "blk.{i}.attn_norm.weight", lambda c: (c.hidden_size,)),
    ("model.layers.{i}.post_attention_layernorm.weight", "blk.{i}.ffn_norm.weight", lambda c: (c.hidden_size,)),
    ("model.layers.{i}.self_attn.q_proj.weight", "blk.{i}.attn_q.weight",
     lambda c: (c.num_attention_heads * c.head_dim, c.hidden_size)),
    ("model.layers.{i}.self_attn.k_proj.weight", "blk.{i}.attn_k.weight",
     lambda c: (c.num_key_value_heads * c.head_dim, c.hidden_size)),
    ("model.layers.{i}.self_attn.v_proj.weight", "blk.{i}.attn_v.weight",
     lambda c: (c.num_key_value_heads * c.head_dim, c.hidden_size)),
    ("model.layers.{i}.self_attn.o_proj.weight", "blk.{i}.attn_output.weight",
     lambda c: (c.hidden_size, c.num_attention_heads * c.head_dim)),
    ("model.layers.{i}.self_attn.q_norm.weight", "blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,)),
    ("model.layers.{i}.self_attn.k_norm.weight", "blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,)),
]  # fmt: skip
_MOE: list[tuple[str, str, Shape]] = [
    ("model.layers.{i}.mlp.gate.weight", "blk.{i}.ffn_gate_inp.weight", lambda c: (c.num_experts, c.hidden_size)),
    ("model.layers.{i}.mlp.experts.gate_proj", "blk.{i}.ffn_gate_exps.weight",
     lambda c: (c.num_experts, c.moe_intermediate_size, c.hidden_size)),
    ("model.layers.{i}.mlp.experts.up_proj", "blk.{i}.ffn_up_exps.weight",
     lambda c: (c.num_experts, c.moe_intermediate_size, c.hidden_size)),
    ("model.layers.{i}.mlp.experts.down_proj", "blk.{i}.ffn_down_exps.weight",
     lambda c: (c.num_experts, c.hidden_size, c.moe_intermediate_size)),
]  # fmt: skip
_DENSE: list[tuple[str, str, Shape]] = [
    ("model.layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight",
     lambda c: (c.intermediate_size, c.hidden_size)),
    ("model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight", lambda c: (c.intermediate_size, c.hidden_size)),
    ("model.layers.{i}.mlp.down_proj.weight", "blk.{i}.ffn_down.weight",
     lambda c: (c.hidden_size, c.intermediate_size)),
]  # fmt: skip

# HF stores routed experts one by one under this name; the loader stacks them into model.layers.{i}.mlp.experts.{proj}
HF_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")

Progress = Callable[[ProgressEvent], None] | None


@dataclass
class ModelWeights:
    """A config plus every parameter under its canonical name (see docs/INTERFACES.md)."""

    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    source: str = ""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


@dataclass(frozen=True)
class TensorSpec:
    canonical: str
    gguf: str
    shape: tuple[int, ...]


def tensor_specs(cfg: ModelConfig) -> list[TensorSpec]:
    """Every tensor a model of `cfg` has, in a natural file order (embeddings, layers, final norm, head)."""
    specs = [TensorSpec(c, g, s(cfg)) for c, g, s in _GLOBAL[:1]]
    for i in range(cfg.num_hidden_layers):
        for c, g, s in _LAYER + (_MOE if cfg.is_moe_layer(i) else _DENSE):
            specs.append(TensorSpec(c.format(i=i), g.format(i=i), s(cfg)))
    specs += [TensorSpec(c, g, s(cfg)) for c, g, s in _GLOBAL[1:2]]
    if not cfg.tie_word_embeddings:
        specs += [TensorSpec(c, g, s(cfg)) for c, g, s in _GLOBAL[2:]]
    return specs


def canonical_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    return {s.canonical: s.shape for s in tensor_specs(cfg)}


def gguf_to_canonical(cfg: ModelConfig) -> dict[str, str]:
    return {s.gguf: s.canonical for s in tensor_specs(cfg)}


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled()


def load_weights(
    path: str | os.PathLike[str], progress: Progress = None, cancel: threading.Event | None = None
) -> ModelWeights:
    """Load a `.gguf` file or a Hugging Face folder into ModelWeights. Raises ModelFormatError, Cancelled."""
    p = Path(path)
    if p.is_dir():
        return _load_hf(p, progress, cancel)
    if p.suffix.lower() in (".bin", ".pt", ".pth", ".ckpt", ".pkl"):
        from engine.safetensors_reader import refuse_pickle

        raise refuse_pickle(p)
    if p.suffix.lower() == ".safetensors" or p.name == "config.json":
        return _load_hf(p.parent, progress, cancel)
    if not p.exists():
        raise ModelFormatError(str(p), "does not exist")
    return _load_gguf(p, progress, cancel)


def check_gguf_tensors(cfg: ModelConfig, shapes: dict[str, tuple[int, ...]], source: str) -> list[TensorSpec]:
    """Check a GGUF's tensor table (name -> numpy-order shape) against the table; returns the specs in load order."""
    table = gguf_to_canonical(cfg)
    for name in shapes:
        if name not in table:
            raise ModelFormatError(
                source, f"tensor {name}: unknown tensor for a {cfg.num_hidden_layers}-layer qwen3moe model"
            )
    specs = tensor_specs(cfg)
    for s in specs:
        if s.gguf not in shapes:
            raise ModelFormatError(source, f"tensor {s.gguf} is missing")
        if shapes[s.gguf] != s.shape:
            raise ModelFormatError(
                source, f"tensor {s.gguf} has shape {_fmt(shapes[s.gguf])}, the metadata needs {_fmt(s.shape)}"
            )
    return specs


def _load_gguf(path: Path, progress: Progress, cancel: threading.Event | None) -> ModelWeights:
    from engine.gguf_reader import open_gguf_model

    f = open_gguf_model(path)
    cfg = ModelConfig.from_gguf(f.metadata, str(path), f.tensors.keys())
    specs = check_gguf_tensors(cfg, {n: t.shape for n, t in f.tensors.items()}, str(path))
    tensors: dict[str, torch.Tensor] = {}
    for n, s in enumerate(specs):
        _check_cancel(cancel)
        if progress:
            progress(ProgressEvent("load", n, len(specs), s.gguf))
        tensors[s.canonical] = f.tensor(s.gguf)
    if progress:
        progress(ProgressEvent("load", len(specs), len(specs), ""))
    return ModelWeights(cfg, tensors, str(path))


@dataclass
class HFPlan:
    """Where each canonical tensor of an HF checkpoint comes from: one stored tensor, or one per expert (stacked)."""

    plain: dict[str, str]  # canonical -> stored name
    experts: dict[str, list[str]]  # canonical stacked name -> stored name of each expert
    shapes: dict[str, tuple[int, ...]]  # canonical -> shape


def plan_hf(ckpt, source: str) -> HFPlan:
    """Check an opened HF checkpoint's names and shapes against the table (headers only)."""
    cfg = ckpt.config
    want = canonical_shapes(cfg)
    experts: dict[str, list[str | None]] = {}
    plain: dict[str, str] = {}
    for name in ckpt.names:
        m = HF_EXPERT.match(name)
        if m:
            i, e, proj = int(m.group(1)), int(m.group(2)), m.group(3)
            stacked = f"model.layers.{i}.mlp.experts.{proj}"
            if stacked not in want or e >= cfg.num_experts:
                raise ModelFormatError(source, f"tensor {name}: unknown tensor (the config has {cfg.num_experts}"
                                       f" experts and MoE layers {cfg.moe_layers})")  # fmt: skip
            want_one = want[stacked][1:]
            if ckpt.shape(name) != want_one:
                raise ModelFormatError(
                    source, f"tensor {name} has shape {_fmt(ckpt.shape(name))}, config.json needs {_fmt(want_one)}"
                )
            experts.setdefault(stacked, [None] * cfg.num_experts)[e] = name
        elif name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied: some checkpoints store the shared matrix twice; the embedding is the one used
        elif name in want:
            if ckpt.shape(name) != want[name]:
                raise ModelFormatError(
                    source, f"tensor {name} has shape {_fmt(ckpt.shape(name))}, config.json needs {_fmt(want[name])}"
                )
            plain[name] = name
        else:
            raise ModelFormatError(source, f"tensor {name}: unknown tensor for this Qwen3-MoE config")
    for canonical in want:
        if canonical in plain:
            if canonical in experts:
                raise ModelFormatError(source, f"tensor {canonical} is stored both stacked and expert by expert")
            continue
        m = re.match(r"^model\.layers\.(\d+)\.mlp\.experts\.(\w+)$", canonical)
        if not m:
            raise ModelFormatError(source, f"tensor {canonical} is missing")
        for e, n in enumerate(experts.get(canonical, [None] * cfg.num_experts)):
            if n is None:
                raise ModelFormatError(source, f"tensor model.layers.{m.group(1)}.mlp.experts.{e}.{m.group(2)}.weight"
                                       " is missing")  # fmt: skip
    return HFPlan(plain, experts, want)  # type: ignore[arg-type]


def _load_hf(folder: Path, progress: Progress, cancel: threading.Event | None) -> ModelWeights:
    from engine.safetensors_reader import open_hf_folder

    ckpt = open_hf_folder(folder)
    src = str(folder)
    plan = plan_hf(ckpt, src)
    tensors: dict[str, torch.Tensor] = {}
    total = len(plan.shapes)
    for n, canonical in enumerate(plan.shapes):
        _check_cancel(cancel)
        if progress:
            progress(ProgressEvent("load", n, total, canonical))
        if canonical in plan.plain:
            tensors[canonical] = ckpt.get(plan.plain[canonical])
        else:
            tensors[canonical] = _stack(ckpt, plan.experts[canonical], plan.shapes[canonical], src, cancel)
    if progress:
        progress(ProgressEvent("load", total, total, ""))
    return ModelWeights(ckpt.config, tensors, src)


def _stack(ckpt, names: list[str], shape: tuple[int, ...], src: str, cancel: threading.Event | None) -> torch.Tensor:
    """Copy per-expert tensors (each [I, H] or [H, I]) into one [E, ...] tensor of their common stored dtype."""
    dtypes = {ckpt.dtype(n) for n in names}
    if len(dtypes) != 1:
        raise ModelFormatError(src, f"tensor {names[0]}: experts of one layer have mixed dtypes {sorted(dtypes)}")
    first = ckpt.get(names[0])
    out = torch.empty(shape, dtype=first.dtype)  # [E, I, H] or [E, H, I]
    out[0].copy_(first)
    for e, n in enumerate(names[1:], start=1):
        if e % 16 == 0:
            _check_cancel(cancel)
        out[e].copy_(ckpt.get(n))
    return out
