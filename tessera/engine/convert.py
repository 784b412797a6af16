"""Convert a Hugging Face Qwen3-MoE folder to a GGUF file that follows llama.cpp's `qwen3moe` conventions.

What llama.cpp's convert_hf_to_gguf.py does for Qwen3MoeForCausalLM, without its class chain: the same general.* and
qwen3moe.* keys, the gpt2/qwen2 tokenizer (tokens padded to vocab_size with [PAD{i}], token types, merges, special ids,
add_bos_token, chat template) via gguf.SpecialVocab, per-expert tensors stacked into 3-D ffn_{gate,up,down}_exps, 1-D
norms
and the router (ffn_gate_inp) kept F32, matrices in the requested type (Q8_0 falls back to F16 when a row does not split
into 32-element blocks, as llama.cpp does), or, for the quantized presets (q4_k_m, ...), the per-tensor mix
llama-quantize writes (tessera/engine/quant_mix.py), quantized by tessera/engine/quantize.py.

The folder is read by engine.safetensors_reader (the loader's reader) and checked against engine.checkpoint_layout (the
loader's table) before a byte is written; tensors are then read one at a time, so a model larger than RAM converts.
Public API: `convert(src, out, dtype=..., progress=..., cancel=...)`, `gguf_metadata(folder, cfg, name, out_type)`,
`read_source(folder)`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import torch

from tessera.engine.checkpoint_layout import GGUFTensor, arch_name, gguf_tensors
from tessera.engine.config import ModelConfig
from tessera.engine.convert_guard import check_output, sweep_partials
from tessera.engine.errors import Cancelled, ModelFormatError
from tessera.engine.events import ProgressEvent
from tessera.engine.gguf_writer import PlannedTensor, write_gguf
from tessera.engine.quant_mix import OutputType, parse_output_type, tensor_type
from tessera.engine.safetensors_reader import HFCheckpoint, open_hf_folder
from tessera.engine.weights import check_hf_tensors


@dataclass
class Source:
    """A checked HF checkpoint: its folder, config, and the opened shards every tensor is read from."""

    folder: Path
    config: ModelConfig
    checkpoint: HFCheckpoint
    name: str  # general.name: the config's _name_or_path, else the folder's name

    @property
    def dtypes(self) -> dict[str, str]:
        """Stored HF tensor name -> safetensors dtype (F32, F16, BF16)."""
        return {n: self.checkpoint.dtype(n) for n in self.checkpoint.names}


def read_source(folder: str | Path) -> Source:
    """Check an HF Qwen3-MoE folder completely (config, tokenizer, every tensor name, dtype and shape) without reading
    weights; raise a named error for the first problem."""
    folder = Path(folder)
    ckpt = open_hf_folder(folder)
    check_hf_tensors(ckpt, str(folder))
    if not (folder / "tokenizer.json").is_file():
        raise ModelFormatError(str(folder / "tokenizer.json"), "missing (the GGUF needs the tokenizer)")
    return Source(folder, ckpt.config, ckpt, str(ckpt.config_dict.get("_name_or_path") or folder.name))


def plan_tensors(cfg: ModelConfig, get: Callable[[str], torch.Tensor], out_type: OutputType) -> list[PlannedTensor]:
    """The GGUF tensors of a model of `cfg`, each producing its values from HF tensors via `get(hf_name)` (stacking
    experts), each in the type engine.quant_mix chooses for `out_type` (llama.cpp's rules)."""

    def producer(t: GGUFTensor) -> Callable[[], torch.Tensor]:
        if not t.stacked:
            return lambda: get(t.sources[0])

        def stacked() -> torch.Tensor:  # [E, rows, cols], filled expert by expert (no second copy of the stack)
            first = get(t.sources[0])
            out = torch.empty((len(t.sources), *first.shape), dtype=first.dtype)
            out[0] = first
            for e, name in enumerate(t.sources[1:], start=1):
                out[e] = get(name)
            return out

        return stacked

    return [PlannedTensor(t.name, t.shape, tensor_type(t, cfg, out_type), producer(t)) for t in gguf_tensors(cfg)]


def _looks_special(token: str) -> bool:
    """llama.cpp's does_token_look_special: added tokens it types CONTROL even when not marked special."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


def _token_list(folder: Path, vocab_size: int) -> tuple[list[str], list[int]]:
    """Tokens and token types as llama.cpp's gpt2 vocab writes them: vocab padded to vocab_size with [PAD{i}] (UNUSED),
    added tokens CONTROL when special or shaped like a control token (see _looks_special), else USER_DEFINED."""
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    by_id: dict[int, tuple[str, int]] = {i: (tok, gguf.TokenType.NORMAL) for tok, i in data["model"]["vocab"].items()}
    for added in data.get("added_tokens", []):
        content = added["content"]
        looks_special = _looks_special(content)
        kind = gguf.TokenType.CONTROL if added.get("special") or looks_special else gguf.TokenType.USER_DEFINED
        by_id[added["id"]] = (content, kind)
    if by_id and max(by_id) >= vocab_size:
        raise ModelFormatError(
            str(folder / "tokenizer.json"), f"token id {max(by_id)} does not fit vocab_size {vocab_size} of config.json"
        )
    tokens, types = [], []
    for i in range(vocab_size):
        tok, kind = by_id.get(i, (f"[PAD{i}]", gguf.TokenType.UNUSED))
        tokens.append(tok)
        types.append(int(kind))
    return tokens, types


def gguf_metadata(folder: Path, cfg: ModelConfig, name: str, out_type: OutputType) -> Callable[[gguf.GGUFWriter], None]:
    """The metadata llama.cpp writes for a qwen3moe model of `cfg` (tokenizer from the HF folder `folder`)."""
    tokens, types = _token_list(folder, cfg.vocab_size)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=cfg.vocab_size)

    def add(w: gguf.GGUFWriter) -> None:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(name)
        w.add_block_count(cfg.num_hidden_layers)
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        if cfg.intermediate_size:  # 0 only when no layer is dense and config.json has no intermediate_size
            w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv(cfg.num_key_value_heads)
        w.add_rope_freq_base(float(cfg.rope_theta))
        w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_file_type(out_type.file_type)
        w.add_expert_count(cfg.num_experts)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if not cfg.norm_topk_prob:  # llama.cpp renormalises qwen3moe's top-k by default; say only "no"
            w.add_expert_weights_norm(False)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        special.add_to_gguf(w, quiet=True)

    return add


def output_bytes(source: Source, dtype: str) -> int:
    """Bytes of tensor data the GGUF of `source` in `dtype` will hold (metadata adds a few MB): for the wizard's
    free-space line."""
    return sum(t.nbytes for t in plan_tensors(source.config, lambda name: torch.empty(0), parse_output_type(dtype)))


def convert(
    src: str | Path,
    out: str | Path,
    *,
    dtype: str = "bf16",
    progress: Callable[[ProgressEvent], None] | None = None,
    cancel: threading.Event | None = None,
    force: bool = False,
) -> Path:
    """Convert the HF Qwen3-MoE folder `src` into the GGUF file `out` (matrices in `dtype`: bf16, f16, f32, q8_0, or a
    llama-quantize preset q4_0, q4_k_m, q5_k_m, q6_k, iq4_xs with its per-tensor type mix; see
    tessera/engine/quant_mix.py). An existing `out` is replaced only with `force`, and never when it is one of the
    source's files. Raises ModelFormatError/TesseraError naming the problem, Cancelled when `cancel` is set; never
    leaves a partial file."""
    out_type = parse_output_type(dtype)
    out = check_output(src, out, force=force)  # an existing file only with force, never a file of the source
    sweep_partials(out)  # what a killed conversion to the same file left
    source = read_source(src)

    def get(name: str) -> torch.Tensor:  # cancel is also honoured between the experts of one stacked tensor
        if cancel is not None and cancel.is_set():
            raise Cancelled("conversion cancelled")
        return source.checkpoint.get(name)

    tensors = plan_tensors(source.config, get, out_type)
    meta = gguf_metadata(source.folder, source.config, source.name, out_type)
    return write_gguf(out, arch_name(), meta, tensors, progress=progress, cancel=cancel)


def prepack(gguf_path: str | Path, backend: str, progress: Callable[[ProgressEvent], None] | None = None) -> str:
    """Fill the packed-weight cache for `backend` by loading the converted model once, exactly as the app will load it
    (same cache key), so the first real load is fast. Returns a line saying what happened."""
    if backend == "Torch":
        return "prepack: the Torch backend uses the weights as stored; nothing to pack"
    from tessera import engine

    session = engine.load(gguf_path, backend=backend, progress=progress)
    try:
        if session.backend_name == "Torch":
            return f"prepack: nothing packed, backend {backend} resolved to Torch ({session.backend_reason})"
        from tessera.engine.native import NativeExperts

        experts = session.model.experts
        stats = experts.load_stats if isinstance(experts, NativeExperts) else None
        if stats is not None and stats.packed_layers + stats.cached_layers == 0:
            return f"prepack: nothing to pack: {session.backend_name} reads this file's quantized experts in place"
        return f"prepack: experts packed for {session.backend_name} into the packed-weight cache"
    finally:
        session.close()
