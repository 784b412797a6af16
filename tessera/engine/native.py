"""The native extension (`engine._native`) for the engine: CPU probe, thread pools, packing, the tuning knobs that
change packed bytes, and the `ExpertBackend` that runs a model's routed experts through a native kernel. Which backends
exist and which one "Auto" picks is tessera/engine/backends.py, the module's other importer.

Letters: T tokens, H hidden size, I moe_intermediate_size, E experts in the layer, k experts per token.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from tessera.engine import _native
from tessera.engine.backends import AUTO, TORCH, resolve
from tessera.engine.deferred_keys import KeyThenStore, new_file_version
from tessera.engine.errors import NotEnoughMemoryError, TesseraError
from tessera.engine.events import ProgressEvent
from tessera.engine.expert_pages import populate_experts, read_ahead_experts, release_experts
from tessera.engine.experts import ExpertBackend, LayerExperts, TorchExperts
from tessera.engine.pack_cache import PackCache, layer_digest, layer_key
from tessera.engine.pack_store import PackStores
from tessera.engine.quantized import QuantizedTensor, is_quantized, widened
from tessera.engine.source_digest import FOLDER as SOURCES_FOLDER
from tessera.engine.source_digest import DigestRecord, SourceFile

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_PACKED_HEADER_BYTES = 64  # tessera::PackedHeader: magic, layout version, source dtype, backend, E, H, I


def layout_version() -> int:
    return int(_native.LAYOUT_VERSION)


def cpu_features() -> dict:
    """CPUID flags, XCR0 (and its AMX bits 17/18), the AMX permission request (rc, errno, reason), core counts."""
    return _native.cpu_features()


def physical_cores() -> int:
    return max(1, int(_native.cpu_features()["physical_cores"]))


def set_tuning_knob(name: str, value: int) -> int:
    """Sets one runtime knob the kernels read per call (spin_us, prefetch_bytes, amx_tile_min_rows,
    quant_moe_chunk_tokens, vnni_gemm_min_tokens; engine.tuned and engine.calibrate; decode_rows: rows per task of
    the one-token mat-vecs, 0 = ~256 KiB of blocks; decode_streams: their row streams per thread, 1 or 2, 0 = the
    CPU's default (Intel 2, others 1); avx_vnni: 0 keeps the AVX2 GEMM on vpmaddubsw, 1 uses AVX-VNNI
    where the CPU has it; avx2_gemm_min_tokens: the AVX2 GEMM's token threshold, 0 = per type) and returns its
    previous value;
    an unknown name is a ValueError naming it."""
    return int(_native.set_tuning_knob(name, int(value)))


def module_file() -> str:
    """The compiled module's file: engine.tuned keys a calibration by its content (a rebuilt kernel: another build)."""
    return str(_native.__file__)


def tuning() -> dict:
    """Every TESSERA_* tuning knob as the kernels and engine.dense use it (read once per process in
    native/src/tuning.cpp), a stored calibration applied (tessera/engine/tuned.py), and `from_environment`: the
    TESSERA_* names the environment set (a calibration never overrides them). A value that cannot be read is a
    TesseraError naming the variable."""
    knobs = dict(_native.tuning())
    knobs["from_environment"] = knobs["from_environment"].split()
    for line in knobs.pop("invalid").splitlines():
        name, _, value = line.partition("=")
        if name == "TESSERA_DECODE_STREAMS":
            raise TesseraError(name, f"must be 0 (the CPU's default), 1 or 2, got {value!r}")
        raise TesseraError(name, f"must be a whole number >= 0, got {value!r}")
    return knobs


def packing_knobs(backend: str) -> dict:
    """The knobs that change the bytes `backend` packs (part of the packed-weight cache key): {} for most backends."""
    return {"int8_group": int(_native.tuning()["int8_group"])} if backend == "AVX512Int8" else {}


def read_bandwidth(threads: int | None = None, seconds: float = 1.0, buffer_mib: float = 1024.0) -> float:
    """Native multi-threaded streaming-read probe: best pass in GB/s (1e9 B/s) over about `seconds`."""
    pool = _native.Pool(threads or physical_cores())
    return float(_native.read_bandwidth(pool, buffer_mib, seconds))


def peak_gflops(what: str, threads: int | None = None, seconds: float = 0.5) -> float:
    """Register-only peak on `threads` cores, GFLOP/s (int8: GOP/s) of `bf16_dot` (vdpbf16ps), `int8_dot`
    (vpdpbusd), `fp32_fma`, `amx_bf16` (tdpbf16ps) or `amx_int8` (tdpbssd); < 0 if the CPU (or, for AMX, the OS)
    lacks it."""
    return float(_native.peak_gflops(_native.Pool(threads or physical_cores()), what, seconds))


def amx_overlap(fma_blocks: int, items: int = 20000) -> dict[str, float]:
    """Whether 512-bit vector work runs beside AMX tile work on one core (the calling thread): ns per item of 16
    TDPBSSD (a 32 x 32 block over 4 K-steps, operands reloaded from L1, C tiles zeroed and stored, as the quantized
    tile GEMM's items are) with `fma_blocks` x 12 independent FMAs, measured four ways: `tiles_ns` (tiles only),
    `vector_ns` (the FMAs only), `after_ns` (the FMAs after each item's tiles, like an epilogue) and `spread_ns`
    (a quarter after each K-step). Raises RuntimeError where the CPU or the OS lacks AMX int8 or AVX-512."""
    return {k: float(v) for k, v in _native.amx_overlap(int(fma_blocks), int(items)).items()}


def make_pool(threads: int | None = None):
    n = int(threads or physical_cores())
    try:
        return _native.Pool(n)
    except RuntimeError as e:  # the OS refused the threads (ulimit -u, memory for their stacks)
        raise TesseraError("--threads", f"cannot start {n} threads here ({e}); ask for fewer") from None


def dense_kernel() -> str:
    """The native dense mat-vec kernel this CPU runs: "AVX512", "AVX2" or "Reference"."""
    return str(_native.dense_kernel())


def dense_matvec(w: torch.Tensor, x: torch.Tensor, out: torch.Tensor, pool, *, reference: bool = False) -> None:
    """out[T, N] = x[T, K] @ w[N, K].T with w bf16/f16 kept as stored (widened exactly, f32 accumulation); out is
    overwritten. CPU tensors, C-contiguous; wrong dtypes/shapes raise TypeError/ValueError naming the argument.
    `reference` runs the scalar double-accumulation twin."""
    _native.dense_matvec(w, x, out, pool, reference)


def attention_kernel(head_dim: int) -> str:
    """The native causal attention kernel this CPU runs for `head_dim` at decode (T = 1): "AVX512" (f32 products),
    "AVX2" (f32 products, CPUs without AVX-512) or "Reference" (scalar, double accumulation)."""
    return str(_native.attention_kernel(head_dim))


def attention_prefill_kernel(head_dim: int) -> str:
    """The one it runs at prefill (T > 1): "AMX_BF16" (the same bf16 products on AMX tiles, ~3x AVX512_BF16 on an AMX
    Xeon) where the CPU has AMX-BF16 and Linux grants it, else "AVX512_BF16" (vdpbf16ps: q and the probabilities
    rounded to bf16, 1.8x the f32 kernel's speed on Zen 4) where the CPU has avx512_bf16, else
    attention_kernel(head_dim)'s."""
    return str(_native.attention_prefill_kernel(head_dim))


def attention_bf16(q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, start: int, scale: float, out: torch.Tensor,
                   pool, *, kernel: str = "", token_major: bool = False) -> None:
    """out[T, nh*hd] = causal softmax(q k^T * scale) v, query t (position start+t) seeing positions [0, start+t].
    q [nh, T, hd] f32 ([T, nh, hd] with token_major: as the q projection and attention_prepare leave it);
    kt [nkv, ceil(C/32), hd, 32] and v [nkv, C, hd] bf16 (a KVCache's buffers of one layer), read in place.
    `kernel` names one to run ("AMX_BF16", "AMX_BF16-emulated" (on the portable tile emulator, for tests),
    "AVX512_BF16", "AVX512", "AVX2", "Reference": the scalar double-accumulation twin); "" runs
    attention_kernel(hd)'s at T = 1 and attention_prefill_kernel(hd)'s at T > 1. One this CPU cannot run raises
    ValueError."""
    _native.attention_bf16(q, kt, v, start, scale, out, pool, kernel, token_major)


def attention_prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor,
                      cos: torch.Tensor, sin: torch.Tensor, eps: float, kt: torch.Tensor, vc: torch.Tensor,
                      start: int, pool) -> None:
    """engine.model.Attention's work between its projections and the kernel, one pass on the pool: q [T, nh*hd] f32
    normed per head (RMSNorm, q_norm [hd]) and rotated (RoPE, cos/sin [T, hd]) in place; k [T, nkv*hd] the same with
    k_norm, and v [T, nkv*hd], rounded to bf16 (nearest even) into the cache buffers kt [nkv, ceil(C/32), hd, 32] and
    vc [nkv, C, hd] at positions [start, start+T). q, k, v may be column slices (rows contiguous). A bad argument
    raises ValueError/TypeError naming it."""
    _native.attention_prepare(q, k, v, q_norm, k_norm, cos, sin, eps, kt, vc, start, pool)


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor, pool,
                  add: torch.Tensor | None = None) -> None:
    """engine.model.rms_norm over the rows of x [..., n] (float32, contiguous) into out (same shape), on the pool; with
    `add`, x += add first, in place (a residual add fused into the norm that follows it). The squares are summed in
    double, as the native decode step does. A bad argument raises ValueError/TypeError naming it."""
    _native.rms_norm_rows(x, add, weight, eps, out, pool)


def add_rows(dst: torch.Tensor, src: torch.Tensor, pool) -> None:
    """dst += src (float32, contiguous, same size), on the pool."""
    _native.add_rows(dst, src, pool)


def attention_q8_kernel(head_dim: int) -> str:
    """The native attention kernel over a q8_0 KV cache this CPU runs for `head_dim`: "AVX512_VNNI" (int8 products by
    vpdpbusd), "AVX2" (int8 products by vpmaddubsw, where the CPU has AVX2 + FMA + F16C but no AVX-512 VNNI, or
    TESSERA_MAX_ISA caps it) or "Reference" (scalar, double accumulation over the dequantized cache)."""
    return str(_native.attention_q8_kernel(head_dim))


def attention_q8(q: torch.Tensor, k: torch.Tensor, ks: torch.Tensor, v: torch.Tensor, vs: torch.Tensor, start: int,
                 scale: float, out: torch.Tensor, pool, *, kernel: str = "") -> None:
    """attention_bf16's contract over a q8_0 cache (a KVCache of dtype int8's buffers of one layer, engine.kv_q8's
    layout): k [nkv, C/32, hd/4, 32, 4] and v [nkv, C/4, hd, 4] int8, ks/vs [nkv, C/32, hd/32, 32] float16.
    `kernel`: "AVX512_VNNI", "AVX2", "Reference" or "" for attention_q8_kernel(hd)'s; one this CPU cannot run raises
    ValueError."""
    _native.attention_q8(q, k, ks, v, vs, start, scale, out, pool, kernel)


def quantize_q8_0(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor) -> None:
    """The native decode step's q8_0 block quantizer (engine.kv_q8's maths): x [n, m] f32 -> q [n, m] int8 and
    d [n, m/32] float16, overwritten."""
    _native.quantize_q8_0(x, q, d)


def dense_matvec_multi(ws: list[torch.Tensor], x: torch.Tensor, outs: list[torch.Tensor], pool) -> None:
    """One token through several bf16/f16 weights that share x (a layer's q/k/v) in one pool dispatch:
    outs[i][1, N_i] = x[1, K] @ ws[i][N_i, K].T, bit-identical to `dense_matvec` on each (the same row sums). CPU
    tensors, C-contiguous; wrong dtypes/shapes or counts raise TypeError/ValueError naming the argument."""
    _native.dense_matvec_multi(ws, x, outs, pool)


def dense_gemm_bf16_available() -> bool:
    """Whether `dense_gemm_bf16` runs on this CPU (avx512_bf16, and TESSERA_MAX_ISA allows AVX-512)."""
    return bool(_native.dense_gemm_bf16_available())


def dense_gemm_bf16_amx_available() -> bool:
    """Whether `dense_gemm_bf16` multiplies on AMX bf16 tiles here (the CPU, the OS's permission, TESSERA_MAX_ISA)."""
    return bool(_native.dense_gemm_bf16_amx_available())


def dense_gemm_bf16(w: torch.Tensor, x: torch.Tensor, out: torch.Tensor, pool, tiles: str = "auto") -> None:
    """Prefill GEMM: out[T, N] = bf16(x)[T, K] @ w[N, K].T with w bf16 as stored; x is rounded once to bf16 (nearest
    even), products are exact and sums f32 (vdpbf16ps or TDPBF16PS, both flushing bf16 denormals to zero). tiles:
    "auto" (AMX tiles where `dense_gemm_bf16_amx_available()`, else vdpbf16ps), "vector", "amx" (RuntimeError where
    unavailable) or "emulated" (the tile emulator, the same bits as "amx"; tests). out is overwritten.
    Raises RuntimeError where `dense_gemm_bf16_available()` is False, TypeError/ValueError naming a bad argument."""
    _native.dense_gemm_bf16(w, x, out, pool, tiles)


def dense_gemm_f32_available() -> bool:
    """Whether `dense_gemm_f32` runs on this CPU (avx2/fma/f16c, and TESSERA_MAX_ISA allows AVX2)."""
    return bool(_native.dense_gemm_f32_available())


def dense_gemm_f32(w: torch.Tensor, x: torch.Tensor, out: torch.Tensor, pool) -> None:
    """Prefill GEMM for CPUs without avx512_bf16: out[T, N] = x[T, K] @ w[N, K].T with w bf16 or f16 as stored, each
    weight widened exactly to f32 once per call, x kept f32, f32 FMA sums in K order (per row and token the same bits
    whatever T is). out is overwritten. Raises RuntimeError where `dense_gemm_f32_available()` is False,
    TypeError/ValueError naming a bad argument."""
    _native.dense_gemm_f32(w, x, out, pool)


# ------------------------------------------------------------------------------------------------------------- packing


def _as_native(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dtype not in _DTYPES:
        raise TesseraError(f"tensor {name}",
                           f"dtype {t.dtype} cannot be packed (expected float32, float16 or bfloat16)")
    return t.detach().to("cpu").contiguous()


def pack_layer(backend: str, experts: LayerExperts, pool) -> np.ndarray:
    """Packs one layer's experts into a fresh 64-byte-aligned uint8 blob for `backend`.

    Quantized GGUF experts (engine.quantized.QuantizedTensor) reach here only when `reads_blocks` says no (a bf16
    backend chosen by name, or a type without a block kernel): they are widened to float32 for this one layer and
    freed when it is packed."""
    kernel = _native.backend(backend)
    experts = widened(experts)  # float layers pass through unchanged
    gate = _as_native(experts.gate_proj, "gate_proj")  # [E, I, H]
    up = _as_native(experts.up_proj, "up_proj")  # [E, I, H]
    down = _as_native(experts.down_proj, "down_proj")  # [E, H, I]
    E, I, H = gate.shape
    blob = _native.aligned_empty(kernel.packed_bytes(E, H, I, _DTYPES[gate.dtype]))
    kernel.pack(gate, up, down, blob, pool)
    return blob


def packed_nbytes(backend: str, experts: LayerExperts, requested: str | None = None) -> int:
    """Bytes of the packed copy make_backend(requested or backend, ...) makes of this layer: 0 when it reads a
    quantized layer's blocks in place."""
    if reads_blocks(requested or backend, backend, experts):
        return 0
    E, I, H = experts.gate_proj.shape  # gate_proj [E, I, H]
    return packed_nbytes_for(backend, E, I, H, experts.gate_proj.dtype)  # quantized experts: packed from float32


def packed_nbytes_for(backend: str, E: int, I: int, H: int, dtype: torch.dtype) -> int:
    """Bytes of one layer packed for `backend` from experts of `dtype` (engine.model_info's RAM estimate uses this)."""
    if dtype not in _DTYPES:
        raise TesseraError("experts", f"dtype {dtype} cannot be packed (expected float32, float16 or bfloat16)")
    return int(_native.backend(backend).packed_bytes(E, H, I, _DTYPES[dtype]))


def widened_layer_nbytes(E: int, I: int, H: int) -> int:
    """Bytes of one quantized layer's float32 copy (gate, up, down) that pack_layer holds while it packs it: the
    transient engine.model_info's estimate and `_widening_notice` both add."""
    return 3 * E * I * H * 4


@functools.lru_cache(maxsize=1)
def _native_build() -> str:
    """SHA-256 of the compiled extension: compile-time packing constants (the AMX int8 group) change with it."""
    h = hashlib.sha256()
    with open(_native.__file__, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def packing_identity(backend: str) -> dict:
    """Everything besides the weights that changes a layer's packed bytes: part of the packed-weight cache key."""
    return {"backend": backend, "layout": layout_version(), "build": _native_build(), "knobs": packing_knobs(backend)}


def _packed_as_keyed(backend: str, blob: np.ndarray, identity: dict) -> bool:
    """The group the AVX512Int8 blob was packed with (read once by the native code) is the one in its key."""
    if backend != "AVX512Int8":
        return True
    group = int(np.frombuffer(blob[_PACKED_HEADER_BYTES : _PACKED_HEADER_BYTES + 8].tobytes(), dtype="<i8")[0])
    return group == identity["knobs"]["int8_group"]


def _check_dims(backend: str, blob: np.ndarray, experts: LayerExperts) -> None:
    E, I, H = experts.gate_proj.shape
    dims = tuple(int(v) for v in _native.backend(backend).packed_dims(blob))
    if dims != (E, H, I):
        raise ValueError(f"packed for E, H, I = {dims}, the model has {(E, H, I)}")


@dataclass
class LoadStats:
    seconds: float = 0.0
    packed_layers: int = 0  # packed now (cold)
    cached_layers: int = 0  # memory-mapped from the disk cache (warm)
    in_place_layers: int = 0  # quantized GGUF experts read as the file's blocks: neither packed nor cached
    packed_bytes: int = 0  # bytes of packed copies (0 for layers read in place)
    cache_dir: str = ""
    quant_isa: str = ""  # the block kernels' ISA when some layer is read in place ("amx_int8", "avx512_vnni", ...)
    per_layer: dict[int, str] = field(default_factory=dict)  # layer -> "packed" | "cached" | "in place"
    digests_reused: int = 0  # layer digests (cache keys) taken from engine.source_digest's record, not computed
    notices: list[str] = field(default_factory=list)  # one-line notices: the packed-weight cache's, what widening costs


# ------------------------------------------------------------------------------------------- quantized layers: in place
# A quantized GGUF's routed experts are read as the file's blocks (engine.quantized.QuantizedTensor: views of the
# memory map) by the block kernels below, with no packed copy and no disk cache, on every backend except the bf16 ones
# that have an int8 twin when a user names them: they were asked for bf16 weights, so they widen, after saying what it
# costs and refusing when it will not fit (`_widening_notice`). Running those on the blocks too would make the name
# mean nothing: AVX512 and AVX512Int8 would be the same kernels. AVX2 has no int8 twin; its quantized form is the avx2
# block kernels. "Auto" always reads in place. The rule is `reads_blocks`; engine.model_info sizes loads with it.

WIDENING_BACKENDS = {"AVX512": "AVX512Int8", "AMXBF16": "AMXInt8", "AMXBF16-emulated": "AMXInt8-emulated"}


@functools.lru_cache(maxsize=1)
def _block_kernel_types() -> frozenset[str]:
    return frozenset(str(t["name"]) for t in _native.quant_types())


def has_block_kernel(type_name: str) -> bool:
    """Whether the block kernels read GGML type `type_name` ("Q4_K") in place."""
    return type_name.upper() in _block_kernel_types()


def reads_quantized_in_place(requested: str, concrete: str) -> bool:
    """Whether backend `requested` (resolved to `concrete`) reads quantized experts as blocks rather than widening."""
    return requested == AUTO or concrete not in WIDENING_BACKENDS


def reads_blocks(requested: str, concrete: str, experts: LayerExperts) -> bool:
    """Whether make_backend(requested) runs this layer on the file's blocks in place: a quantized layer, a backend that
    reads blocks, and a block kernel for each of its three types (llama-quantize's fallbacks Q5_0, Q5_1, IQ4_NL have
    none: such a layer is widened and packed)."""
    projs = (experts.gate_proj, experts.up_proj, experts.down_proj)
    return (is_quantized(experts) and reads_quantized_in_place(requested, concrete)
            and all(isinstance(t, QuantizedTensor) and has_block_kernel(t.qtype.name) for t in projs))


class PackedLayer:
    """One layer packed for a native backend: a 64-byte-aligned blob, packed now or read from the disk cache."""

    def __init__(self, kernel, blob: np.ndarray):
        self.kernel, self.blob = kernel, blob
        self.nbytes = int(blob.nbytes)
        # The same blob for a decode step that runs the whole layer (and the stack every layer) in one call
        # (engine.decode_layer): the backend's own forward, called from native code.
        self.decode = _native.PackedMoeLayer(kernel.name, blob)

    def forward(self, ids, w, x, out, pool) -> None:
        self.kernel.forward(self.blob, ids, w, x, out, pool)

    def submit(self, ids, w, x, out, pool) -> None:
        self.kernel.forward_submit(self.blob, ids, w, x, out, pool)


class BlockLayer:
    """One layer of quantized GGUF experts read in place: gate, up [E, I, row_bytes(H)] and down [E, H, row_bytes(I)]
    uint8 views of the file with a GGML type each, run by the block kernels of `isa` (docs/INTERFACES.md, "Quantized
    weights"). Holds no copy. The block scales were checked for NaN/Inf when the loader read the file
    (engine.weights: check_scales on every quantized tensor), so they are not scanned again here."""

    nbytes = 0  # no packed copy

    def __init__(self, experts: LayerExperts, isa: str):
        g, u, d = experts.gate_proj, experts.up_proj, experts.down_proj
        self.types = (int(g.qtype), int(u.qtype), int(d.qtype))
        self.raw = (g.raw, u.raw, d.raw)  # [E, I, B], [E, I, B], [E, H, B] uint8
        self.isa = isa
        # The same experts for a decode step that runs the whole layer in one call (engine.decode_layer).
        (tg, tu, td), H = self.types, d.raw.shape[1]
        self.decode = _native.QuantMoeLayer(H, tg, g.raw, tu, u.raw, td, d.raw, isa)

    def _args(self, ids, w, x, out, pool):
        (tg, tu, td), (g, u, d) = self.types, self.raw
        return tg, g, tu, u, td, d, ids, w, x, out, pool, self.isa

    def forward(self, ids, w, x, out, pool) -> None:
        _native.quant_moe_forward(*self._args(ids, w, x, out, pool))

    def submit(self, ids, w, x, out, pool) -> None:
        _native.quant_moe_forward_submit(*self._args(ids, w, x, out, pool))


def free_ram() -> int:
    """Bytes the OS can give this process now without swapping (psutil's `available`: free plus reclaimable cache)."""
    import psutil

    return int(psutil.virtual_memory().available)


def _widening_notice(requested: str, concrete: str, layers: dict[int, LayerExperts], widen: list[int]) -> str:
    """What widening these quantized layers costs, in one line, said before anything is widened; a TesseraError naming
    the backend when the packed copy plus the float32 copy of one layer (packing's transient) exceeds free RAM."""
    from tessera.engine import backends

    packed = transient = 0
    types: set[str] = set()
    for layer in widen:
        le = layers[layer]
        E, I, H = le.gate_proj.shape  # gate_proj [E, I, H]
        packed += packed_nbytes_for(concrete, E, I, H, torch.float32)
        transient = max(transient, widened_layer_nbytes(E, I, H))
        types |= {t.qtype.name for t in (le.gate_proj, le.up_proj, le.down_proj) if isinstance(t, QuantizedTensor)}
    kept = {b["name"]: b["weights"] for b in backends.compiled()}.get(concrete, "")
    kept = "float32" if kept == "as loaded" else kept
    what = f"this file's {'/'.join(sorted(types))} experts ({len(widen)} layers)"
    if reads_quantized_in_place(requested, concrete):
        why = f"no block kernel reads {'/'.join(sorted(t for t in types if not has_block_kernel(t)))}"
        instead = "a file quantized to " + ", ".join(sorted(_block_kernel_types())) + " is read in place"
    else:
        twin = WIDENING_BACKENDS[concrete]
        twin_ok = twin in backends.available_names(include_emulated=True)
        why = "it keeps bf16 weights"
        instead = (f"choose {twin} or Auto, which read the blocks in place" if twin_ok
                   else "choose Auto, which reads the blocks in place")
    free = free_ram()
    cost = (f"widens {what} to {packed / 1e9:.2f} GB of packed {kept} (+{transient / 1e9:.2f} GB while packing a "
            f"layer; {why}); {free / 1e9:.2f} GB are free")
    if packed + transient > free:
        raise TesseraError(f"backend {concrete}", f"{cost}: {instead}")
    return f"backend {concrete} {cost}; {instead}"


def _check_room_to_pack(concrete: str, fresh: list[LayerExperts], sizes: list[int]) -> None:
    """Refuses (NotEnoughMemoryError, before anything is packed) when the packs this load makes in RAM, `sizes` of the
    layers the packed-weight cache does not hold (those it holds are mapped from it), exceed the RAM free now: a BF16
    file's experts packed beside a backend still loaded (Session.set_backend) could otherwise outgrow RAM half-way,
    and the OS would kill the app with the chat. (Quantized experts widened: `_widening_notice`.)"""
    if not fresh:
        return
    need, free = sum(sizes), free_ram()
    if need <= free:
        return
    kinds = sorted({str(t.qtype.name if isinstance(t, QuantizedTensor) else t.dtype).replace("torch.", "")
                    for e in fresh for t in (e.gate_proj, e.up_proj, e.down_proj)})
    hint = (f"; {WIDENING_BACKENDS[concrete]} packs them into about half of that" if concrete in WIDENING_BACKENDS
            else "; close other programs, or use a quantized file (Q8_0, Q4_K_M...: read in place, never packed)")
    shortfall = (f"packing {len(fresh)} layers of {'/'.join(kinds)} experts takes {need / 1e9:.2f} GB of RAM and "
                 f"{free / 1e9:.2f} GB are free")
    raise NotEnoughMemoryError(f"backend {concrete}", shortfall + hint, shortfall)


# --------------------------------------------------------------------------------------------------------- the backend


class NativeExperts(ExpertBackend):
    """An `ExpertBackend` running every MoE layer through native kernels on its own thread pool: each layer is a
    `PackedLayer` (the backend's packed copy) or a `BlockLayer` (a quantized file's blocks, read in place)."""

    def __init__(self, name: str, reason: str, layers: dict[int, PackedLayer | BlockLayer], pool, stats: LoadStats,
                 stores: PackStores | None = None):
        self.name = name
        self.reason = reason
        self.layers = layers
        self.pool = pool
        self.threads = pool.size
        self.load_stats = stats
        self.stores = stores  # the load's pack-cache writes, maybe still running (make_backend's store_in_background)
        self._pending: tuple | None = None

    def close(self, finish_writes: bool = True) -> None:
        """Finishes the pack-cache writes of this load still running (engine.pack_store), or leaves them running
        (`finish_writes=False`: a backend switched, PackStores.detach)."""
        if self.stores is None:
            return
        if finish_writes:
            self.stores.finish("closing the model")
        else:
            self.stores.detach()

    def _args(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        if layer not in self.layers:
            raise KeyError(f"layer {layer} has no experts in backend {self.name}")
        x = x.detach().to(torch.float32).contiguous()  # [T, H]
        ids = topk_ids.detach().to(torch.int64).contiguous()  # [T, k]
        w = topk_weights.detach().to(torch.float32).contiguous()  # [T, k]
        out = torch.empty_like(x)  # [T, H]
        return ids, w, x, out

    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        ids, w, x, out = self._args(layer, x, topk_ids, topk_weights)
        self.layers[layer].forward(ids, w, x, out, self.pool)
        return out

    def submit(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
        """Starts forward on the pool and returns at once (overlap with GPU work); `sync()` returns the output. Both
        kinds of layer run asynchronously (kernel.forward_submit, quant_moe_forward_submit)."""
        if self._pending is not None:
            raise RuntimeError("NativeExperts.submit: call sync() before the next submit")
        args = self._args(layer, x, topk_ids, topk_weights)
        self.layers[layer].submit(*args, self.pool)
        self._pending = args  # keeps the tensors alive until sync

    def decode_experts(self, layer: int):
        if layer not in self.layers:
            raise KeyError(f"layer {layer} has no experts in backend {self.name}")
        return self.layers[layer].decode

    def sync(self) -> torch.Tensor:
        if self._pending is None:
            raise RuntimeError("NativeExperts.sync: nothing submitted")
        out = self._pending[3]
        try:
            self.pool.sync()
        finally:
            self._pending = None
        return out


def make_backend(
    name: str,
    layers: dict[int, LayerExperts],
    *,
    threads: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    model_id: str | None = None,
    progress: Callable[[ProgressEvent], None] | None = None,
    sources: Sequence[SourceFile] = (),
    store_in_background: bool = False,
):
    """Readies `layers` for backend `name` (resolved by engine.backends.resolve: "Auto" picks, "Torch" gives
    TorchExperts) and returns an ExpertBackend.

    A quantized GGUF layer is read in place when `reads_blocks` says so: nothing packed, nothing cached, the block
    kernels of `quant_isa_for_backend`. Other layers are packed; with `cache_dir` and `model_id` (how `tessera-cli cache
    list` names the model: its path) through the disk cache of engine.pack_cache: keyed by the content of each layer and
    every packing parameter, verified before use, repacked when damaged, skipped when the folder cannot be written, kept
    to a budget. `sources`: the mapped file parts the layers are views of; an unchanged file's layer digests (the
    keys' content part) come from engine.source_digest's record instead of hashing the experts again. A layer read
    through those maps (hashed, packed) gives its pages back to the kernel afterwards (engine.expert_pages). The
    cache's writes run on a thread beside the packing; `store_in_background`: the backend is returned before they are
    all done (engine.pack_store: closing it, or the end of the process, finishes them), and a file version whose
    digests are not recorded yet is packed first and hashed there, behind the load (engine.deferred_keys). Quantized
    layers that must be widened first are sized against free RAM before any is widened (`_widening_notice`: a
    notice, or a TesseraError when they will not fit).
    Raises BackendUnavailableError ("backend AMXInt8: CPU lacks amx_int8") for a backend that cannot run here.
    """
    concrete, reason = resolve(name)
    if concrete == TORCH:
        return TorchExperts(layers, reason=reason)
    t0 = time.perf_counter()
    order = sorted(layers)
    in_place = {layer for layer in order if reads_blocks(name, concrete, layers[layer])}
    to_pack = [layer for layer in order if layer not in in_place]
    widen = [layer for layer in to_pack if is_quantized(layers[layer])]
    notices = [_widening_notice(name, concrete, layers, widen)] if widen else []  # raises before anything is held
    pool = make_pool(threads)
    stats = LoadStats(cache_dir=str(cache_dir or ""), notices=notices)
    if in_place:
        stats.quant_isa = quant_isa_for_backend(concrete)
    if progress is not None and notices:
        progress(ProgressEvent("pack", 0, len(order), notices[0]))
    cache = PackCache(cache_dir) if cache_dir is not None and model_id is not None and to_pack else None
    sizes = {layer: packed_nbytes(concrete, layers[layer], name) for layer in to_pack}
    keys: dict[int, str] = {}
    later: list[tuple[LayerExperts, np.ndarray, bool]] | None = None  # a new file version: keyed behind the load
    if cache is not None and cache.usable:
        identity = packing_identity(concrete)
        digests = DigestRecord(cache.root / SOURCES_FOLDER, sources)
        if store_in_background and new_file_version([layers[layer] for layer in to_pack], digests):
            later = []  # engine.deferred_keys: pack now, hash and store afterwards
        else:
            def hashed(experts: LayerExperts) -> bytes:  # read through the map once: its pages go back
                digest = layer_digest(experts, pool.size)
                release_experts(experts, sources)
                return digest

            for layer in to_pack:
                keys[layer] = layer_key(identity, layers[layer],
                                        digests.digest(layers[layer], functools.partial(hashed, layers[layer])))
            digests.save()
            stats.digests_reused = digests.reused
    fresh = [layer for layer in to_pack if not (layer in keys and cache.layer_path(keys[layer]).is_file())]
    _check_room_to_pack(concrete, [layers[layer] for layer in fresh], [sizes[layer] for layer in fresh])
    if keys:  # only once this load will go on: make_room may evict other models' packs
        cache.make_room([keys[layer] for layer in to_pack], [sizes[layer] for layer in to_pack], model_id, concrete)
    kernel = _native.backend(concrete)
    ready: dict[int, PackedLayer | BlockLayer] = {}
    stores = PackStores(cache) if cache is not None else None  # the disk beside the packing (engine.pack_store)
    # a cold file's next layers from disk while this one packs (nothing hashed them first)
    ahead = read_ahead_experts([layers[layer] for layer in to_pack], sources) if later is not None else None
    try:
        for n, layer in enumerate(order):
            experts = layers[layer]
            if layer in in_place:
                ready[layer] = BlockLayer(experts, stats.quant_isa)
                stats.in_place_layers += 1
                stats.per_layer[layer] = "in place"
            else:
                blob = None
                if layer in keys:
                    blob = cache.load(keys[layer], sizes[layer], lambda b, e=experts: _check_dims(concrete, b, e),
                                      what=f"layer {layer}", workers=pool.size)
                if blob is not None:
                    stats.cached_layers += 1
                    stats.per_layer[layer] = "cached"
                else:
                    populate_experts(experts, sources)  # one call maps what the digest read and gave back
                    blob = pack_layer(concrete, experts, pool)
                    release_experts(experts, sources)  # packed: the file's pages of it are not read again
                    if layer in keys and _packed_as_keyed(concrete, blob, identity):
                        stores.submit(keys[layer], blob)
                    elif later is not None:
                        later.append((experts, blob, _packed_as_keyed(concrete, blob, identity)))
                    stats.packed_layers += 1
                    stats.per_layer[layer] = "packed"
                ready[layer] = PackedLayer(kernel, blob)
            stats.packed_bytes += ready[layer].nbytes
            if progress is not None:
                what = f"{concrete}: layer {layer} {stats.per_layer[layer]}"
                progress(ProgressEvent("pack", n + 1, len(order), what))
    except BaseException:
        if stores is not None:  # a load stopped half-way (an error, a cancel) drops the writes not started
            stores.drop()
        raise
    finally:
        if ahead is not None:
            ahead.stop()
    if later:
        job = KeyThenStore(cache, digests, identity, sources, later, model_id, concrete, pool.size)
        stores.submit_job(job, job.nbytes(), job.hash_bytes())  # it records the model's keys once it has them
    if stores is not None:
        if not store_in_background:
            stores.wait()
        if not later:
            cache.record(model_id, concrete, [keys[layer] for layer in to_pack if layer in keys])
        stats.notices += list(cache.notices)
    stats.seconds = time.perf_counter() - t0
    return NativeExperts(concrete, reason, ready, pool, stats, stores)


# ------------------------------------------------------------------------------------ quantized GGUF kernels (issue 12)
# Weights stay in the file's block layout (uint8 rows, e.g. a memory-mapped GGUF tensor): see docs/INTERFACES.md,
# "Quantized weights". qtype: a gguf GGMLQuantizationType, its int id, or its name ("Q4_K", "q4_k").

QUANT_ISAS = ("amx_int8", "avx512_vnni", "avx2", "reference")  # best first; amx_int8_emu (tests only) is never chosen


def _qtype_id(qtype, arg: str = "qtype") -> int:
    if isinstance(qtype, str):
        from gguf.constants import GGMLQuantizationType

        try:
            return int(GGMLQuantizationType[qtype.upper()])
        except KeyError:
            raise ValueError(f"{arg}: unknown GGML type name {qtype!r}") from None
    return int(qtype)


def quant_types() -> list[dict]:
    """Types the quantized kernels read: [{id, name, block, type_size}] (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS)."""
    return list(_native.quant_types())


def quant_isas() -> list[dict]:
    """Quantized-kernel ISAs, best first: [{name, available, reason, avx_vnni, gemm_min_tokens}] under TESSERA_MAX_ISA;
    gemm_min_tokens = {type name: token blocks from this long run the ISA's prefill GEMM (0: it has none)}; avx_vnni:
    the ISA's prefill GEMM forms its dots with AVX-VNNI's vpdpbusd (avx2 only, where the CPU has it and the avx_vnni
    knob is 1; the same results as vpmaddubsw)."""
    return list(_native.quant_isas())


def quant_isa_for_backend(backend: str) -> str:
    """The quantized ISA an expert backend runs: AMX* -> amx_int8 (AVX-512 VNNI decode, the prefill GEMM on AMX int8
    tiles), AVX512* -> avx512_vnni, AVX2 -> avx2, Reference -> reference; the best available one at or below the
    backend's level (TESSERA_MAX_ISA=avx512 or a CPU without AMX: avx512_vnni)."""
    from tessera.engine import backends

    concrete, _ = resolve(backend)
    level = {b["name"]: b["isa_level"] for b in backends.compiled()}.get(concrete, "reference")
    order = {"amx": QUANT_ISAS, "avx512": QUANT_ISAS[1:], "avx2": QUANT_ISAS[2:]}.get(level, QUANT_ISAS[3:])
    available = {i["name"] for i in quant_isas() if i["available"]}
    return next(i for i in order if i in available)


def quant_isa_for_dense(backend: str) -> str:
    """The quantized ISA of the dense layers beside expert backend `backend` (engine.dense.set_quant_isa): the
    backend's own where it is a native one (so AVX512Int8 keeps avx512_vnni on an AMX CPU), else (Torch) "auto"."""
    from tessera.engine import backends

    concrete, _ = resolve(backend)
    return quant_isa_for_backend(concrete) if concrete in {b["name"] for b in backends.compiled()} else "auto"


def quant_row_bytes(qtype, K: int) -> int:
    """Bytes of one row of K values; ValueError when K is not a whole number of the type's blocks."""
    return int(_native.quant_row_bytes(_qtype_id(qtype), int(K)))


def quant_dequantize(qtype, w, out, pool) -> None:
    """out[rows, K] f32 = the exact values of w[rows, row_bytes] uint8 (bit-identical to gguf.quants.dequantize)."""
    _native.quant_dequantize(_qtype_id(qtype), w, out, pool)


def quant_validate(qtype, w, name: str, pool) -> None:
    """Raises ValueError("tensor NAME: row R, block B has a non-finite scale d (NaN or Inf); ...") for the first block
    of w [..., row_bytes] uint8 whose f16 scale (d, or dmin) is not finite; returns None when all are."""
    _native.quant_validate(_qtype_id(qtype), w, str(name), pool)


def quant_matmul(qtype, w, x, out, pool, isa: str = "auto") -> None:
    """out[T, N] = x[T, K] @ W[N, K].T with W given as its quantized rows w[N, row_bytes] uint8 (read in place),
    x and out float32 C-contiguous (out overwritten). isa: auto | amx_int8 | avx512_vnni | avx2 | reference, or
    amx_int8_emu (amx_int8's tile GEMM on the tile emulator, for tests on CPUs without AMX; never chosen by auto)."""
    _native.quant_matmul(_qtype_id(qtype), w, x, out, pool, isa)


def quant_matvec_multi(x, qtypes, ws, outs, pool, isa: str = "auto") -> None:
    """One token through several quantized weights that share it: outs[i][1, N_i] = x[1, K] @ W_i[N_i, K].T for
    ws[i] [N_i, row_bytes] uint8 of GGML type qtypes[i], x quantized once and every row group in one pool dispatch;
    equal to quant_matmul per weight, bit for bit (x and outs float32 C-contiguous, outs overwritten)."""
    _native.quant_matvec_multi(x, [_qtype_id(t, f"qtypes[{i}]") for i, t in enumerate(qtypes)], list(ws), list(outs),
                               pool, isa)


def quant_matmul_multi(x, qtypes, ws, outs, pool, isa: str = "auto") -> None:
    """T tokens through several quantized weights that share them (a layer's q/k/v projections at prefill):
    outs[i][T, N_i] = x[T, K] @ W_i[N_i, K].T for ws[i] [N_i, row_bytes] uint8 of GGML type qtypes[i], x quantized
    once (and packed for the GEMM once per packing) and every row group in one pool dispatch; equal to quant_matmul
    per weight, bit for bit (x and outs float32 C-contiguous, outs overwritten)."""
    _native.quant_matmul_multi(x, [_qtype_id(t, f"qtypes[{i}]") for i, t in enumerate(qtypes)], list(ws), list(outs),
                               pool, isa)


def decode_layer_plan(H: int, nh: int, nkv: int, hd: int, eps: float, input_norm, post_norm, q_norm, k_norm,
                      weights, router, top_k: int, norm_topk: bool, isa: str = "auto"):
    """A decoder layer's fixed parts for one-token steps in one native call (native/src/decode_layer.cpp; used by
    engine.decode_layer): norms f32 [H], [H], [hd], [hd]; `weights` the (type, array) of q, k, v, o_proj and `router`
    that of the router (None for a dense-MLP layer), each (GGML type id, raw rows [N, row_bytes] uint8) or (-1, a
    float32/bfloat16/float16 [N, K] tensor). Its `step(x, cos, sin, kt, v, start, h, normed, ids, weights, experts,
    out, pool, k_scales=None, v_scales=None)` runs the layer (a q8_0 cache: kt, v its int8 keys and values, and
    their scales); it keeps every array it was given alive."""
    return _native.DecodeLayer(H, nh, nkv, hd, eps, input_norm, post_norm, q_norm, k_norm,
                               list(weights), router,
                               top_k, norm_topk, isa)


def decode_stack_step(plans, experts, x, cos, sin, kts, vs, start: int, ids, weights, counts, out, pool,
                      kss=None, vss=None) -> None:
    """One token through consecutive MoE layers in one call (engine.decode_layer.DecodeStack): `plans` their
    decode_layer_plan objects, `experts` their QuantMoeLayer or PackedMoeLayer (ExpertBackend.decode_experts),
    `kts`/`vs` their cache buffers; layer i reads layer i-1's output. Overwrites ids int64 [L, k], weights f32 [L, k],
    counts int64 [L, E] (tokens routed to each expert) and out f32 [1, H] (the last layer's output). A q8_0 cache:
    `kts`/`vs` its int8 keys and values, `kss`/`vss` their float16 scales."""
    _native.decode_stack_step(plans, experts, x, cos, sin, kts, vs, start, ids, weights, counts, out, pool, kss, vss)


def decode_profile(reset: bool = False) -> dict:
    """TESSERA_PROFILE's timers inside the native decode step (native/include/tessera/step_profile.h), summed since the
    last reset: {"enabled", "steps", "step_ms", "threads", "phases": {name: {"wall_ms", "marks", "dispatches",
    "busy_ms" [per pool thread, 0 = the caller], "tail_ms", "wake_ms", "joined", "sleeps"}}}. With TESSERA_PROFILE unset
    when the module was first used, "enabled" is False and nothing is counted (the timers cost nothing then)."""
    return dict(_native.decode_profile(bool(reset)))


def quant_moe_forward(gate_type, gate, up_type, up, down_type, down, expert_ids, weights, x, out, pool,
                      isa: str = "auto") -> None:
    """Routed experts on quantized weights, `forward`'s contract: gate, up [E, I, row_bytes(H)] and down
    [E, H, row_bytes(I)] uint8 as stored in the GGUF (ffn_{gate,up,down}_exps), each with its own type;
    expert_ids [T, k] int64 (-1 = skip), weights [T, k] f32, x [T, H] f32, out [T, H] f32 (overwritten)."""
    _native.quant_moe_forward(_qtype_id(gate_type, "gate_type"), gate, _qtype_id(up_type, "up_type"), up,
                              _qtype_id(down_type, "down_type"), down, expert_ids, weights, x, out, pool, isa)
