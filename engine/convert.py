"""Convert a Hugging Face Qwen3-MoE folder to a GGUF file that follows llama.cpp's `qwen3moe` conventions.

What llama.cpp's convert_hf_to_gguf.py does for Qwen3MoeForCausalLM, without its class chain: the same general.* and
qwen3moe.* keys, the gpt2/qwen2 tokenizer (tokens padded to vocab_size with [PAD{i}], token types, merges, special ids,
add_bos_token, chat template) via gguf.SpecialVocab, per-expert tensors stacked into 3-D ffn_{gate,up,down}_exps, 1-D norms
and the router (ffn_gate_inp) kept F32, matrices in the requested type (Q8_0 falls back to F16 when a row does not split
into 32-element blocks, as llama.cpp does), or, for the quantized presets (q4_k_m, ...), the per-tensor mix
llama-quantize writes (engine/quant_mix.py), quantized by engine/quantize.py.

Every header is checked before a byte is written; tensors are then read one at a time from the memory-mapped safetensors
shards, so a model larger than RAM converts. Public API: `convert(src, out, dtype=..., progress=..., cancel=...)`,
`gguf_metadata(folder, cfg, dims, out_type)`, `read_source(folder)`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import torch

from engine.checkpoint_layout import Dims, GGUFTensor, arch_name, gguf_tensors, hf_shapes
from engine.convert_guard import check_output, sweep_partials
from engine.errors import Cancelled, ModelFormatError, TesseraError
from engine.events import ProgressEvent
from engine.gguf_writer import PlannedTensor, write_gguf
from engine.quant_mix import OutputType, parse_output_type, tensor_type

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_hf_config(folder: Path) -> dict:
    """config.json of a Qwen3-MoE folder, or a named error saying why this is not one."""
    if not folder.is_dir():
        raise ModelFormatError(str(folder), "is not a folder (expected a Hugging Face model folder)")
    path = folder / "config.json"
    if not path.is_file():
        raise ModelFormatError(str(folder), "not a Qwen3-MoE folder: config.json is missing")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelFormatError(str(path), f"is not valid JSON ({e})") from e
    archs = cfg.get("architectures") or []
    if cfg.get("model_type") != "qwen3_moe" and "Qwen3MoeForCausalLM" not in archs:
        found = ", ".join(archs) or cfg.get("model_type") or "nothing"
        raise ModelFormatError(str(path), f"not a Qwen3-MoE model (architectures/model_type say {found})")
    return cfg


def rope_theta(cfg: dict) -> float:
    """rope_theta as published (top level) or as current transformers writes it (rope_parameters)."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise ModelFormatError("config.json", "missing key 'rope_theta' (or rope_parameters.rope_theta)")
    return float(theta)


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes are: shard file, absolute byte range, safetensors dtype, shape."""

    path: Path
    begin: int
    end: int
    dtype: str
    shape: tuple[int, ...]


@dataclass
class Source:
    """A checked HF checkpoint: its config, dims, and where each tensor lives in its shards."""

    folder: Path
    config: dict
    dims: Dims
    tensors: dict[str, StoredTensor]  # HF tensor name -> location

    @property
    def dtypes(self) -> dict[str, str]:
        return {name: t.dtype for name, t in self.tensors.items()}

    def reader(self) -> SourceReader:
        return SourceReader(self)


class SourceReader:
    """Reads one tensor at a time with plain reads (no memory map, so pages already converted are not kept mapped and
    the process stays at about one tensor of memory); keeps each shard open once."""

    def __init__(self, source: Source):
        self._source = source
        self._files: dict[Path, object] = {}

    def get(self, name: str) -> torch.Tensor:
        t = self._source.tensors[name]
        f = self._files.get(t.path)
        if f is None:
            f = self._files[t.path] = t.path.open("rb")
        buf = bytearray(t.end - t.begin)
        f.seek(t.begin)
        if f.readinto(buf) != len(buf):
            raise ModelFormatError(str(t.path), f"tensor {name} is cut short (the file shrank while converting?)")
        return torch.frombuffer(buf, dtype=_TORCH_DTYPES[t.dtype]).reshape(t.shape) if buf else torch.empty(t.shape)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def _safetensors_header(path: Path) -> tuple[dict, int]:
    """The JSON header of a .safetensors file and where its data starts, checked against the file size so a
    truncated file gives a named error."""
    size = path.stat().st_size
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ModelFormatError(str(path), "truncated safetensors file (no header length)")
        n = int.from_bytes(raw, "little")
        if n > size - 8 or n > 100 * 1024 * 1024:
            raise ModelFormatError(str(path), f"safetensors header length {n} exceeds the file size {size}")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelFormatError(str(path), f"corrupt safetensors header ({e})") from e
    if not isinstance(header, dict):
        raise ModelFormatError(str(path), "corrupt safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    data_size = size - 8 - n
    for name, info in header.items():
        try:
            begin, end = (int(v) for v in info["data_offsets"])
            info["shape"] = [int(v) for v in info["shape"]]
            str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise ModelFormatError(str(path), f"corrupt safetensors header entry for tensor {name}") from None
        if not 0 <= begin <= end <= data_size:
            raise ModelFormatError(str(path), f"tensor {name} lies beyond the end of the file (truncated shard?)")
    return header, 8 + n


def _shard_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelFormatError(str(index), f"not a valid safetensors index ({e})") from e
        files = sorted(set(weight_map.values()))
        for name in files:
            if not isinstance(name, str) or Path(name).name != name:
                raise ModelFormatError(str(index), f"shard name {name!r} is not a file name in this folder")
            if not (folder / name).is_file():
                raise ModelFormatError(str(folder / name), "missing shard (listed in model.safetensors.index.json)")
        return [folder / name for name in files]
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ModelFormatError(
            str(folder / pickles[0]),
            "pickle checkpoints are refused (they can run code when loaded); convert them to safetensors first",
        )
    raise ModelFormatError(str(folder), "no .safetensors weights found")


def read_source(folder: str | Path) -> Source:
    """Check an HF Qwen3-MoE folder completely (config, tokenizer, every tensor name, dtype and shape) without reading
    weights; raise a named error for the first problem."""
    folder = Path(folder)
    cfg = read_hf_config(folder)
    dims = Dims.from_hf_config(cfg, str(folder / "config.json"))
    rope_theta(cfg)
    if not (folder / "tokenizer.json").is_file():
        raise ModelFormatError(str(folder / "tokenizer.json"), "missing (the GGUF needs the tokenizer)")
    tensors: dict[str, StoredTensor] = {}
    expected = hf_shapes(dims)
    for shard in _shard_files(folder):
        header, data_start = _safetensors_header(shard)
        for name, info in header.items():
            if name in tensors:
                raise ModelFormatError(f"tensor {name}", f"stored twice ({tensors[name].path.name} and {shard.name})")
            if name not in expected:
                raise ModelFormatError(
                    f"tensor {name}", f"in {shard.name} is not part of a Qwen3-MoE checkpoint with this config"
                )
            if info["dtype"] not in _TORCH_DTYPES:
                raise ModelFormatError(
                    f"tensor {name}", f"has unsupported dtype {info['dtype']} (F32, F16 or BF16 expected)"
                )
            if tuple(info["shape"]) != expected[name]:
                raise ModelFormatError(
                    f"tensor {name}",
                    f"shape mismatch: {list(info['shape'])} in {shard.name}, config implies {list(expected[name])}",
                )
            begin, end = info["data_offsets"]
            itemsize = _TORCH_DTYPES[info["dtype"]].itemsize
            if end - begin != itemsize * int(torch.Size(expected[name]).numel()):
                raise ModelFormatError(
                    f"tensor {name}", f"in {shard.name}: byte range does not match its shape and dtype"
                )
            tensors[name] = StoredTensor(shard, data_start + begin, data_start + end, info["dtype"], expected[name])
    missing = [name for name in expected if name not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelFormatError(f"tensor {missing[0]}", f"missing from the checkpoint{more}")
    return Source(folder, cfg, dims, tensors)


def plan_tensors(dims: Dims, get: Callable[[str], torch.Tensor], out_type: OutputType) -> list[PlannedTensor]:
    """The GGUF tensors for `dims`, each producing its values from HF tensors via `get(hf_name)` (stacking experts),
    each in the type engine.quant_mix chooses for `out_type` (llama.cpp's rules)."""

    def producer(t: GGUFTensor) -> Callable[[], torch.Tensor]:
        if len(t.sources) == 1:
            return lambda: get(t.sources[0])

        def stacked() -> torch.Tensor:  # [E, rows, cols], filled expert by expert (no second copy of the stack)
            first = get(t.sources[0])
            out = torch.empty((len(t.sources), *first.shape), dtype=first.dtype)
            out[0] = first
            for e, name in enumerate(t.sources[1:], start=1):
                out[e] = get(name)
            return out

        return stacked

    return [PlannedTensor(t.name, t.shape, tensor_type(t, dims, out_type), producer(t)) for t in gguf_tensors(dims)]


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


def gguf_metadata(folder: Path, cfg: dict, dims: Dims, out_type: OutputType) -> Callable[[gguf.GGUFWriter], None]:
    """The metadata llama.cpp writes for a qwen3moe model from the HF folder `folder` (config + tokenizer files)."""
    tokens, types = _token_list(folder, dims.vocab)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=dims.vocab)
    name = cfg.get("_name_or_path") or folder.name

    def add(w: gguf.GGUFWriter) -> None:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(str(name))
        w.add_block_count(dims.layers)
        w.add_context_length(int(cfg.get("max_position_embeddings", 40960)))
        w.add_embedding_length(dims.hidden)
        if dims.dense_inter:
            w.add_feed_forward_length(dims.dense_inter)
        w.add_head_count(dims.heads)
        w.add_head_count_kv(dims.kv_heads)
        w.add_rope_freq_base(rope_theta(cfg))
        w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
        w.add_expert_used_count(dims.experts_per_tok)
        w.add_key_length(dims.head_dim)
        w.add_value_length(dims.head_dim)
        w.add_file_type(out_type.file_type)
        w.add_expert_count(dims.experts)
        w.add_expert_feed_forward_length(dims.moe_inter)
        if not cfg.get("norm_topk_prob", True):  # llama.cpp renormalises qwen3moe's top-k by default; say only "no"
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
    return sum(t.nbytes for t in plan_tensors(source.dims, lambda name: torch.empty(0), parse_output_type(dtype)))


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
    llama-quantize preset q4_0, q4_k_m, q5_k_m, q6_k, iq4_xs with its per-tensor type mix; see engine/quant_mix.py).
    An existing `out` is replaced only with `force`, and never when it is one of the source's files.
    Raises ModelFormatError/TesseraError naming the problem, Cancelled when `cancel` is set; never leaves a partial file."""
    out_type = parse_output_type(dtype)
    out = check_output(src, out, force=force)  # an existing file only with force, never a file of the source
    sweep_partials(out)  # what a killed conversion to the same file left
    source = read_source(src)
    reader = source.reader()

    def get(name: str) -> torch.Tensor:  # cancel is also honoured between the experts of one stacked tensor
        if cancel is not None and cancel.is_set():
            raise Cancelled("conversion cancelled")
        return reader.get(name)

    try:
        tensors = plan_tensors(source.dims, get, out_type)
        meta = gguf_metadata(source.folder, source.config, source.dims, out_type)
        return write_gguf(out, arch_name(), meta, tensors, progress=progress, cancel=cancel)
    finally:
        reader.close()


def prepack(gguf_path: str | Path, backend: str, progress: Callable[[ProgressEvent], None] | None = None) -> str:
    """Fill the packed-weight cache for `backend` by loading the converted model once, exactly as the app will load it
    (same cache key), so the first real load is fast. Returns a line saying what happened."""
    if backend == "Torch":
        return "prepack: the Torch backend uses the weights as stored; nothing to pack"
    import engine

    session = engine.load(gguf_path, backend=backend, progress=progress)
    try:
        if session.backend_name == "Torch":
            return f"prepack: nothing packed, backend {backend} resolved to Torch ({session.backend_reason})"
        return f"prepack: experts packed for {session.backend_name} into the packed-weight cache"
    finally:
        session.close()
