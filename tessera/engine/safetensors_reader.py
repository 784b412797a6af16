"""Hugging Face model folders: config.json plus model.safetensors, or shards listed in model.safetensors.index.json.

Headers are validated by safetensors itself (offsets, sizes, dtypes; its errors become ModelFormatErrors naming the
file), tensors come back as memory-mapped torch tensors (safetensors >= 0.4 maps rather than reads). PyTorch pickle
checkpoints (.bin/.pt/.pth) are refused: unpickling a downloaded file can run arbitrary code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from tessera.engine.config import ModelConfig
from tessera.engine.errors import ModelFormatError
from tessera.engine.file_checks import check_model_folder, check_safetensors_header, load_json

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_ITEM_SIZE = {"F32": 4, "F16": 2, "BF16": 2}


def refuse_pickle(path: Path) -> ModelFormatError:
    return ModelFormatError(
        str(path),
        "PyTorch pickle checkpoints are not loaded (unpickling a file can run arbitrary code); "
        "use the model's .safetensors files or a GGUF file instead",
    )


def read_json(path: Path) -> Any:
    """Size-capped, regular files only; deep nesting, huge numbers and bad UTF-8 are named errors (file_checks)."""
    return load_json(path)


class HFCheckpoint:
    """An opened HF folder: `config`, and every stored tensor by checkpoint name (`names`, `shape`, `dtype`, `get`)."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ModelFormatError(str(folder), "is not a folder (expected a Hugging Face model folder or .gguf file)")
        check_model_folder(self.folder)  # a FIFO or device among the model files would stall or flood the load
        cfg_path = self.folder / "config.json"
        self.config_dict = read_json(cfg_path)
        self.config = ModelConfig.from_hf_dict(self.config_dict, str(cfg_path))
        self._where: dict[str, Path] = {}  # tensor name -> shard file
        self._handles: dict[Path, Any] = {}
        self._meta: dict[str, tuple[str, tuple[int, ...]]] = {}  # name -> (dtype, shape)
        for shard in self._shard_files():
            self._open_shard(shard)
        self._check_index()

    # ---- discovery -------------------------------------------------------------------------------------------------

    def _shard_files(self) -> list[Path]:
        index_path = self.folder / INDEX_FILE
        if index_path.exists():
            index = read_json(index_path)
            wm = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(wm, dict) or not wm:
                raise ModelFormatError(str(index_path), "has no weight_map")
            self._index = {}
            for name, shard in wm.items():
                if not isinstance(shard, str) or Path(shard).name != shard or not shard.endswith(".safetensors"):
                    raise ModelFormatError(str(index_path), f"tensor {name}: bad shard file name {shard!r}")
                self._index[name] = self.folder / shard
            shards = sorted(set(self._index.values()))
            for s in shards:
                if not s.is_file():
                    raise ModelFormatError(str(s), f"shard is missing (listed in {INDEX_FILE})")
            return shards
        self._index = None
        single = self.folder / SINGLE_FILE
        shards = [single] if single.is_file() else sorted(self.folder.glob("*.safetensors"))
        if not shards:
            pickles = sorted(p.name for p in self.folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
            if pickles:
                raise refuse_pickle(self.folder / pickles[0])
            raise ModelFormatError(str(self.folder), f"has no {SINGLE_FILE}, {INDEX_FILE} or other .safetensors file")
        return shards

    def _open_shard(self, shard: Path) -> None:
        check_safetensors_header(shard)  # duplicate tensor names, a FIFO in place of a shard
        try:
            h = safe_open(str(shard), framework="pt")
            names = list(h.keys())
            for name in names:
                sl = h.get_slice(name)
                dtype, shape = sl.get_dtype(), tuple(int(d) for d in sl.get_shape())
                if dtype not in DTYPES:
                    raise ModelFormatError(
                        str(shard), f"tensor {name}: unsupported dtype {dtype} (Tessera reads F32, F16, BF16)"
                    )
                if name in self._meta:
                    raise ModelFormatError(str(shard), f"tensor {name} is also stored in {self._where[name].name}")
                self._meta[name] = (dtype, shape)
                self._where[name] = shard
        except SafetensorError as e:
            raise ModelFormatError(str(shard), f"invalid safetensors file: {e}") from None
        except OSError as e:
            raise ModelFormatError(str(shard), f"cannot be read: {e}") from None
        self._handles[shard] = h

    def _check_index(self) -> None:
        if self._index is None:
            return
        for name, shard in self._index.items():
            if self._where.get(name) != shard:
                raise ModelFormatError(
                    str(shard), f"tensor {name} is listed for this shard in {INDEX_FILE} but is not stored in it"
                )
        for name, shard in self._where.items():
            if name not in self._index:
                raise ModelFormatError(str(shard), f"tensor {name} is stored here but not listed in {INDEX_FILE}")

    # ---- access ----------------------------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return list(self._meta)

    @property
    def files(self) -> list[Path]:
        return list(self._handles)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._meta[name][1]

    def dtype(self, name: str) -> str:
        return self._meta[name][0]

    def nbytes(self, name: str) -> int:
        n = _ITEM_SIZE[self.dtype(name)]
        for d in self.shape(name):
            n *= d
        return n

    def get(self, name: str) -> torch.Tensor:
        shard = self._where[name]
        try:
            return self._handles[shard].get_tensor(name)
        except SafetensorError as e:
            raise ModelFormatError(str(shard), f"tensor {name}: {e}") from None


def open_hf_folder(folder: str | os.PathLike[str]) -> HFCheckpoint:
    return HFCheckpoint(folder)
