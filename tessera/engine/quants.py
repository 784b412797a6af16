"""GGML tensor types Tessera reads: the type table (block size, bytes per block) and dequantization to float32.

`gguf.quants` (the numpy reference that ships with llama.cpp's Python package) does the arithmetic, so results are
bit-exact with it by construction; this module adds the type table, the "unsupported type" error, and chunking so a
large expert tensor is dequantized a slice at a time into one preallocated output instead of through whole-tensor
temporaries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as _gguf_dequantize

from tessera.engine.errors import ModelFormatError

if TYPE_CHECKING:  # torch is imported where a tensor is made: engine.preload reads headers before `import torch`
    import torch

T = GGMLQuantizationType

# Types stored as plain floats: numpy dtype of the stored elements (bf16 is carried as uint16 and viewed by torch).
FLOAT_TYPES: dict[T, np.dtype] = {
    T.F32: np.dtype(np.float32),
    T.F16: np.dtype(np.float16),
    T.BF16: np.dtype(np.uint16),
}
# Block-quantized types (kept as blocks by the loader, engine.quantized.keeps_blocks: routed experts of every one,
# 2-D weights of the types the dense kernels read): the ones llama-quantize's Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K
# and IQ4_XS presets write, with the fallbacks it uses for rows that do not split into 256 (Q5_0, Q5_1, IQ4_NL).
QUANT_TYPES: tuple[T, ...] = (T.Q8_0, T.Q4_0, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS)
SUPPORTED: tuple[T, ...] = (*FLOAT_TYPES, *QUANT_TYPES)


def type_name(raw_type: int) -> str:
    try:
        return T(raw_type).name
    except ValueError:
        return f"#{raw_type}"


def check_supported(raw_type: int, subject: str) -> T:
    """The GGML type for `raw_type`, or a ModelFormatError naming `subject` (a tensor) and the type."""
    if raw_type not in {int(t) for t in SUPPORTED}:
        names = ", ".join(t.name for t in SUPPORTED)
        raise ModelFormatError(subject, f"unsupported tensor type {type_name(raw_type)} (Tessera reads {names})")
    return T(raw_type)


def block_size(qtype: T) -> int:
    return GGML_QUANT_SIZES[qtype][0]


def type_size(qtype: T) -> int:
    return GGML_QUANT_SIZES[qtype][1]


def nbytes(qtype: T, shape: tuple[int, ...]) -> int:
    """Bytes stored for a tensor of numpy-order `shape` (innermost dimension last, a multiple of the block size)."""
    n = 1
    for d in shape:
        n *= d
    return n // block_size(qtype) * type_size(qtype)


def byte_shape(qtype: T, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the raw storage: float types keep `shape`; quant types store [..., blocks_per_row * type_size]."""
    if qtype in FLOAT_TYPES:
        return shape
    return (*shape[:-1], shape[-1] // block_size(qtype) * type_size(qtype))


def dequantize(raw: np.ndarray, qtype: T, shape: tuple[int, ...], chunk_bytes: int = 64 << 20) -> np.ndarray:
    """Quantized storage `raw` [..., row_bytes] (uint8) -> float32 array of numpy-order `shape`.

    Works through the rows in chunks of about `chunk_bytes` of output so the numpy temporaries stay small."""
    out = np.empty(shape, dtype=np.float32)  # [..., C]
    rows_in = raw.reshape(-1, raw.shape[-1])  # [R, row_bytes]
    rows_out = out.reshape(-1, shape[-1])  # [R, C]
    step = max(1, chunk_bytes // (4 * shape[-1]))
    for r in range(0, rows_in.shape[0], step):
        rows_out[r : r + step] = _gguf_dequantize(rows_in[r : r + step], qtype)
    return out


def to_torch(raw: np.ndarray, qtype: T, shape: tuple[int, ...]) -> torch.Tensor:
    """Stored data -> torch tensor: float types as zero-copy views in their stored dtype, quant types as float32."""
    import torch

    if qtype in FLOAT_TYPES:
        t = torch.from_numpy(raw)
        return t.view(torch.bfloat16) if qtype == T.BF16 else t
    return torch.from_numpy(dequantize(raw, qtype, shape))
