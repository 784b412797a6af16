"""Routed experts kept as the GGUF file stores them: block-quantized bytes, memory-mapped, never widened as a whole.

`QuantizedTensor` holds one stacked expert tensor (`blk.N.ffn_{gate,up,down}_exps`): its GGML type, its logical shape
[E, rows, cols] and a uint8 view of the file's blocks [E, rows, row_bytes]. Indexing it dequantizes only what is asked
for: `t[e]` one expert ([rows, cols] float32, exactly `gguf.quants.dequantize` of its blocks), `t[ids]` a few of them.
So the pure-torch experts (engine.experts.TorchExperts) widen one expert at a time on use and the process holds about
the file, not a float32 copy of every layer.

`QuantizedMatrix` holds one 2-D weight (attention, dense MLP, lm_head, the embedding table) as its blocks [N, B]: a
view of the map, multiplied in place by `engine.native.quant_matmul` (engine.dense.Linear) and dequantized a few rows at
a time for an embedding lookup (`rows`). Only the types those kernels read (`DENSE_BLOCK_TYPES`) stay blocks; the
32-value fallbacks llama-quantize writes for rows that do not split into 256 (Q5_0, Q5_1, IQ4_NL) become float32.

`keeps_blocks(qtype, routed_expert, ndim)` is the loader's rule for which tensors stay as blocks; engine.model_info
sizes a load with the same rule (`held_bytes`). `widened(layer)` is the float copy of one layer the native backends
pack from until they read the blocks themselves (see engine.native.pack_layer).

Letters: E experts, R rows, C columns (elements), B bytes of one stored row.
"""

from __future__ import annotations

import numpy as np
import torch

from tessera.engine import quants
from tessera.engine.errors import ModelFormatError
from tessera.engine.experts import LayerExperts

T = quants.T


# The types engine.native.quant_matmul / quant_dequantize read (tests/engine/test_quant_dense.py checks the list
# against engine.native.quant_types()).
DENSE_BLOCK_TYPES: tuple[T, ...] = (T.Q8_0, T.Q4_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)


def keeps_blocks(qtype: T, routed_expert: bool, ndim: int = 2) -> bool:
    """Whether the loader keeps a tensor as its stored blocks: a routed expert of any block-quantized type
    (QuantizedTensor), or a 2-D weight of a type the native dense kernels read (QuantizedMatrix). Anything else
    quantized is widened to float32 at load; float types are used as stored."""
    if routed_expert:
        return qtype in quants.QUANT_TYPES
    return ndim == 2 and qtype in DENSE_BLOCK_TYPES


def held_bytes(qtype: T, elements: int, stored_bytes: int, routed_expert: bool, ndim: int = 2) -> int:
    """Bytes a tensor takes once loaded: as stored for float types and for kept blocks, 4 per element when widened."""
    if qtype in quants.FLOAT_TYPES or keeps_blocks(qtype, routed_expert, ndim):
        return stored_bytes
    return 4 * elements


class QuantizedTensor:
    """A stacked expert tensor [E, R, C] of a block-quantized GGML type, read from `raw` [E, R, B] (uint8, usually a
    view of the memory-mapped file) only when an expert is indexed."""

    def __init__(self, raw: np.ndarray, qtype: T, shape: tuple[int, ...], name: str):
        if len(shape) != 3 or raw.dtype != np.uint8 or tuple(raw.shape) != quants.byte_shape(qtype, tuple(shape)):
            raise ValueError(f"{name}: raw {raw.dtype} {list(raw.shape)} does not hold {qtype.name} {list(shape)}")
        self.raw, self.qtype, self.name = raw, qtype, name
        self.shape = torch.Size(shape)

    dtype = torch.float32  # what indexing yields (and what a native backend is handed until it reads blocks)

    @property
    def nbytes(self) -> int:
        """Bytes as stored (and as held: the blocks are not copied)."""
        return int(self.raw.nbytes)

    def __len__(self) -> int:
        return self.shape[0]

    def expert(self, e: int) -> torch.Tensor:
        """Expert `e` as float32 [R, C]."""
        return torch.from_numpy(quants.dequantize(self.raw[e], self.qtype, tuple(self.shape[1:])))

    def __getitem__(self, index) -> torch.Tensor:
        """t[e] -> [R, C]; t[ids] (a list or 1-D integer tensor) -> [len(ids), R, C]; float32, dequantized now."""
        if isinstance(index, (int, np.integer)) or (isinstance(index, torch.Tensor) and index.dim() == 0):
            return self.expert(int(index))
        if isinstance(index, slice):
            index = range(*index.indices(len(self)))
        ids = index.tolist() if isinstance(index, torch.Tensor) else list(index)
        out = torch.empty((len(ids), *self.shape[1:]), dtype=torch.float32)  # [n, R, C]
        for j, e in enumerate(ids):
            out[j] = self.expert(int(e))
        return out

    def dequantize(self) -> torch.Tensor:
        """The whole tensor as float32 [E, R, C] (a native backend's packing input, one layer at a time)."""
        return torch.from_numpy(quants.dequantize(self.raw, self.qtype, tuple(self.shape)))

    def __repr__(self) -> str:
        return f"QuantizedTensor({self.name}, {self.qtype.name}, {list(self.shape)})"


class QuantizedMatrix:
    """A 2-D weight [N, K] (the nn.Linear layout; an embedding table [V, H]) of a type in DENSE_BLOCK_TYPES, read in
    place from `raw` [N, B] (uint8, usually a view of the memory-mapped file). Never widened as a whole on the CPU."""

    def __init__(self, raw: np.ndarray, qtype: T, shape: tuple[int, ...], name: str):
        if qtype not in DENSE_BLOCK_TYPES:
            names = ", ".join(t.name for t in DENSE_BLOCK_TYPES)
            raise ValueError(f"{name}: {qtype.name} is not a type the dense kernels read ({names})")
        if len(shape) != 2 or raw.dtype != np.uint8 or tuple(raw.shape) != quants.byte_shape(qtype, tuple(shape)):
            raise ValueError(f"{name}: raw {raw.dtype} {list(raw.shape)} does not hold {qtype.name} {list(shape)}")
        if not raw.flags.c_contiguous:
            raise ValueError(f"{name}: raw blocks must be C-contiguous")
        self.raw, self.qtype, self.name = raw, qtype, name
        self.shape = torch.Size(shape)
        self.device = torch.device("cpu")

    @property
    def nbytes(self) -> int:
        """Bytes as stored (and as held: the blocks are not copied)."""
        return int(self.raw.nbytes)

    def dim(self) -> int:
        return 2

    def is_floating_point(self) -> bool:
        """False: the storage is blocks of integers (with f16 scales, checked finite at load by check_scales), so the
        NaN/Inf scan of engine.finite does not apply."""
        return False

    def rows(self, ids: torch.Tensor, pool) -> torch.Tensor:
        """Rows `ids` ([T] int64) as float32 [T, K], exactly `gguf.quants.dequantize` of their blocks; only those rows
        are read. IndexError for an id outside [-N, N)."""
        picked = self.raw[ids.to("cpu", torch.int64).numpy()]  # [T, B] a copy of just these rows
        out = torch.empty((picked.shape[0], self.shape[1]), dtype=torch.float32)  # [T, K]
        if picked.shape[0]:
            from tessera.engine import native

            native.quant_dequantize(self.qtype, picked, out, pool)
        return out

    def widen(self, dtype: torch.dtype, device: torch.device | str, pool, chunk_rows: int = 4096) -> torch.Tensor:
        """The whole matrix as `dtype` [N, K] on `device` (a CUDA placement's one copy), dequantized `chunk_rows` rows
        at a time so no float32 copy of the whole matrix is ever held."""
        from tessera.engine import native

        out = torch.empty(tuple(self.shape), dtype=dtype, device=device)  # [N, K]
        buf = torch.empty((min(chunk_rows, self.shape[0]), self.shape[1]), dtype=torch.float32)  # [chunk, K]
        for start in range(0, self.shape[0], chunk_rows):
            block = self.raw[start : start + chunk_rows]  # [n, B]
            native.quant_dequantize(self.qtype, block, buf[: block.shape[0]], pool)
            out[start : start + block.shape[0]].copy_(buf[: block.shape[0]])
        return out

    def __repr__(self) -> str:
        return f"QuantizedMatrix({self.name}, {self.qtype.name}, {list(self.shape)})"


def is_quantized(layer: LayerExperts) -> bool:
    return any(isinstance(t, QuantizedTensor) for t in (layer.gate_proj, layer.up_proj, layer.down_proj))


def widened(layer: LayerExperts) -> LayerExperts:
    """`layer` with every QuantizedTensor dequantized to float32 (the caller frees it after use); float layers as
    they are."""
    if not is_quantized(layer):
        return layer

    def f(t):
        return t.dequantize() if isinstance(t, QuantizedTensor) else t

    return LayerExperts(f(layer.gate_proj), f(layer.up_proj), f(layer.down_proj))


# Byte offsets of the f16 scale fields inside one block of each quantized type (ggml-common.h: d, and dmin where the
# type has one).
SCALE_OFFSETS: dict[T, tuple[int, ...]] = {
    T.Q8_0: (0,),
    T.Q4_0: (0,),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.IQ4_NL: (0,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ4_XS: (0,),
}
_CHECK_CHUNK_BLOCKS = 1 << 22  # blocks per step of the scale check (a few MB of scales at a time)


def check_scales(raw: np.ndarray, qtype: T, subject: str, tensor: str) -> None:
    """Refuse a quantized tensor whose f16 block scales hold NaN or Inf: ModelFormatError naming the file (`subject`),
    the tensor and the first bad block (counted over the whole tensor). A type the native kernels read is scanned by
    `quant_validate` on the dense pool (one multithreaded pass: 0.07 s for a 1.9 GB file whose pages are in memory,
    against 0.35 s for the numpy gather below, which at 48 layers was most of a warm load); the numpy pass runs for the
    other types, and to name the block when the native scan finds one."""
    if qtype not in SCALE_OFFSETS:
        return
    if qtype in DENSE_BLOCK_TYPES and _native_scan_is_clean(raw, qtype, tensor):
        return
    size = quants.type_size(qtype)
    blocks = raw.reshape(-1, size)  # [N, block bytes]
    for start in range(0, blocks.shape[0], _CHECK_CHUNK_BLOCKS):
        chunk = blocks[start : start + _CHECK_CHUNK_BLOCKS]
        for off in SCALE_OFFSETS[qtype]:
            scales = np.ascontiguousarray(chunk[:, off : off + 2]).view(np.float16)[:, 0]  # [n]
            bad = ~np.isfinite(scales)
            if bad.any():
                b = start + int(np.flatnonzero(bad)[0])
                raise ModelFormatError(
                    subject,
                    f"tensor {tensor}: block {b} has a NaN or Inf scale ({qtype.name}); the file is damaged",
                )


def _native_scan_is_clean(raw: np.ndarray, qtype: T, tensor: str) -> bool:
    from tessera.engine import native
    from tessera.engine.dense import dense_pool

    try:
        native.quant_validate(qtype, raw, tensor, dense_pool())
    except ValueError:  # a non-finite scale (or a shape the native check reads differently): the numpy pass names it
        return False
    return True
