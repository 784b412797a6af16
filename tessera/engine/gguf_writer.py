"""Write a GGUF file one tensor at a time, safely: free-space check first, a temporary file in the target folder renamed
into place only when complete, cancel between tensors, and no partial file left behind on any failure.

Built on `gguf.GGUFWriter`'s incremental API (add_tensor_info for the whole table, then write_tensor_data per tensor),
so a model larger than RAM streams through: only the tensor being written is in memory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from tessera.engine.errors import Cancelled, TesseraError
from tessera.engine.events import ProgressEvent
from tessera.engine.quantize import quantize

Q = gguf.GGMLQuantizationType

FREE_SPACE_MARGIN = 64 * 1024 * 1024  # bytes kept free beyond the file itself


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor to write: its GGUF name, logical shape (numpy order), storage type, and how to get its values."""

    name: str
    shape: tuple[int, ...]
    qtype: gguf.GGMLQuantizationType
    produce: Callable[[], torch.Tensor]  # called when the tensor's turn comes; returns a float tensor of `shape`

    @property
    def nbytes(self) -> int:
        return int(np.prod(stored_shape(self.shape, self.qtype))) * _item_size(self.qtype)


def _item_size(qtype: gguf.GGMLQuantizationType) -> int:
    return {Q.F32: 4, Q.F16: 2, Q.BF16: 2}.get(qtype, 1)


def stored_shape(shape: Sequence[int], qtype: gguf.GGMLQuantizationType) -> tuple[int, ...]:
    """The numpy shape of the encoded data: elements for float types, bytes for block-quantized ones."""
    if qtype in (Q.F32, Q.F16, Q.BF16):
        return tuple(shape)
    return tuple(gguf.quant_shape_to_byte_shape(tuple(shape), qtype))


QUANT_CHUNK_ELEMENTS = 1 << 24  # quantize this many values at a time, so a big expert tensor needs no f32 copy


def encode(t: torch.Tensor, qtype: gguf.GGMLQuantizationType, subject: str = "tensor") -> np.ndarray:
    """`t` in GGUF's storage for `qtype`: float32/float16 arrays, bf16 as raw uint16, block types as bytes from
    engine.quantize (a row length that does not split into blocks, or NaN/Inf, is a QuantizeError naming `subject`)."""
    t = t.detach()
    if qtype == Q.F32:
        return t.to(torch.float32).contiguous().numpy()
    if qtype == Q.F16:
        return t.to(torch.float16).contiguous().numpy()
    if qtype == Q.BF16:
        return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)
    out = np.empty(stored_shape(t.shape, qtype), dtype=np.uint8)  # [..., row bytes]
    rows_in = t.reshape(-1, t.shape[-1])  # [R, C]
    rows_out = out.reshape(-1, out.shape[-1])  # [R, C / block * block bytes]
    step = max(1, QUANT_CHUNK_ELEMENTS // t.shape[-1])
    for r in range(0, rows_in.shape[0], step):
        rows_out[r : r + step] = quantize(rows_in[r : r + step].to(torch.float32).contiguous().numpy(), qtype, subject)
    return out


def check_free_space(target: Path, needed: int) -> None:
    """Raise a named error when the folder of `target` lacks room for `needed` bytes (plus a margin)."""
    free = shutil.disk_usage(target.parent).free
    if free < needed + FREE_SPACE_MARGIN:
        raise TesseraError(
            str(target.parent),
            f"not enough free space: the output needs {needed / 1e9:.2f} GB (+{FREE_SPACE_MARGIN >> 20} MiB margin), "
            f"{free / 1e9:.2f} GB free",
        )


def write_gguf(
    path: str | Path,
    arch: str,
    add_metadata: Callable[[gguf.GGUFWriter], None],
    tensors: Sequence[PlannedTensor],
    *,
    progress: Callable[[ProgressEvent], None] | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Write `tensors` (in order) and the metadata `add_metadata` puts on the writer into the GGUF file `path`.

    The file appears at `path` only once complete; on cancel (`Cancelled`), error, or interruption, the temporary file
    is removed and any existing file at `path` is left untouched. A full disk raises a TesseraError naming the folder.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise TesseraError(str(path.parent), "output folder does not exist")
    header_estimate = 16 * 1024 * 1024
    check_free_space(path, sum(t.nbytes for t in tensors) + header_estimate)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        writer = gguf.GGUFWriter(tmp, arch)
    except OSError as e:  # a read-only folder, no permission
        raise TesseraError(str(path.parent), f"cannot write the output here ({e.strerror or e}); nothing was "
                                             "written") from e
    try:
        add_metadata(writer)
        for t in tensors:
            writer.add_tensor_info(
                t.name, stored_shape(t.shape, t.qtype), _np_dtype(t.qtype), t.nbytes, raw_dtype=t.qtype
            )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        total = len(tensors)
        for i, t in enumerate(tensors):
            if cancel is not None and cancel.is_set():
                raise Cancelled("conversion cancelled")
            if progress is not None:
                progress(ProgressEvent("write", i, total, t.name))
            values = t.produce()
            if tuple(values.shape) != tuple(t.shape):
                raise TesseraError(f"tensor {t.name}", f"has shape {list(values.shape)}, expected {list(t.shape)}")
            data = encode(values, t.qtype, f"tensor {t.name}")
            del values
            writer.write_tensor_data(data)
            del data
        writer.close()
        if cancel is not None and cancel.is_set():
            raise Cancelled("conversion cancelled")
        os.replace(tmp, path)
    except OSError as e:
        _discard(writer, tmp)
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or e.errno is None:  # None: numpy's short write
            raise TesseraError(str(path.parent), "disk full while writing; the partial output was removed") from e
        raise TesseraError(str(path.parent), f"cannot write the output here ({e.strerror or e}); nothing was "
                                             "written") from e
    except BaseException:
        _discard(writer, tmp)
        raise
    if progress is not None:
        progress(ProgressEvent("write", len(tensors), len(tensors), "done"))
    return path


def _np_dtype(qtype: gguf.GGMLQuantizationType) -> np.dtype:
    return {Q.F32: np.dtype(np.float32), Q.F16: np.dtype(np.float16), Q.BF16: np.dtype(np.uint16)}.get(
        qtype, np.dtype(np.uint8)
    )


def _discard(writer: gguf.GGUFWriter, tmp: Path) -> None:
    with contextlib.suppress(Exception):  # already failing; the file is removed below either way
        writer.close()
    with contextlib.suppress(OSError):  # a read-only folder says EROFS even for a file that was never made
        tmp.unlink(missing_ok=True)
