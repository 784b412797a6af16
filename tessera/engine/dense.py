"""Dense (non-expert) linear layers with their weights kept as stored.

`Linear(weight, device)` holds one `[out, in]` weight (the nn.Linear layout) and maps `x[T, in]` f32 to `[T, out]` f32.
Where the computation happens is chosen here, never in the model:

- float32 weights: kept f32, `x @ w.T` in torch (bit-for-bit what the model always did; the oracle tests rely on it),
  unless every value is a bfloat16 value (GGUF files store a bf16 model's routers as f32): those are stored as bf16,
  losslessly, and take the native path, so a bf16 model gives the same logits from a GGUF and from its HF folder.
- bfloat16 / float16 weights on the CPU: kept 16-bit (half the bytes of an f32 copy, and no f32 copy is ever held);
  the native mat-vec (`engine.native.dense_matvec`) reads each weight once per call, widens it exactly to f32 and
  accumulates in f32 on the native thread pool. Measured on the development machine (docs/BENCHMARKS.md): it beats
  torch on an f32 copy made per call at every T from 1 to 512 (and an f32 copy kept resident for T <= 16), so it is
  used up to `NATIVE_MAX_TOKENS` tokens (TESSERA_DENSE_NATIVE_MAX_T overrides); beyond that torch runs on an f32
  upcast made per call. Exception, the prefill GEMM: bf16 weights on a CPU with avx512_bf16 take
  `engine.native.dense_gemm_bf16` from `GEMM_MIN_TOKENS` tokens on, at any T (the activations rounded once to bf16,
  as llama.cpp and torch's bf16 matmul do; exact products, f32 sums in vdpbf16ps; each weight read once per call),
  2-4x faster than the mat-vec at T=128..512 on the development machine (docs/BENCHMARKS.md,
  scripts/bench_bf16_prefill.py); where AMX is granted its products run on bf16 tiles from 32 tokens on, another
  4-6.6x (AMX Xeon, 2 cores: ~1.0-1.4 TFLOP/s against ~0.2 at T=64..2048; docs/BENCHMARKS.md, session 20).
  Every other 16-bit case (bf16 weights without avx512_bf16, i.e. AVX2-only CPUs, and f16 weights everywhere) takes
  `engine.native.dense_gemm_f32` from `GEMM_MIN_TOKENS` tokens on, at any T: each weight widened exactly to f32 once
  per call, x kept f32, an FMA register tile (AVX2): 185-200 GFLOP/s on two cores at T >= 64 against the mat-vec's
  69-174 (AMX Xeon running AVX2 code; docs/BENCHMARKS.md, session 21).
- GGUF block-quantized weights (engine.quantized.QuantizedMatrix: Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS) on the CPU:
  kept as the file's blocks, never widened whole; `engine.native.quant_matmul` multiplies them in place (activations
  to int8 per 256 values, integer dots, f32 scales) on the same native pool, for every T up to `QUANT_NATIVE_MAX_TOKENS`
  (TESSERA_DENSE_QUANT_MAX_T overrides). Measured on the 2-core development machine (docs/BENCHMARKS.md,
  scripts/bench_quant_dense.py; Q4_K, Q6_K, Q8_0 on the 30B-A3B attention and lm_head shapes): it beats
  dequantize-per-call + torch 2-60x at T=1 and 2-9x at T=16; from T=128 on the two are within 0.6-1.7x of each other
  either way (its cost grows linearly with T: each token is a mat-vec), and end to end a 512-token prefill of a
  4-layer 30B-A3B-shaped Q4_K_M file ran at 184-204 tok/s with every call on the blocks vs 191-207 tok/s widening per
  call above 128 or 256 tokens: no measurable gain, so the blocks serve every call up to the prefill chunk
  (generate.PREFILL_CHUNK, 2048 tokens: no call the model makes holds an f32 copy; at 4096 tokens in one call,
  widening per call took 3.2 s of a 4-layer prefill against 1.3 s on the blocks, AMX Xeon). A longer call (a
  caller's own, e.g. teacher forcing) dequantizes `WIDEN_ROWS` rows at a time for torch's GEMM.
- any weight on a CUDA device (hybrid placement): torch on that device in the weight's dtype; a QuantizedMatrix is
  widened once, at construction, to bf16 on that device (a few rows at a time: no f32 copy of it is ever made).

Letters: T tokens, K input features, N output features.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

from tessera.engine import native
from tessera.engine.errors import TesseraError
from tessera.engine.quantized import QuantizedMatrix

NATIVE_DTYPES = (torch.bfloat16, torch.float16)


NATIVE_MAX_TOKENS = int(native.tuning()["dense_native_max_tokens"])  # TESSERA_DENSE_NATIVE_MAX_T, default 512
NATIVE_PATHS = ("native", "native-quant")  # the paths that run on the dense pool


GEMM_AVAILABLE = native.dense_gemm_bf16_available()  # avx512_bf16 under the TESSERA_MAX_ISA cap
GEMM_F32_AVAILABLE = native.dense_gemm_f32_available()  # avx2/fma/f16c under the cap: the widening GEMM
GEMM_MIN_TOKENS = 16  # 16-bit weights from this many tokens on: a GEMM, not the mat-vec (docs/BENCHMARKS.md)


QUANT_NATIVE_MAX_TOKENS = int(native.tuning()["dense_quant_max_tokens"])  # TESSERA_DENSE_QUANT_MAX_T, default 2048
WIDEN_ROWS = 4096  # rows of a quantized weight widened at a time beyond QUANT_NATIVE_MAX_TOKENS

# The quantized ISA of the dense layers' block kernels (engine.native.quant_isa_for_dense of the session's expert
# backend: AVX512Int8 keeps avx512_vnni on an AMX CPU, AMXInt8 takes the AMX tiles); "auto" (the best this CPU runs
# under TESSERA_MAX_ISA) until a Session sets it. Process-wide, read at every call: one model is loaded at a time.
_quant_isa = "auto"


def set_quant_isa(isa: str) -> None:
    global _quant_isa
    _quant_isa = isa


def quant_isa() -> str:
    return _quant_isa

_pools: dict[int, object] = {}
_pools_lock = threading.Lock()


def dense_pool(threads: int | None = None):
    """The native thread pool of the dense layers, one per thread count (default: torch's thread count, which
    `--threads` sets), shared by every Linear. Separate from the expert backend's pool so a submitted expert job
    (hybrid overlap) never waits on a dense call, or the reverse."""
    n = max(1, int(threads or torch.get_num_threads()))
    with _pools_lock:
        if n not in _pools:
            _pools[n] = native.make_pool(n)
        return _pools[n]


def _bf16_exact(w: torch.Tensor) -> bool:
    """Whether every value of the f32 tensor `w` is a bfloat16 value (so bf16 storage loses nothing)."""
    return not bool((w.contiguous().view(torch.int32) & 0xFFFF).any())  # the low 16 bits a bf16 value lacks


class Linear:
    """y = x @ weight.T for one stored weight `[N, K]`; `name` names it in errors."""

    def __init__(self, weight: torch.Tensor | QuantizedMatrix, device: torch.device | str = "cpu",
                 name: str = "weight"):
        if isinstance(weight, QuantizedMatrix):
            self._init_quantized(weight, torch.device(device), name)
            return
        if weight.dim() != 2:
            raise TesseraError(f"tensor {name}", f"expected a 2-D [out, in] weight, got shape {list(weight.shape)}")
        if weight.dtype not in (torch.float32, *NATIVE_DTYPES):
            raise TesseraError(f"tensor {name}", f"dtype {weight.dtype} is not float32, bfloat16 or float16")
        self.name = name
        self.device = torch.device(device)
        on_cpu = self.device.type == "cpu"
        if on_cpu and weight.dtype == torch.float32 and _bf16_exact(weight):
            weight = weight.to(torch.bfloat16)  # lossless: GGUF keeps e.g. a bf16 model's routers as f32
        self.weight = weight.to(device=self.device).contiguous()  # [N, K] as stored (a no-op for CPU tensors)
        self.out_features, self.in_features = self.weight.shape
        self.path = (
            "torch-f32" if self.weight.dtype == torch.float32
            else "native" if on_cpu
            else "torch-device"
        )
        self._pool = dense_pool() if self.path == "native" else None
        self._gemm = self.path == "native" and self.weight.dtype == torch.bfloat16 and GEMM_AVAILABLE
        self._gemm_f32 = self.path == "native" and not self._gemm and GEMM_F32_AVAILABLE

    def _init_quantized(self, weight: QuantizedMatrix, device: torch.device, name: str) -> None:
        self.name, self.device = name, device
        self.out_features, self.in_features = weight.shape
        if device.type == "cpu":
            self.weight, self.path = weight, "native-quant"  # the file's blocks, read in place
        else:  # one bf16 copy on the device, widened a chunk of rows at a time
            self.weight, self.path = weight.widen(torch.bfloat16, device, dense_pool()), "torch-device"
        self._threads = max(1, torch.get_num_threads())  # dense_pool()'s thread count
        self._pool = dense_pool(self._threads) if self.path == "native-quant" else None

    def _quant(self, x: torch.Tensor) -> torch.Tensor:  # x [T, K] -> [T, N] f32, on the blocks
        x = x.to(torch.float32).contiguous()  # [T, K]
        out = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)  # [T, N]
        if x.shape[0] > QUANT_NATIVE_MAX_TOKENS:  # a long call: torch's GEMM on rows widened per call
            return self._widened_matmul(x, out)
        if x.shape[0]:
            native.quant_matmul(self.weight.qtype, self.weight.raw, x, out, self._pool, _quant_isa)
        return out

    def _widened_matmul(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out[T, N] = x @ W.T with W dequantized WIDEN_ROWS rows at a time into one f32 buffer (at most 32 MB at
        K = 2048), so even the lm_head never has an f32 copy."""
        rows = min(WIDEN_ROWS, self.out_features)
        buf = torch.empty(rows, self.in_features, dtype=torch.float32)  # [rows, K]
        before = torch.get_num_threads()  # a step whose work is native runs torch on one thread (step_torch_threads)
        if before < self._threads:
            torch.set_num_threads(self._threads)  # this GEMM is the heavy work: the dense pool's cores
        try:
            for start in range(0, self.out_features, rows):
                block = self.weight.raw[start : start + rows]  # [n, B]
                n = block.shape[0]
                native.quant_dequantize(self.weight.qtype, block, buf[:n], self._pool)
                out[:, start : start + n] = x @ buf[:n].T  # [T, n]
        finally:
            if before < self._threads:
                torch.set_num_threads(before)
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x [T, K] f32 -> [T, N] f32
        if self.path == "native-quant":
            return self._quant(x)
        if self.path == "torch-f32":
            return x @ self.weight.T  # [T, N]
        if self.path == "torch-device":
            return (x.to(self.weight.dtype) @ self.weight.T).to(torch.float32)  # [T, N]
        if self.path == "native" and x.shape[0] >= GEMM_MIN_TOKENS and (self._gemm or self._gemm_f32):
            x = x.to(torch.float32).contiguous()  # [T, K]
            out = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)  # [T, N]
            (native.dense_gemm_bf16 if self._gemm else native.dense_gemm_f32)(self.weight, x, out, self._pool)
            return out
        if self.path == "native" and 0 < x.shape[0] <= NATIVE_MAX_TOKENS:
            x = x.to(torch.float32).contiguous()  # [T, K]
            out = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)  # [T, N]
            native.dense_matvec(self.weight, x, out, self._pool)
            return out
        return x @ self.weight.to(torch.float32).T  # [T, N]

    @property
    def nbytes(self) -> int:
        """Bytes of the weight as held (a QuantizedMatrix: its blocks)."""
        if isinstance(self.weight, QuantizedMatrix):
            return self.weight.nbytes
        return self.weight.numel() * self.weight.element_size()

    def __repr__(self) -> str:
        kind = self.weight.qtype.name if isinstance(self.weight, QuantizedMatrix) else self.weight.dtype
        return f"Linear({self.name}, {self.out_features}x{self.in_features} {kind}, {self.path})"


class FusedLinears:
    """Several Linears that multiply the same x (a layer's q/k/v projections): when every one is a quantized weight on
    the dense pool (path native-quant), one native call runs them all with x quantized once: at one token (decode)
    `engine.native.quant_matvec_multi`, at 2..QUANT_NATIVE_MAX_TOKENS tokens (prefill)
    `engine.native.quant_matmul_multi` (x also packed for the GEMM once per packing, all row groups in one pool
    dispatch); both bit-identical to calling each Linear. Otherwise (`fused` False, or a longer call) each Linear runs
    as usual. Saves a step two pool dispatches, two activation quantizations (and packings) and two Python calls a
    layer."""

    def __init__(self, linears: Iterable[Linear]):
        self.linears = list(linears)
        first = self.linears[0]
        self.fused = len(self.linears) > 1 and all(
            lin.path == "native-quant" and lin.in_features == first.in_features and lin._pool is first._pool
            for lin in self.linears)
        if self.fused:
            self._qtypes = [lin.weight.qtype for lin in self.linears]
            self._ws = [lin.weight.raw for lin in self.linears]

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:  # x [T, K] f32 -> one [T, N_i] f32 per Linear
        T = x.shape[0]
        if not self.fused or not 0 < T <= QUANT_NATIVE_MAX_TOKENS:
            return [lin(x) for lin in self.linears]
        x = x.to(torch.float32).contiguous()  # [T, K]
        outs = [torch.empty(T, lin.out_features, dtype=torch.float32) for lin in self.linears]  # [T, N_i]
        call = native.quant_matvec_multi if T == 1 else native.quant_matmul_multi
        call(x, self._qtypes, self._ws, outs, self.linears[0]._pool, _quant_isa)
        return outs


# From how many tokens embedding_rows asks the kernel for all of a call's rows before reading any (prefill; decode's
# one row a step gains nothing from it).
ROWS_AHEAD_MIN_TOKENS = 16
_MADV_WILLNEED = 3  # include/uapi/asm-generic/mman-common.h


def _rows_ahead(base: int, row_bytes: int, n_rows: int, ids: torch.Tensor) -> None:
    """madvise(WILLNEED) on the pages of rows `ids` of a table at address `base`: the kernel starts reading those of
    them that are not in the page cache, all at once, and returns. A model's table is a view of the file's map (a BF16
    file's: 622 MB for Qwen3-30B-A3B), populated at load, but on a machine whose page cache cannot hold the file and
    its packed experts the rows a prompt picks may have been dropped since: then the gather below faulted them in one
    at a time (BF16 8 layers on 24 GB, a 128-token prefill of random tokens: ~100 major faults, 70-190 ms of a
    420-670 ms prefill, docs/BENCHMARKS.md session 8). Asked for together, the reads overlap. Cached pages cost a
    lookup each; an error (no madvise, not a map) only costs the speed-up. The rows read are the same either way."""
    from tessera.engine import readahead

    for i in torch.unique(ids).tolist():
        if not 0 <= i < n_rows:
            continue  # the lookup itself says what is wrong with it
        start = base + i * row_bytes
        aligned = start - start % mmap.PAGESIZE
        readahead.madvise(aligned, start + row_bytes - aligned, _MADV_WILLNEED)


def embedding_rows(table: torch.Tensor | QuantizedMatrix, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` [T] of an embedding table [V, H] as float32 [T, H], on the table's device: a QuantizedMatrix
    dequantizes only those rows (exactly gguf.quants.dequantize, on the dense pool); a float table converts the rows
    it picks (exact for f16/bf16). On the CPU, from ROWS_AHEAD_MIN_TOKENS tokens on, the rows' pages are asked for
    first, all at once (`_rows_ahead`)."""
    if isinstance(table, QuantizedMatrix):
        raw = table.raw
        if ids.numel() >= ROWS_AHEAD_MIN_TOKENS and raw.ndim == 2 and raw.flags["C_CONTIGUOUS"]:
            _rows_ahead(raw.ctypes.data, raw.strides[0], raw.shape[0], ids.reshape(-1).cpu())
        return table.rows(ids, dense_pool())  # [T, H]
    if (ids.numel() >= ROWS_AHEAD_MIN_TOKENS and table.device.type == "cpu" and table.dim() == 2
            and table.is_contiguous()):
        _rows_ahead(table.data_ptr(), table.stride(0) * table.element_size(), table.shape[0], ids.reshape(-1).cpu())
    return table[ids.to(table.device)].to(torch.float32)  # [T, H]


def place_table(table: torch.Tensor | QuantizedMatrix, device: torch.device | str) -> torch.Tensor | QuantizedMatrix:
    """An embedding table as a model on `device` holds it: on the CPU as loaded (blocks stay blocks); elsewhere a
    QuantizedMatrix is widened once to bf16 there (a chunk of rows at a time), a tensor moved as it is."""
    device = torch.device(device)
    if isinstance(table, QuantizedMatrix):
        return table if device.type == "cpu" else table.widen(torch.bfloat16, device, dense_pool())
    return table.to(device)


def step_torch_threads(linears: Iterable[Linear], experts) -> int | None:
    """The torch thread count of a forward step, decided once per model (and again when its experts change): 1 when
    the step's heavy work is all native: the routed experts on a native pool (an ExpertBackend with a `pool`), no
    dense weight on a GPU, and >= 90 % of the dense weight bytes on a native path (bf16 mat-vec or quantized blocks;
    GGUF files keep the small routers in f32, which torch multiplies well on one thread). What torch still does then
    (norms, RoPE, attention over the cache, softmax/top-k) is small, and torch's OpenMP team, spinning between its
    parallel regions, takes the cores from the native pools: measured on the 2-core development machine, a 4-layer
    Qwen3-30B-A3B-shaped bf16 model decoded at ~95-120 ms/step with one torch thread vs ~165-180 ms with two, and
    prefilled 128 tokens in ~0.9-1.0 s vs ~1.5-2.9 s. Anything else (f32 models, a GPU, torch experts) gives None:
    torch keeps its thread count."""
    linears = list(linears)
    native_bytes = sum(lin.nbytes for lin in linears if lin.path in NATIVE_PATHS)
    all_native = (
        experts.pool is not None
        and native_bytes > 0
        and native_bytes >= 0.9 * sum(lin.nbytes for lin in linears)
        and not any(lin.path == "torch-device" for lin in linears)
    )
    return 1 if all_native else None


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Runs the block with `n` torch threads (None, or fewer cores than that: as they are); the previous count is
    restored on exit, errors included."""
    before = torch.get_num_threads()
    if n is None or before <= n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
