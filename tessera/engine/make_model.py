"""Write a random-weight Qwen3-MoE model, as a Hugging Face folder or a GGUF file, for tests, benchmarks and trying the
app without a download.

The HF folder is what a published Qwen3-MoE checkpoint looks like: config.json in the published form, safetensors with
experts stored one by one (sharded with model.safetensors.index.json when over `max_shard_bytes`), tokenizer files
(a small trained byte-level BPE plus Qwen's special tokens, Qwen3's chat template) and generation_config.json. The GGUF
is written by the same path the converter uses, so make_model(fmt="gguf") equals convert(make_model(fmt="hf")).

Weights are initialised like HF (normal, std = initializer_range) except norms, which are 1 + 0.1 * normal so tests
catch a norm applied wrongly. Each tensor's values depend only on (seed, tensor name), so the two formats made with the
same seed hold the same weights, and tensors are generated and written one at a time (streaming).
"""

from __future__ import annotations

import errno
import json
import shutil
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import torch

from tessera.engine.checkpoint_layout import gguf_tensors, hf_shapes
from tessera.engine.config import PUBLISHED, ModelConfig
from tessera.engine.errors import TesseraError
from tessera.engine.events import ProgressEvent
from tessera.engine.tokenizer_build import BuiltTokenizer, build_tokenizer

TOKENIZER_BPE_SIZE = 400  # trained tokens (bytes + merges) of the make-model tokenizer
# The config.json keys a preset sets over hf_config's defaults.
_SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "vocab_size",
               "max_position_embeddings", "rope_theta")

PRESETS: dict[str, dict] = {
    # Small, deliberately not powers of two; rows multiples of 32 so Q8_0 applies to every matrix.
    "tiny": {
        "hidden_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 224,
        "moe_intermediate_size": 160,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "vocab_size": 437,
        "max_position_embeddings": 1024,
        "rope_theta": 1000000.0,
    },
    # Like tiny, but every row a multiple of 256, so K-quants and IQ4_XS apply to every matrix (no fallback types);
    # 4 layers, so q4_k_m/q5_k_m give some layers' attn_v and ffn_down_exps Q6_K and others the base type.
    "tiny-kquant": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 512,
        "moe_intermediate_size": 256,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "vocab_size": 437,
        "max_position_embeddings": 1024,
        "rope_theta": 1000000.0,
    },
    # The published Qwen3-30B-A3B's shapes (engine.config.PUBLISHED); use --layers to keep it small.
    "qwen3-30b-a3b": {k: v for k, v in PUBLISHED["qwen3-30b-a3b"].to_hf_dict().items() if k in _SHAPE_KEYS},
}

DTYPES = {"f32": ("float32", torch.float32, "F32"), "bf16": ("bfloat16", torch.bfloat16, "BF16")}
# --dtype choices: the float types above (HF or GGUF), then the GGUF-only block-quantized ones
# (tessera/engine/quant_mix.py).
MAKE_MODEL_DTYPES = ("f32", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k", "iq4_xs")


def hf_config(preset: str, *, layers: int | None, dtype: str, tok: BuiltTokenizer, overrides: dict | None) -> dict:
    """config.json for `preset` as published Qwen3-MoE checkpoints write it (rope_theta at top level, torch_dtype)."""
    if preset not in PRESETS:
        raise TesseraError("--preset", f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": tok.bos_token_id,
        "decoder_sparse_step": 1,
        "eos_token_id": tok.eos_token_id,
        "head_dim": 0,
        "hidden_act": "silu",
        "hidden_size": 0,
        "initializer_range": 0.02,
        "intermediate_size": 0,
        "max_position_embeddings": 0,
        "max_window_layers": 0,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 0,
        "norm_topk_prob": True,
        "num_attention_heads": 0,
        "num_experts": 0,
        "num_experts_per_tok": 0,
        "num_hidden_layers": 0,
        "num_key_value_heads": 0,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 0.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": DTYPES.get(dtype, DTYPES["f32"])[0],
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 0,
    }
    cfg.update(PRESETS[preset])
    if layers is not None:
        if layers < 1:
            raise TesseraError("--layers", f"must be at least 1, got {layers}")
        cfg["num_hidden_layers"] = layers
    cfg["max_window_layers"] = cfg["num_hidden_layers"]
    cfg["vocab_size"] = max(cfg["vocab_size"], tok.total_size)
    for key, value in (overrides or {}).items():
        if value is None:
            cfg.pop(key, None)  # e.g. head_dim: None leaves it to default to hidden_size / num_attention_heads
        else:
            cfg[key] = value
    if cfg["vocab_size"] < tok.total_size:
        raise TesseraError("vocab_size", f"{cfg['vocab_size']} is smaller than the tokenizer's {tok.total_size} tokens")
    return cfg


class RandomWeights:
    """HF-named random tensors whose values depend only on (seed, name); rounded through `dtype`."""

    def __init__(self, cfg: dict, seed: int, dtype: torch.dtype):
        self.shapes = hf_shapes(ModelConfig.from_hf_dict(cfg))
        self.seed = seed
        self.dtype = dtype
        self.std = float(cfg.get("initializer_range", 0.02))

    def get(self, name: str) -> torch.Tensor:
        shape = self.shapes[name]
        g = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}:{name}".encode()))
        if len(shape) == 1:
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)  # [n] norm weight
        else:
            t = self.std * torch.randn(shape, generator=g)
        return t.to(self.dtype)


def _write_text_files(folder: Path, cfg: dict, tok: BuiltTokenizer) -> None:
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    generation = {
        "bos_token_id": tok.bos_token_id,
        "do_sample": True,
        "eos_token_id": [tok.eos_token_id, tok.bos_token_id],
        "pad_token_id": tok.pad_token_id,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": "4.51.0",
    }
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")


def _safetensors_header(entries: list[tuple[str, tuple[int, ...], str, int]]) -> bytes:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, st_dtype, nbytes in entries:
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def write_hf_weights(
    folder: Path,
    shapes: dict[str, tuple[int, ...]],
    get: Callable[[str], torch.Tensor],
    dtype: str,
    max_shard_bytes: int,
    progress: Callable[[ProgressEvent], None] | None = None,
) -> list[Path]:
    """Stream tensors from `get` into safetensors shards of at most `max_shard_bytes` (one tensor in memory at a
    time)."""
    _, torch_dtype, st_dtype = DTYPES[dtype]
    itemsize = torch.tensor([], dtype=torch_dtype).element_size()
    shards: list[list[tuple[str, tuple[int, ...], str, int]]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = itemsize * int(torch.Size(shape).numel())
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape, st_dtype, nbytes))
        size += nbytes
    n = len(shards)
    files = [
        folder / ("model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors") for i in range(n)
    ]
    done, total = 0, len(shapes)
    for path, entries in zip(files, shards):
        with path.open("wb") as f:
            f.write(_safetensors_header(entries))
            for name, _shape, _, nbytes in entries:
                if progress is not None:
                    progress(ProgressEvent("make-model", done, total, name))
                t = get(name).to(torch_dtype).contiguous()
                data = t.reshape(-1).view(torch.uint8).numpy()
                assert data.nbytes == nbytes, name
                data.tofile(f)
                done += 1
    if n > 1:
        weight_map = {name: path.name for path, entries in zip(files, shards) for name, *_ in entries}
        index = {"metadata": {"total_size": sum(e[3] for s in shards for e in s)}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return files


def make_model(
    out: str | Path,
    *,
    preset: str = "tiny",
    layers: int | None = None,
    dtype: str = "f32",
    fmt: str = "hf",
    seed: int = 0,
    config_overrides: dict | None = None,
    max_shard_bytes: int = 2 * 1024**3,
    progress: Callable[[ProgressEvent], None] | None = None,
) -> Path:
    """Write a random Qwen3-MoE model to `out` (a new or empty folder for fmt="hf", a .gguf file path for fmt="gguf").

    dtype: f32 | bf16 (both formats) | q8_0, q4_0, q4_k_m, q5_k_m, q6_k, iq4_xs (gguf only: Tessera's quantizer,
    tessera/engine/quantize.py, with llama-quantize's per-tensor type mix, tessera/engine/quant_mix.py).
    config_overrides: config.json keys to set (None removes one), e.g. {"mlp_only_layers": [1], "tie_word_embeddings":
    True, "head_dim": 24}. Returns `out`.
    """
    out = Path(out)
    if fmt not in ("hf", "gguf"):
        raise TesseraError("--format", f"unknown format {fmt!r}; choose hf or gguf")
    if dtype not in MAKE_MODEL_DTYPES:
        raise TesseraError("--dtype", f"unknown dtype {dtype!r}; choose one of {', '.join(MAKE_MODEL_DTYPES)}")
    if dtype not in DTYPES and fmt == "hf":
        raise TesseraError("--dtype", f"{dtype} is only available with --format gguf (safetensors holds f32/bf16)")
    if fmt == "hf":
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise TesseraError(str(out), "already exists and is not an empty folder")
        out.mkdir(parents=True, exist_ok=True)
        try:
            tok = build_tokenizer(None, TOKENIZER_BPE_SIZE, out)
            cfg = hf_config(preset, layers=layers, dtype=dtype, tok=tok, overrides=config_overrides)
            weights = RandomWeights(cfg, seed, DTYPES[dtype][1])
            _write_text_files(out, cfg, tok)
            write_hf_weights(out, weights.shapes, weights.get, dtype, max_shard_bytes, progress)
        except BaseException as e:  # interrupted or failed: leave no half-written model folder behind
            shutil.rmtree(out, ignore_errors=True)
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                raise TesseraError(str(out), "disk full while writing; the partial model was removed") from e
            raise
        return out

    from tessera.engine.checkpoint_layout import arch_name
    from tessera.engine.convert import gguf_metadata, plan_tensors
    from tessera.engine.gguf_writer import write_gguf
    from tessera.engine.quant_mix import parse_output_type

    with tempfile.TemporaryDirectory(prefix="tessera-make-model-") as tmp:
        folder = Path(tmp)
        tok = build_tokenizer(None, TOKENIZER_BPE_SIZE, folder)
        cfg = hf_config(preset, layers=layers, dtype=dtype, tok=tok, overrides=config_overrides)
        cfg["_name_or_path"] = f"tessera-random-{preset}"
        _write_text_files(folder, cfg, tok)
        config = ModelConfig.from_hf_dict(cfg)
        out_type = parse_output_type(dtype)
        weights = RandomWeights(cfg, seed, torch.bfloat16 if dtype == "bf16" else torch.float32)
        meta = gguf_metadata(folder, config, cfg["_name_or_path"], out_type)
        tensors = plan_tensors(config, weights.get, out_type)
        assert [t.name for t in tensors] == [t.name for t in gguf_tensors(config)]
        write_gguf(out, arch_name(), meta, tensors, progress=progress)
    return out
