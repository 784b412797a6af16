// Machine probes used by the benchmark and the hardware wizard: memory read bandwidth and register-only FLOP peaks.
#pragma once
#include "tessera/pool.h"

namespace tessera {

// Multi-threaded streaming read of a buffer much larger than the last-level cache, `nth` participants of `pool`;
// returns the best pass in GB/s (1e9 bytes/s) over about `seconds`. Uses the widest vector loads the CPU allows.
double read_bandwidth_gbs(ThreadPool& pool, double buffer_mib, double seconds);
// Register-only peak of one instruction on all pool threads, GFLOP/s (int8: GOP/s, mul + add counted as two); < 0
// when the CPU (or the OS, for AMX) lacks the instruction. what: "bf16_dot" (vdpbf16ps), "int8_dot" (vpdpbusd),
// "fp32_fma", "amx_bf16" (tdpbf16ps), "amx_int8" (tdpbssd).
double peak_gflops(ThreadPool& pool, const char* what, double seconds);
// Whether 512-bit vector work runs beside AMX tile work on one core, on the calling thread: ns per item of 16
// TDPBSSD (a 32 x 32 block over 4 K-steps, operands reloaded from L1) with fma_blocks x 12 independent FMAs, measured
// four ways: tiles only, vector only, the vector work after each item's tiles, and spread over its K-steps. Keys
// tiles_ns, vector_ns, after_ns, spread_ns. Throws std::runtime_error where the CPU or the OS lacks AMX int8 or
// AVX-512 (a tile instruction there would raise SIGILL).
struct AmxOverlapNs {
  double tiles_ns, vector_ns, after_ns, spread_ns;
};
AmxOverlapNs amx_overlap(int fma_blocks, int64_t items);

}  // namespace tessera
