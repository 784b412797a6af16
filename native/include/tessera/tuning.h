// Every TESSERA_* tuning knob of the native module, read from the environment in ONE place (src/tuning.cpp), once
// per process, before the first kernel runs. Kernels read the fields; none calls getenv itself.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

struct Tuning {
  // TESSERA_MAX_ISA=reference|avx2|avx512|amx: caps dispatch (tests, bug reports). "" = no cap.
  std::string max_isa;
  // TESSERA_INT8_GROUP: AVX512Int8 inputs per weight scale, rounded up to a multiple of 4; 0 = one scale per output
  // channel. Changes the packed bytes, so it is part of the packed-weight cache key (engine.native.packing_knobs).
  int64_t int8_group = 128;
  // TESSERA_PF: how far ahead (bytes) the AVX kernels prefetch weight panels. Atomic (like spin_us and
  // amx_tile_min_rows): a stored calibration (tessera/engine/tuned.py, `tessera-cli tune`) sets it after the environment was
  // read, and the calibration times candidate values in one process.
  std::atomic<int64_t> prefetch_bytes{-1};  // -1: the kernel's default (kKC * 64 in moe_body.inc)
  // TESSERA_SPIN_US: microseconds a pool worker spins after a job before it sleeps.
  std::atomic<int> spin_us{50};
  // TESSERA_PROFILE (set to anything): per forward chunk, wall time of each phase on stderr.
  bool profile = false;
  // TESSERA_DENSE_NATIVE_MAX_T: engine.dense multiplies bf16/f16 weights natively for steps of up to this many tokens
  // (more: torch on an f32 upcast). Read here so every knob has one reader; tessera/engine/dense.py uses it.
  int64_t dense_native_max_tokens = 512;
  int64_t dense_quant_max_tokens = 512;  // TESSERA_DENSE_QUANT_MAX_T: engine.dense, quantized weights on the blocks
  // TESSERA_AVX2_GEMM_MIN_T: on the AVX2 quantized kernels, token blocks of at least this many tokens (2 at least:
  // decode keeps the row tiles) take the GEMM (quant_gemm_avx2.cpp) for every type, shorter ones the row tiles; above
  // 64 (kTokenBlock) the GEMM never runs (the row path alone, for before/after timings). 0 (default): per type, from
  // where it measured faster
  // (quant_kernels.h avx2_gemm_min_tokens; tessera.engine.native.quant_isas() lists them).
  int64_t avx2_gemm_min_tokens = 0;
  // Knobs whose value could not be read, as "NAME=value" lines; engine.native.tuning() raises a named error for them.
  std::string invalid;
  // Knobs the environment set, one TESSERA_* name per line: a stored calibration never overrides them.
  std::string from_environment;
  // TESSERA_AMX_TILE_MIN_ROWS: experts with at least this many rows use AMX tiles. The only knob tests change while
  // the process runs (set_amx_tile_min_rows), hence atomic.
  std::atomic<int64_t> amx_tile_min_rows{16};
};

// Read on first call (thread-safe), then the same object for the life of the process.
Tuning& tuning();

}  // namespace tessera
