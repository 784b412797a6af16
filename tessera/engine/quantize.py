"""Tessera's own GGUF quantizer: float weights -> valid GGML blocks of Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS (and IQ4_NL,
the 32-element fallback llama.cpp uses for IQ4_XS rows that do not split into 256).

Numpy, vectorised over whole blocks. The block layouts are GGML's (ggml-common.h), checked byte for byte against
`gguf.quants.dequantize` in tests/formats/test_quantize.py. Scales are chosen in one pass, without llama.cpp's
iterative search (make_qkx2_quants / make_qx_quants / the IQ4 `ntry` loop), since Tessera quantizes random test weights,
not published models; every element is then rounded against the scale as it will be stored (f16 and 6-/8-bit
sub-scales), so the blocks decode to the nearest representable value of the chosen grid:

- Q8_0 and Q4_0: ggml's reference rules exactly (absmax / 127, rounded half away from zero; signed max / -8), so their
  bytes equal `gguf.quants.quantize`'s.
- Q4_K, Q5_K: per 32-element sub-block an affine grid from its min (clamped to <= 0, as ggml does) to its max, with the
  8 sub-scales and 8 sub-mins stored in 6 bits against the super-block's f16 `d` and `dmin`.
- Q6_K: per 16-element group a symmetric grid whose extreme value lands on -32, 16 int8 sub-scales against an f16 `d`.
- IQ4_XS / IQ4_NL: per 32-element sub-block the scale that puts its extreme value on the non-linear table's -127, each
  element mapped to the nearest of the 16 table values; IQ4_XS stores the sub-scales in 6 bits against an f16 `d`.

Q5_0 / Q5_1 (llama.cpp's fallbacks for Q4_K / Q5_K on rows that do not split into 256) are delegated to
`gguf.quants.quantize`, which ports ggml's reference bit-exactly.

Public API: `quantize(x, qtype)`, `QUANTIZABLE`, `QuantizeError`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize as _gguf_quantize

from tessera.engine.errors import TesseraError

T = GGMLQuantizationType
QK_K = 256
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
_IQ4_MIDPOINTS = (IQ4_VALUES[1:] + IQ4_VALUES[:-1]) / 2  # [15] decision boundaries of the nearest table value


class QuantizeError(TesseraError):
    """Values cannot be stored in the requested block type (row length not a multiple of its block, NaN/Inf input,
    or a type Tessera does not write)."""


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    """[N] float -> [N, 2] uint8, the little-endian f16 GGML stores."""
    return v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _f16_round(v: np.ndarray) -> np.ndarray:
    """The value a float takes once stored as f16 (what the decoder will multiply by)."""
    return v.astype(np.float16).astype(np.float32)


def _inverse(d: np.ndarray) -> np.ndarray:
    """1 / d, with 0 where d == 0 (an all-zero block decodes to zeros whatever its codes)."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf (ggml's nearest_int rounds half away from zero too, for the magnitudes used here)."""
    return np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    """Per row of `x` [..., n], the element of largest magnitude, sign kept (ggml's `max` in Q4_0, Q6_K, IQ4)."""
    idx = np.abs(x).argmax(axis=-1)[..., None]
    return np.take_along_axis(x, idx, axis=-1)[..., 0]


def _pack_nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (lo.astype(np.uint8) & 0x0F) | ((hi.astype(np.uint8) & 0x0F) << 4)


# ---- 32-element block types --------------------------------------------------------------------------------------


def _q8_0(x: np.ndarray) -> np.ndarray:  # [N, 32] -> [N, 34]
    d = np.abs(x).max(axis=-1) / np.float32(127)  # [N]
    q = _round_half_away(x * _inverse(d)[:, None]).astype(np.int8)  # [N, 32]
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1)


def _q4_0(x: np.ndarray) -> np.ndarray:  # [N, 32] -> [N, 18]
    d = _signed_absmax(x) / np.float32(-8)  # [N]
    q = np.trunc(x * _inverse(d)[:, None] + np.float32(8.5)).clip(0, 15)  # [N, 32] in 0..15
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q[:, :16], q[:, 16:])], axis=1)


def _iq4_codes(x: np.ndarray, dl: np.ndarray) -> np.ndarray:
    """Index of the nearest IQ4 table value to x / dl; x [..., n], dl [...] (0 where the group is all zero)."""
    v = x * _inverse(dl)[..., None]
    return np.searchsorted(_IQ4_MIDPOINTS, v).astype(np.uint8)  # [..., n] in 0..15


def _iq4_nl(x: np.ndarray) -> np.ndarray:  # [N, 32] -> [N, 18]
    d = _f16_round(_signed_absmax(x) / np.float32(-127))  # [N]
    q = _iq4_codes(x, d)  # [N, 32]
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q[:, :16], q[:, 16:])], axis=1)


# ---- 256-element super-block types -------------------------------------------------------------------------------


def _affine_subscales(xs: np.ndarray, qmax: int) -> tuple[np.ndarray, ...]:
    """Q4_K/Q5_K scales for xs [N, 8, 32]: stored f16 d, dmin [N], 6-bit sub-scales sc and sub-mins m [N, 8], and the
    codes q [N, 8, 32] in 0..qmax against the stored values (value = d*sc*q - dmin*m)."""
    lo = np.minimum(xs.min(axis=-1), 0)  # [N, 8] ggml keeps the grid's bottom at or below zero
    hi = xs.max(axis=-1)  # [N, 8]
    scale = (hi - lo) / np.float32(qmax)  # [N, 8]
    mins = -lo  # [N, 8] >= 0
    d = _f16_round(scale.max(axis=-1) / np.float32(63))  # [N]
    dmin = _f16_round(mins.max(axis=-1) / np.float32(63))  # [N]
    sc = _round_half_away(scale * _inverse(d)[:, None]).clip(0, 63)  # [N, 8]
    m = _round_half_away(mins * _inverse(dmin)[:, None]).clip(0, 63)  # [N, 8]
    ds = d[:, None] * sc  # [N, 8] effective step
    dm = dmin[:, None] * m  # [N, 8] effective offset
    q = _round_half_away((xs + dm[..., None]) * _inverse(ds)[..., None]).clip(0, qmax)  # [N, 8, 32]
    return d, dmin, sc.astype(np.uint8), m.astype(np.uint8), q.astype(np.uint8)


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins [N, 8] -> the 12-byte K-quant scale field (inverse of gguf's Q4_K.get_scale_min)."""
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (m[:, :4] & 0x3F) | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return out


def _q4_k(x: np.ndarray) -> np.ndarray:  # [N, 256] -> [N, 144]
    n = x.shape[0]
    d, dmin, sc, m, q = _affine_subscales(x.reshape(n, 8, 32), 15)
    qs = _pack_nibbles(q[:, 0::2], q[:, 1::2]).reshape(n, 128)  # 32 bytes per pair of sub-blocks
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, m), qs], axis=1)


def _q5_k(x: np.ndarray) -> np.ndarray:  # [N, 256] -> [N, 176]
    n = x.shape[0]
    d, dmin, sc, m, q = _affine_subscales(x.reshape(n, 8, 32), 31)
    qs = _pack_nibbles(q[:, 0::2], q[:, 1::2]).reshape(n, 128)
    high = (q >> 4) & 1  # [N, 8, 32]: bit j of qh[l] is sub-block j's fifth bit
    qh = (high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)  # [N, 32]
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, m), qh, qs], axis=1)


def _q6_k(x: np.ndarray) -> np.ndarray:  # [N, 256] -> [N, 210]
    n = x.shape[0]
    groups = x.reshape(n, 16, 16)
    scale = _signed_absmax(groups) / np.float32(-32)  # [N, 16]: each group's extreme value lands on -32
    top = _signed_absmax(scale)  # [N]
    iscale = np.float32(-128) * _inverse(top)  # [N]
    sc = np.minimum(127, _round_half_away(scale * iscale[:, None])).astype(np.int8)  # [N, 16]
    d = _f16_round(_inverse(iscale))  # [N]
    ds = d[:, None] * sc.astype(np.float32)  # [N, 16]
    q = (_round_half_away(groups * _inverse(ds)[..., None]).clip(-32, 31) + 32).astype(np.uint8)  # [N, 16, 16]
    q = q.reshape(n, 2, 4, 32)  # [N, half, quarter, l]: element = half*128 + quarter*32 + l
    ql = _pack_nibbles(q[:, :, 0:2].reshape(n, 2, 64), q[:, :, 2:4].reshape(n, 2, 64)).reshape(n, 128)
    qh = ((q >> 4) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]).sum(axis=2, dtype=np.uint8)  # [N,2,32]
    return np.concatenate([ql, qh.reshape(n, 64), sc.view(np.uint8), _f16_bytes(d)], axis=1)


def _iq4_xs(x: np.ndarray) -> np.ndarray:  # [N, 256] -> [N, 136]
    n = x.shape[0]
    xs = x.reshape(n, 8, 32)
    sub = _signed_absmax(xs) / np.float32(-127)  # [N, 8] each sub-block's scale before 6-bit storage
    d = _f16_round(_signed_absmax(sub) / np.float32(-32))  # [N]
    ls = _round_half_away(sub * _inverse(d)[:, None]).clip(-32, 31)  # [N, 8]
    q = _iq4_codes(xs, d[:, None] * ls)  # [N, 8, 32]
    stored = (ls + 32).astype(np.uint8)  # [N, 8] six bits each
    scales_h = ((stored.astype(np.uint16) >> 4) << (2 * np.arange(8, dtype=np.uint16))[None, :]).sum(
        axis=1, dtype=np.uint16
    )  # [N]
    scales_l = _pack_nibbles(stored[:, 0::2], stored[:, 1::2])  # [N, 4]
    qs = _pack_nibbles(q[..., :16], q[..., 16:]).reshape(n, 128)
    return np.concatenate([_f16_bytes(d), scales_h.reshape(n, 1).view(np.uint8), scales_l, qs], axis=1)


def _via_gguf(qtype: T) -> Callable[[np.ndarray], np.ndarray]:
    return lambda blocks: _gguf_quantize(blocks, qtype)


_BLOCK_QUANTIZERS: dict[T, Callable[[np.ndarray], np.ndarray]] = {
    T.Q8_0: _q8_0,
    T.Q4_0: _q4_0,
    T.IQ4_NL: _iq4_nl,
    T.Q4_K: _q4_k,
    T.Q5_K: _q5_k,
    T.Q6_K: _q6_k,
    T.IQ4_XS: _iq4_xs,
    T.Q5_0: _via_gguf(T.Q5_0),
    T.Q5_1: _via_gguf(T.Q5_1),
}
QUANTIZABLE: tuple[T, ...] = tuple(_BLOCK_QUANTIZERS)


def quantize(x: np.ndarray, qtype: T, subject: str = "tensor") -> np.ndarray:
    """Float values `x` [..., C] -> GGML storage [..., C / block * block_bytes] (uint8) of `qtype`.

    Raises QuantizeError naming `subject` when C is not a multiple of the type's block size, when `x` holds NaN or Inf
    (the f16 block scales would be garbage), or when Tessera does not write `qtype`."""
    qtype = T(qtype)
    if qtype not in _BLOCK_QUANTIZERS:
        names = ", ".join(t.name for t in QUANTIZABLE)
        raise QuantizeError(subject, f"Tessera cannot write type {qtype.name} (it writes {names})")
    block, type_size = GGML_QUANT_SIZES[qtype]
    shape = tuple(x.shape)
    if not shape or shape[-1] % block:
        raise QuantizeError(
            subject,
            f"shape {list(shape)} does not split into {qtype.name} blocks: the last dimension must be a multiple of "
            f"{block}",
        )
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, block)  # [N, block]
    if not np.isfinite(blocks).all():
        bad = int(np.flatnonzero(~np.isfinite(blocks).all(axis=1))[0])
        raise QuantizeError(subject, f"holds NaN or Inf (first in block {bad}); refusing to write garbage scales")
    out = _BLOCK_QUANTIZERS[qtype](blocks)
    assert out.shape == (blocks.shape[0], type_size) and out.dtype == np.uint8, (qtype.name, out.shape, out.dtype)
    return out.reshape(*shape[:-1], shape[-1] // block * type_size)
