// Per-ISA probe kernels (defined in probe_<isa>.cpp, compiled with that ISA's flags). Internal to native/src.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tessera {
uint64_t read_sum_avx512(const uint8_t* p, size_t bytes);  // bytes: multiple of 512
uint64_t read_sum_avx2(const uint8_t* p, size_t bytes);    // bytes: multiple of 256
double fma_loop_avx512(int64_t iters);                     // returns FLOPs executed
double fma_loop_avx2(int64_t iters);
double bf16_dot_loop_avx512(int64_t iters);
double int8_dot_loop_avx512_vnni(int64_t iters);  // vpdpbusd; returns int8 ops (mul + add) executed
// Tile loops (probe_amx.cpp, AMX flags): call only where CpuFeatures reports AMX usable. Return FLOPs / int8 ops.
double amx_bf16_loop(int64_t iters);  // tdpbf16ps
double amx_int8_loop(int64_t iters);  // tdpbssd
// Whether vector work runs beside tile work on this core: ns per item of 16 TDPBSSD (4 K-steps of a 32 x 32 block,
// operands reloaded from L1, C tiles zeroed and stored) with fma_blocks x 12 independent 512-bit FMAs, alone, the
// vector work alone, after the tiles, and spread over the K-steps (probe_amx.cpp). One thread; AMX and AVX-512 only.
struct AmxOverlap {
  double tiles_ns = 0, vector_ns = 0, after_ns = 0, spread_ns = 0;
};
AmxOverlap amx_overlap_probe(int fma_blocks, int64_t items);
}  // namespace tessera
