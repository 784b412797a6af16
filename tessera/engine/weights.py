"""Checkpoint (GGUF or HF safetensors) -> `ModelWeights`: a ModelConfig and tensors under canonical (HF) names.

`open_model(path)` opens a model once per load: it reads the header(s), builds the ModelConfig and checks the tensor
table against engine.checkpoint_layout both ways: a tensor the table does not know, a tensor the config needs but the
file lacks, and a wrong shape are each a ModelFormatError naming the tensor. `inspect_model`, `load_weights` and the
tokenizer all take the opened `ModelFile`, so loading reads each header once.

Routed experts are stacked per layer: gate_proj/up_proj [E, I, H], down_proj [E, H, I] (GGUF stores them stacked
already; HF stores `model.layers.{i}.mlp.experts.{e}.{proj}.weight` one by one and they are copied into one tensor).
Stored dtypes are kept (bf16 stays bf16, zero-copy from the memory map). Block-quantized GGUF tensors have their f16
block scales checked for NaN/Inf first (a named error: tensor and block; skipped only for a file that passed before
and is unchanged since, engine.scale_record); then they stay as their blocks, views of the
memory map: the routed experts as engine.quantized.QuantizedTensor (dequantized an expert at a time when used), the
2-D weights (attention, dense MLP, lm_head, embedding) as QuantizedMatrix (multiplied in place by the native kernels,
engine.dense). Only a 2-D weight of a type those kernels do not read (Q5_0, Q5_1, IQ4_NL) becomes float32.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from tessera.engine import quants, scale_record, source_digest
from tessera.engine.checkpoint_layout import GGUFTensor, gguf_tensors, hf_shapes
from tessera.engine.config import ModelConfig
from tessera.engine.errors import Cancelled, ModelFormatError
from tessera.engine.events import ProgressEvent
from tessera.engine.gguf_reader import GGUFModel, open_gguf_model
from tessera.engine.quantized import QuantizedMatrix, QuantizedTensor, check_scales, keeps_blocks
from tessera.engine.safetensors_reader import PICKLE_SUFFIXES, HFCheckpoint, open_hf_folder, refuse_pickle

Progress = Callable[[ProgressEvent], None] | None


@dataclass
class ModelWeights:
    """A config plus every parameter under its canonical name (see docs/INTERFACES.md)."""

    config: ModelConfig
    # quantized GGUFs: routed experts stay QuantizedTensor, 2-D weights QuantizedMatrix (engine.quantized)
    tensors: dict[str, torch.Tensor | QuantizedTensor | QuantizedMatrix]
    source: str = ""
    # the mapped file parts the tensors are views of (GGUF only): engine.source_digest remembers their experts' digests
    sources: tuple = ()

    @property
    def nbytes(self) -> int:
        """Bytes the tensors hold (a QuantizedTensor or QuantizedMatrix: its blocks)."""
        return sum(t.nbytes for t in self.tensors.values())


@dataclass
class ModelFile:
    """A model opened once: its validated config, its tensors (checked against the table, in load order), and the
    reader they come from (`gguf`: one file or llama.cpp split parts; `hf`: a Hugging Face folder)."""

    path: Path
    config: ModelConfig
    tensors: list[GGUFTensor]
    gguf: GGUFModel | None = None
    hf: HFCheckpoint | None = None

    @property
    def format(self) -> str:
        return "gguf" if self.gguf is not None else "hf"


def open_model(path: str | os.PathLike[str], gguf: GGUFModel | None = None) -> ModelFile:
    """Open a `.gguf` file (or the first of its split parts) or a Hugging Face folder (or a file in one) and check
    it against the table. Reads headers only. Raises ModelFormatError naming the file and the problem.
    `gguf`: that file already opened (engine.preload opens it while torch is imported), checked here as if just
    opened."""
    p = Path(path)
    if not p.is_dir() and p.suffix.lower() in PICKLE_SUFFIXES:
        raise refuse_pickle(p)
    if p.is_dir() or p.suffix.lower() == ".safetensors" or p.name == "config.json":
        folder = p if p.is_dir() else p.parent
        hf = open_hf_folder(folder)
        return ModelFile(folder, hf.config, check_hf_tensors(hf, str(folder)), hf=hf)
    if not p.exists():
        raise ModelFormatError(str(p), "does not exist")
    f = gguf if gguf is not None else open_gguf_model(p)
    cfg = ModelConfig.from_gguf(f.metadata, str(p), f.tensors.keys())
    return ModelFile(p, cfg, check_gguf_tensors(cfg, {n: t.shape for n, t in f.tensors.items()}, str(p)), gguf=f)


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled()


def load_weights(
    model: ModelFile | str | os.PathLike[str], progress: Progress = None, cancel: threading.Event | None = None
) -> ModelWeights:
    """Every tensor of an opened model (or of the `.gguf` file / HF folder at a path) under its canonical name.
    Raises ModelFormatError, Cancelled."""
    if not isinstance(model, ModelFile):
        model = open_model(model)
    total = len(model.tensors)
    tensors: dict[str, torch.Tensor] = {}
    parts = _identities(model.gguf) if model.gguf is not None else []
    scales_checked = scale_record.is_checked(parts)
    for n, t in enumerate(model.tensors):
        _check_cancel(cancel)
        if progress:
            progress(ProgressEvent("load", n, total, t.name if model.gguf is not None else t.canonical))
        if model.gguf is not None:
            tensors[t.canonical] = _gguf_tensor(model.gguf, t, str(model.path), check=not scales_checked)
        elif t.stacked:
            tensors[t.canonical] = _stack(model.hf, t, str(model.path), cancel)
        else:
            tensors[t.canonical] = model.hf.get(t.sources[0])
    if parts and not scales_checked:  # every quantized tensor passed: the same unchanged file is not scanned again
        scale_record.mark_checked(parts, min(f.opened_at for f in model.gguf.files))
    if progress:
        progress(ProgressEvent("load", total, total, ""))
    sources = source_digest.gguf_sources(model.gguf) if model.gguf is not None else ()
    return ModelWeights(model.config, tensors, str(model.path), sources)


def _identities(f: GGUFModel) -> list[dict]:
    """Each part's identity as it was when opened (engine.scale_record), in part order."""
    return [scale_record.identity(part.path, part.stat) for part in f.files]


def _gguf_tensor(f: GGUFModel, t: GGUFTensor, source: str, check: bool = True) -> torch.Tensor | QuantizedTensor:
    """One GGUF tensor as the model holds it (engine.quantized.keeps_blocks decides, the rule inspect_model sizes
    loads with). `check`: scan its block scales (False only for a file engine.scale_record says passed unchanged)."""
    g = f.info(t.name)
    if g.ggml_type in quants.QUANT_TYPES:
        raw = f.raw(t.name)  # [..., row bytes] uint8 view of the map
        if check:
            check_scales(raw, g.ggml_type, source, t.name)
        if keeps_blocks(g.ggml_type, t.stacked, len(g.shape)):
            cls = QuantizedTensor if t.stacked else QuantizedMatrix
            return cls(raw, g.ggml_type, tuple(g.shape), t.name)
    return f.tensor(t.name)


def check_gguf_tensors(cfg: ModelConfig, shapes: dict[str, tuple[int, ...]], source: str) -> list[GGUFTensor]:
    """Check a GGUF's tensor table (name -> numpy-order shape) against the table; returns the table in load order."""
    table = list(gguf_tensors(cfg))
    known = {t.name for t in table}
    for name in shapes:
        if name not in known:
            raise ModelFormatError(
                source, f"tensor {name}: unknown tensor for a {cfg.num_hidden_layers}-layer qwen3moe model"
            )
    for t in table:
        if t.name not in shapes:
            raise ModelFormatError(source, f"tensor {t.name} is missing")
        if shapes[t.name] != t.shape:
            raise ModelFormatError(
                source, f"tensor {t.name} has shape {_fmt(shapes[t.name])}, the metadata needs {_fmt(t.shape)}"
            )
    return table


def check_hf_tensors(ckpt: HFCheckpoint, source: str) -> list[GGUFTensor]:
    """Check an opened HF checkpoint's names and shapes against the table (headers only); returns the table in load
    order. Each routed expert is stored on its own (`model.layers.{i}.mlp.experts.{e}.{proj}.weight`)."""
    cfg = ckpt.config
    want = hf_shapes(cfg)
    for name in ckpt.names:
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied: some checkpoints store the shared matrix twice; the embedding is the one used
        if name not in want:
            raise ModelFormatError(source, f"tensor {name}: unknown tensor for this Qwen3-MoE config ({cfg.num_experts}"
                                   f" experts, MoE layers {cfg.moe_layers})")  # fmt: skip
        if ckpt.shape(name) != want[name]:
            raise ModelFormatError(
                source, f"tensor {name} has shape {_fmt(ckpt.shape(name))}, config.json needs {_fmt(want[name])}"
            )
    stored = set(ckpt.names)
    for name in want:
        if name not in stored:
            raise ModelFormatError(source, f"tensor {name} is missing")
    return list(gguf_tensors(cfg))


def _stack(ckpt: HFCheckpoint, t: GGUFTensor, src: str, cancel: threading.Event | None) -> torch.Tensor:
    """Copy per-expert tensors (each [I, H] or [H, I]) into one [E, ...] tensor of their common stored dtype."""
    dtypes = {ckpt.dtype(n) for n in t.sources}
    if len(dtypes) != 1:
        raise ModelFormatError(src, f"tensor {t.sources[0]}: experts of one layer have mixed dtypes {sorted(dtypes)}")
    first = ckpt.get(t.sources[0])
    out = torch.empty(t.shape, dtype=first.dtype)  # [E, I, H] or [E, H, I]
    out[0].copy_(first)
    for e, n in enumerate(t.sources[1:], start=1):
        if e % 16 == 0:
            _check_cancel(cancel)
        out[e].copy_(ckpt.get(n))
    return out
