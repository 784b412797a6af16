"""Small, real Qwen3-MoE GGUF files for the I/O tests, written with `gguf.GGUFWriter` (llama.cpp's own writer).

`write_gguf` writes a random-weight model of a tiny ModelConfig; keyword arguments knock out, add, reshape or retype
tensors and override metadata, so each malformed-file test starts from a file that is otherwise valid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tessera.engine.config import ModelConfig

Q = gguf.GGMLQuantizationType


def tiny_config(**over: Any) -> ModelConfig:
    base = dict(
        vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256,
        bos_token_id=None, eos_token_id=3,
    )  # fmt: skip
    base.update(over)
    return ModelConfig(**base).validate()


def gguf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> numpy-order shape, as llama.cpp's converter writes a Qwen3-MoE model."""
    V, H, E, I = cfg.vocab_size, cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    hd, nh, nkv, Id = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
    s: dict[str, tuple[int, ...]] = {"token_embd.weight": (V, H), "output_norm.weight": (H,)}
    if not cfg.tie_word_embeddings:
        s["output.weight"] = (V, H)
    for i in range(cfg.num_hidden_layers):
        b = f"blk.{i}."
        s.update({
            b + "attn_norm.weight": (H,), b + "ffn_norm.weight": (H,),
            b + "attn_q.weight": (nh * hd, H), b + "attn_k.weight": (nkv * hd, H), b + "attn_v.weight": (nkv * hd, H),
            b + "attn_output.weight": (H, nh * hd), b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,),
        })  # fmt: skip
        if cfg.is_moe_layer(i):
            s.update({
                b + "ffn_gate_inp.weight": (E, H), b + "ffn_gate_exps.weight": (E, I, H),
                b + "ffn_up_exps.weight": (E, I, H), b + "ffn_down_exps.weight": (E, H, I),
            })  # fmt: skip
        else:
            s.update({b + "ffn_gate.weight": (Id, H), b + "ffn_up.weight": (Id, H), b + "ffn_down.weight": (H, Id)})
    return s


def random_tensors(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(shape, dtype=np.float32) * 0.5 for n, shape in gguf_shapes(cfg).items()}


# Byte offsets of the float16 scale fields inside one block of each K-quant type (ggml's block_q4_K etc.).
_KQUANT_F16_FIELDS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def random_kquant_blocks(shape: tuple[int, ...], qtype: Q, seed: int = 0) -> np.ndarray:
    """Random but valid K-quant storage for numpy-order `shape` (gguf.quants cannot quantize K-quants): random bytes
    for the quants and sub-block scales, small finite float16 values for the block scales."""
    rng = np.random.default_rng(seed)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = int(np.prod(shape)) // block
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for off in _KQUANT_F16_FIELDS[qtype]:
        raw[:, off : off + 2] = (rng.uniform(-0.02, 0.02, n_blocks).astype(np.float16)).view(np.uint8).reshape(-1, 2)
    return raw.reshape(*shape[:-1], shape[-1] // block * size)


def _add_kv(w: gguf.GGUFWriter, key: str, v: Any) -> None:
    if isinstance(v, bool):
        w.add_bool(key, v)
    elif isinstance(v, int):
        w.add_uint32(key, v)
    elif isinstance(v, float):
        w.add_float32(key, v)
    elif isinstance(v, str):
        w.add_string(key, v)
    elif isinstance(v, list):
        w.add_array(key, v)
    else:
        raise TypeError(key)


def write_gguf(
    path: str | Path,
    cfg: ModelConfig | None = None,
    *,
    tensors: dict[str, np.ndarray] | None = None,
    qtype: Q | dict[str, Q] = Q.F32,
    drop: tuple[str, ...] = (),
    extra: dict[str, np.ndarray] | None = None,
    metadata: dict[str, Any] | None = None,
    drop_keys: tuple[str, ...] = (),
    arch: str = "qwen3moe",
    seed: int = 0,
    split_max_tensors: int = 0,
) -> Path:
    """Write a GGUF; returns its path. `qtype` applies to 2-D+ tensors (norms stay F32, as llama.cpp does).
    K-quant tensors get random valid blocks (not a quantization of the random float values)."""
    cfg = cfg or tiny_config()
    tensors = dict(tensors if tensors is not None else random_tensors(cfg, seed))
    for n in drop:
        tensors.pop(n)
    tensors.update(extra or {})
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    md = {k: v for k, v in cfg.to_gguf_metadata().items() if k != "general.architecture"}
    md.update(metadata or {})
    for k, v in md.items():
        if k not in drop_keys:
            _add_kv(w, k.replace("qwen3moe.", f"{arch}.", 1), v)
    for name, arr in tensors.items():
        t = qtype.get(name, Q.F32) if isinstance(qtype, dict) else (qtype if arr.ndim > 1 else Q.F32)
        if t == Q.F32:
            w.add_tensor(name, arr.astype(np.float32))
        elif t == Q.F16:
            w.add_tensor(name, arr.astype(np.float16))
        elif t in _KQUANT_F16_FIELDS:
            w.add_tensor(name, random_kquant_blocks(arr.shape, t, seed), raw_dtype=t)
        else:
            w.add_tensor(name, gguf.quants.quantize(arr.astype(np.float32), t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def tokenizer_metadata(folder: str | Path, vocab_size: int | None = None) -> dict[str, Any]:
    """`tokenizer.ggml.*` + chat template for the HF tokenizer in `folder`, as llama.cpp's converter writes them:
    model gpt2, pre qwen2, tokens by id padded with [PAD{i}] (UNUSED) to `vocab_size`, added tokens CONTROL when
    special else USER_DEFINED, merges as "a b", eos/padding ids from tokenizer_config.json."""
    import json

    folder = Path(folder)
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tc = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    by_id = {i: (t, int(gguf.TokenType.NORMAL)) for t, i in tj["model"]["vocab"].items()}
    for a in tj["added_tokens"]:
        by_id[a["id"]] = (a["content"], int(gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED))
    n = vocab_size or max(by_id) + 1
    tokens = [by_id.get(i, (f"[PAD{i}]", int(gguf.TokenType.UNUSED)))[0] for i in range(n)]
    types = [by_id.get(i, (None, int(gguf.TokenType.UNUSED)))[1] for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    return {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": ids[tc["eos_token"]], "tokenizer.ggml.padding_token_id": ids[tc["pad_token"]],
        "tokenizer.ggml.bos_token_id": ids["<|endoftext|>"], "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": tc["chat_template"],
    }  # fmt: skip


def write_sparse_gguf(path: str | Path, cfg: ModelConfig, qtype: Q = Q.BF16) -> Path:
    """A full-size GGUF of `cfg` whose tensor data is a hole (all zeros, no disk used): for header-only tests at real
    Qwen3-30B shapes. Norms are F32, every matrix `qtype`."""
    import os

    w = gguf.GGUFWriter(str(path), "qwen3moe")
    for k, v in cfg.to_gguf_metadata().items():
        if k != "general.architecture":
            _add_kv(w, k, v)
    data_bytes = 0
    for name, shape in gguf_shapes(cfg).items():
        t = qtype if len(shape) > 1 else Q.F32
        block, size = gguf.GGML_QUANT_SIZES[t]
        nbytes = int(np.prod(shape)) // block * size
        stored = shape if t == Q.F32 else (*shape[:-1], shape[-1] // block * size)  # the writer wants byte shapes
        w.add_tensor_info(name, stored, np.dtype(np.float32 if t == Q.F32 else np.uint8), nbytes, raw_dtype=t)
        data_bytes += -(-nbytes // 32) * 32
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header = os.path.getsize(path)
    os.truncate(path, -(-header // 32) * 32 + data_bytes)
    return Path(path)
