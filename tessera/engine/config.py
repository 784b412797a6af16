"""`ModelConfig`: the shape and behaviour of a Qwen3-MoE model, read from a HF config.json or GGUF metadata.

Field names follow transformers' `Qwen3MoeConfig`, so the model code and the HF-comparison tests need no renames.
Every missing or inconsistent key is a `ModelFormatError` whose subject is the file and whose message names the key
as that file spells it (`num_attention_heads` in config.json, `qwen3moe.attention.head_count` in a GGUF).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from tessera.engine.errors import ModelFormatError

GGUF_ARCH = "qwen3moe"
HF_MODEL_TYPE = "qwen3_moe"
HF_ARCHITECTURE = "Qwen3MoeForCausalLM"

# Upper bounds that no real model reaches; a header beyond them is corrupt (or hostile), not big.
_LIMITS = {
    "vocab_size": 1 << 24,
    "hidden_size": 1 << 18,
    "intermediate_size": 1 << 20,
    "moe_intermediate_size": 1 << 20,
    "num_hidden_layers": 10_000,
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "head_dim": 4096,
    "num_experts": 1 << 16,
    "num_experts_per_tok": 1 << 16,
    "decoder_sparse_step": 10_000,
    "max_position_embeddings": 1 << 26,
}

# GGUF metadata keys (llama.cpp names, as in gguf.Keys) for each ModelConfig field read from them.
GGUF_KEYS = {
    "max_position_embeddings": f"{GGUF_ARCH}.context_length",
    "hidden_size": f"{GGUF_ARCH}.embedding_length",
    "num_hidden_layers": f"{GGUF_ARCH}.block_count",
    "intermediate_size": f"{GGUF_ARCH}.feed_forward_length",
    "moe_intermediate_size": f"{GGUF_ARCH}.expert_feed_forward_length",
    "num_attention_heads": f"{GGUF_ARCH}.attention.head_count",
    "num_key_value_heads": f"{GGUF_ARCH}.attention.head_count_kv",
    "head_dim": f"{GGUF_ARCH}.attention.key_length",
    "rms_norm_eps": f"{GGUF_ARCH}.attention.layer_norm_rms_epsilon",
    "rope_theta": f"{GGUF_ARCH}.rope.freq_base",
    "num_experts": f"{GGUF_ARCH}.expert_count",
    "num_experts_per_tok": f"{GGUF_ARCH}.expert_used_count",
    "norm_topk_prob": f"{GGUF_ARCH}.expert_weights_norm",
    "vocab_size": f"{GGUF_ARCH}.vocab_size",
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
}
GGUF_VALUE_LENGTH = f"{GGUF_ARCH}.attention.value_length"
GGUF_ARCH_KEY = "general.architecture"
# RoPE base when a file does not give one: transformers' Qwen3MoeConfig default and llama.cpp's freq_base default, so a
# config.json without rope_theta means the same model to transformers, to the converter's GGUF and to llama.cpp.
DEFAULT_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class ModelConfig:
    """A validated Qwen3-MoE configuration. Build it with `from_hf_dict` or `from_gguf`; both call `validate`."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int  # dense-MLP width (layers in mlp_only_layers or off the sparse step)
    moe_intermediate_size: int  # width of one routed expert
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    rms_norm_eps: float = 1e-6
    rope_theta: float = DEFAULT_ROPE_THETA
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    source: str = field(default="", compare=False)  # the file or folder it was read from, for error messages

    # ---- behaviour -------------------------------------------------------------------------------------------------

    def is_moe_layer(self, i: int) -> bool:
        """Exactly transformers' Qwen3MoeDecoderLayer rule."""
        return (i not in self.mlp_only_layers) and (
            self.num_experts > 0 and (i + 1) % self.decoder_sparse_step == 0
        )

    @property
    def moe_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]

    @property
    def dense_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if not self.is_moe_layer(i)]

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    # ---- validation ------------------------------------------------------------------------------------------------

    def validate(self, keys: dict[str, str] | None = None) -> ModelConfig:
        """Raise ModelFormatError on anything inconsistent; `keys` maps field -> the key name the file uses."""
        keys = keys or {}
        src = self.source or "model config"

        def bad(name: str, msg: str) -> ModelFormatError:
            return ModelFormatError(src, f"key {keys.get(name, name)}: {msg}")

        for name, limit in _LIMITS.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad(name, f"expected an integer, got {v!r}")
            if v <= 0 and name != "intermediate_size":
                raise bad(name, f"must be positive, got {v}")
            if v > limit:
                raise bad(name, f"{v} is absurdly large (limit {limit}); the file is corrupt")
        if self.intermediate_size <= 0 and self.dense_layers:
            raise bad("intermediate_size", f"must be positive (layers {self.dense_layers} are dense)")
        if self.intermediate_size < 0:
            raise bad("intermediate_size", f"must not be negative, got {self.intermediate_size}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise bad(
                "num_key_value_heads",
                f"{self.num_key_value_heads} key/value heads do not divide {self.num_attention_heads} attention heads",
            )
        if self.num_experts_per_tok > self.num_experts:
            raise bad(
                "num_experts_per_tok",
                f"{self.num_experts_per_tok} experts per token but only {self.num_experts} experts",
            )
        for i in self.mlp_only_layers:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.num_hidden_layers:
                raise bad("mlp_only_layers", f"layer {i!r} is not in 0..{self.num_hidden_layers - 1}")
        for name in ("norm_topk_prob", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, f"expected true/false, got {getattr(self, name)!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise bad(name, f"must be a positive number, got {v!r}")
        if self.rms_norm_eps >= 1:
            raise bad("rms_norm_eps", f"{self.rms_norm_eps} is not a small epsilon")
        ids = ([] if self.bos_token_id is None else [("bos_token_id", self.bos_token_id)]) + [
            ("eos_token_id", e) for e in self.eos_token_ids
        ]
        for name, tid in ids:
            if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < self.vocab_size:
                raise bad(name, f"token id {tid!r} is outside the vocabulary (size {self.vocab_size})")
        return self

    # ---- Hugging Face config.json ----------------------------------------------------------------------------------

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> ModelConfig:
        """From a config.json dict: as published with Qwen3-MoE checkpoints or as current transformers writes it."""
        if not isinstance(d, dict):
            raise ModelFormatError(source, "config.json is not a JSON object")
        model_type = d.get("model_type")
        archs = d.get("architectures") or []
        if model_type is None and not archs:
            raise ModelFormatError(source, "key model_type is missing (expected 'qwen3_moe')")
        if model_type is not None and model_type != HF_MODEL_TYPE:
            raise ModelFormatError(
                source, f"key model_type: unsupported architecture {model_type!r} (Tessera runs 'qwen3_moe' models)"
            )
        if archs and HF_ARCHITECTURE not in archs:
            raise ModelFormatError(
                source, f"key architectures: unsupported architecture {archs!r} (expected {HF_ARCHITECTURE})"
            )
        if d.get("hidden_act", "silu") != "silu":
            raise ModelFormatError(source, f"key hidden_act: {d['hidden_act']!r} is not supported (only 'silu')")
        if d.get("attention_bias", False):
            raise ModelFormatError(source, "key attention_bias: attention biases are not supported")
        if d.get("use_sliding_window", False):
            raise ModelFormatError(source, "key use_sliding_window: sliding-window attention is not supported")
        rope_theta = _hf_rope_theta(d, source)

        def req(key: str, *aliases: str) -> Any:
            for k in (key, *aliases):
                if d.get(k) is not None:
                    return d[k]
            raise ModelFormatError(source, f"key {key} is missing")

        hidden = req("hidden_size")
        heads = req("num_attention_heads")
        num_layers = req("num_hidden_layers")
        mlp_only = d.get("mlp_only_layers") or []
        if not isinstance(mlp_only, list):
            raise ModelFormatError(source, f"key mlp_only_layers: expected a list, got {mlp_only!r}")
        head_dim = d.get("head_dim")
        if head_dim is None:
            head_dim = _default_head_dim(hidden, heads, source, "hidden_size", "num_attention_heads")
        eos = d.get("eos_token_id")
        if isinstance(eos, list):
            eos = tuple(eos)
        cfg = cls(
            vocab_size=req("vocab_size"),
            hidden_size=hidden,
            intermediate_size=d.get("intermediate_size", 6144),
            moe_intermediate_size=req("moe_intermediate_size"),
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=req("num_key_value_heads"),
            head_dim=head_dim,
            num_experts=req("num_experts", "num_local_experts"),
            num_experts_per_tok=req("num_experts_per_tok"),
            norm_topk_prob=d.get("norm_topk_prob", False),
            decoder_sparse_step=d.get("decoder_sparse_step", 1),
            mlp_only_layers=tuple(mlp_only),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            max_position_embeddings=d.get("max_position_embeddings", 32768),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos,
            source=str(source),
        )
        cfg.validate()
        if cfg.dense_layers and "intermediate_size" not in d:
            raise ModelFormatError(source, f"key intermediate_size is missing (layers {cfg.dense_layers} are dense)")
        return cfg

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json as published with the Qwen3-MoE checkpoints (readable by transformers, old and new)."""
        d: dict[str, Any] = {"architectures": [HF_ARCHITECTURE], "model_type": HF_MODEL_TYPE}
        for f in fields(self):
            if f.name == "source":
                continue
            v = getattr(self, f.name)
            d[f.name] = list(v) if isinstance(v, tuple) else v
        d.update(hidden_act="silu", attention_bias=False, use_sliding_window=False, rope_scaling=None)
        return d

    # ---- GGUF metadata ---------------------------------------------------------------------------------------------

    @classmethod
    def from_gguf(
        cls,
        metadata: dict[str, Any],
        source: str = "model.gguf",
        tensor_names: Iterable[str] | None = None,
    ) -> ModelConfig:
        """From llama.cpp `qwen3moe.*` metadata. With `tensor_names`, a block without `blk.N.ffn_gate_inp` is dense
        (listed in mlp_only_layers) and a missing `output.weight` means tied embeddings."""
        arch = metadata.get(GGUF_ARCH_KEY)
        if arch is None:
            raise ModelFormatError(source, f"key {GGUF_ARCH_KEY} is missing")
        if arch != GGUF_ARCH:
            raise ModelFormatError(
                source, f"key {GGUF_ARCH_KEY}: unsupported architecture {arch!r} (Tessera runs '{GGUF_ARCH}' models)"
            )

        def get(name: str, default: Any = ..., kind: type = int) -> Any:
            key = GGUF_KEYS[name]
            v = metadata.get(key)
            if v is None:
                if default is ...:
                    raise ModelFormatError(source, f"key {key} is missing")
                return default
            return _gguf_scalar(v, kind, key, source)

        hidden = get("hidden_size")
        heads = get("num_attention_heads")
        head_dim = get("head_dim", None)
        if head_dim is None:
            head_dim = _default_head_dim(
                hidden, heads, source, GGUF_KEYS["hidden_size"], GGUF_KEYS["num_attention_heads"]
            )
        value_len = metadata.get(GGUF_VALUE_LENGTH)
        if value_len is not None and _gguf_scalar(value_len, int, GGUF_VALUE_LENGTH, source) != head_dim:
            raise ModelFormatError(
                source, f"key {GGUF_VALUE_LENGTH}: {value_len} differs from the key length {head_dim} (unsupported)"
            )
        num_layers = get("num_hidden_layers")
        vocab = get("vocab_size", None)
        if vocab is None:
            tokens = metadata.get("tokenizer.ggml.tokens")
            if tokens is None:
                raise ModelFormatError(source, f"key {GGUF_KEYS['vocab_size']} and tokenizer.ggml.tokens are missing")
            vocab = len(tokens)
        dense: list[int] = []
        tied = False
        if tensor_names is not None:
            names = set(tensor_names)
            if isinstance(num_layers, int) and 0 < num_layers <= _LIMITS["num_hidden_layers"]:
                dense = [i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" not in names]
            # llama.cpp's rule for qwen3moe, followed exactly (llama-model.cpp, LLM_ARCH_QWEN3MOE): `output` is
            # TENSOR_NOT_REQUIRED and, when absent, token_embd is used in its place (TENSOR_DUPLICATED); no metadata
            # key says "tied". A header that merely lost output.weight (tensor_count one too low) is refused before
            # this by gguf_reader's coverage check: the tensors must account for the data section to the file's end.
            tied = "output.weight" not in names
        eos = get("eos_token_id", None)
        ffn = get("intermediate_size", None if dense else 0)
        if ffn is None:
            key = GGUF_KEYS["intermediate_size"]
            raise ModelFormatError(source, f"key {key} is missing (layers {dense} are dense)")
        cfg = cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=ffn,
            moe_intermediate_size=get("moe_intermediate_size"),
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=get("num_key_value_heads", heads),
            head_dim=head_dim,
            num_experts=get("num_experts"),
            num_experts_per_tok=get("num_experts_per_tok"),
            # llama.cpp always renormalises the top-k weights of qwen3moe; the key only exists to say otherwise.
            norm_topk_prob=get("norm_topk_prob", True, bool),
            decoder_sparse_step=1,
            mlp_only_layers=tuple(dense),
            rms_norm_eps=get("rms_norm_eps", kind=float),
            rope_theta=get("rope_theta", DEFAULT_ROPE_THETA, float),
            max_position_embeddings=get("max_position_embeddings"),
            tie_word_embeddings=tied,
            bos_token_id=get("bos_token_id", None),
            eos_token_id=eos,
            source=str(source),
        )
        return cfg.validate({**GGUF_KEYS, "mlp_only_layers": "blk.N.ffn_gate_inp (dense blocks)"})

    def to_gguf_metadata(self) -> dict[str, Any]:
        """Key -> value for a GGUF writer (llama.cpp names). Dense layers are expressed by which tensors exist;
        tied embeddings by the absence of output.weight; the tokenizer keys are the tokenizer's business."""
        md: dict[str, Any] = {
            GGUF_ARCH_KEY: GGUF_ARCH,
            GGUF_KEYS["vocab_size"]: self.vocab_size,
            GGUF_KEYS["max_position_embeddings"]: self.max_position_embeddings,
            GGUF_KEYS["hidden_size"]: self.hidden_size,
            GGUF_KEYS["num_hidden_layers"]: self.num_hidden_layers,
            GGUF_KEYS["intermediate_size"]: self.intermediate_size,
            GGUF_KEYS["moe_intermediate_size"]: self.moe_intermediate_size,
            GGUF_KEYS["num_attention_heads"]: self.num_attention_heads,
            GGUF_KEYS["num_key_value_heads"]: self.num_key_value_heads,
            GGUF_KEYS["head_dim"]: self.head_dim,
            GGUF_VALUE_LENGTH: self.head_dim,
            GGUF_KEYS["rms_norm_eps"]: float(self.rms_norm_eps),
            GGUF_KEYS["rope_theta"]: float(self.rope_theta),
            GGUF_KEYS["num_experts"]: self.num_experts,
            GGUF_KEYS["num_experts_per_tok"]: self.num_experts_per_tok,
        }
        if not self.norm_topk_prob:  # llama.cpp's default is to renormalise; only say so when we do not
            md[GGUF_KEYS["norm_topk_prob"]] = False
        if self.bos_token_id is not None:
            md[GGUF_KEYS["bos_token_id"]] = self.bos_token_id
        if self.eos_token_ids:
            md[GGUF_KEYS["eos_token_id"]] = self.eos_token_ids[0]
        return md


def _default_head_dim(hidden: Any, heads: Any, source: str, hidden_key: str, heads_key: str) -> int:
    for key, v in ((hidden_key, hidden), (heads_key, heads)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ModelFormatError(source, f"key {key}: must be a positive integer, got {v!r}")
    if hidden % heads != 0:
        raise ModelFormatError(
            source, f"key {heads_key}: {heads} heads do not divide hidden size {hidden} and no head_dim is given"
        )
    return hidden // heads


def _hf_rope_theta(d: dict[str, Any], source: str) -> float:
    """rope_theta from the published form (`rope_theta`, `rope_scaling`) or transformers 5's `rope_parameters`;
    DEFAULT_ROPE_THETA when neither gives one, as transformers reads such a config."""
    params = d.get("rope_parameters")
    scaling = d.get("rope_scaling")
    theta = d.get("rope_theta")
    for key, p in (("rope_parameters", params), ("rope_scaling", scaling)):
        if p is None:
            continue
        if not isinstance(p, dict):
            raise ModelFormatError(source, f"key {key}: expected an object, got {p!r}")
        rope_type = p.get("rope_type", p.get("type", "default"))
        if rope_type != "default":
            raise ModelFormatError(source, f"key {key}: rope_type {rope_type!r} is not supported (only 'default')")
        if p.get("rope_theta") is not None:
            theta = p["rope_theta"]
    return DEFAULT_ROPE_THETA if theta is None else theta


def _gguf_scalar(v: Any, kind: type, key: str, source: str) -> Any:
    """Coerce a GGUF metadata value (Python or numpy scalar) to int/float/bool, or name the key."""
    if hasattr(v, "item"):
        v = v.item()
    if kind is bool:
        if isinstance(v, bool):
            return v
    elif kind is int:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    elif kind is float:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            # GGUF stores these as float32: give back the shortest decimal that rounds to it (1e-06, not 9.99e-07),
            # so a GGUF and the config.json it came from describe the same model.
            f32 = np.float32(v)
            return float(np.format_float_positional(f32, unique=True)) if float(f32) == v else float(v)
    raise ModelFormatError(source, f"key {key}: expected {kind.__name__}, got {v!r}")


def _published(name: str, **sizes: int) -> ModelConfig:
    common = {"architectures": [HF_ARCHITECTURE], "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
              "num_experts_per_tok": 8, "norm_topk_prob": True, "vocab_size": 151936, "rms_norm_eps": 1e-06,
              "rope_theta": 1000000.0, "max_position_embeddings": 40960, "bos_token_id": 151643, "eos_token_id": 151645}
    return ModelConfig.from_hf_dict({**common, **sizes}, name)


# The published config.json values of the Qwen3-MoE checkpoints (every layer MoE, no shared experts; `source` is the
# model's name): the hardware check's --preset, make-model's qwen3-30b-a3b preset and bench-moe's layer shapes.
PUBLISHED: dict[str, ModelConfig] = {
    "qwen3-30b-a3b": _published("Qwen3-30B-A3B", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                                moe_intermediate_size=768, intermediate_size=6144),
    "qwen3-235b-a22b": _published("Qwen3-235B-A22B", hidden_size=4096, num_hidden_layers=94, num_attention_heads=64,
                                  moe_intermediate_size=1536, intermediate_size=12288),
}  # fmt: skip
