// Per-ISA probe kernels (defined in probe_<isa>.cpp, compiled with that ISA's flags). Internal to native/src.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tessera/probe.h"  // AmxOverlapNs

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
// tessera/probe.h's amx_overlap measured on the calling thread (probe_amx.cpp), without its checks: AMX and AVX-512 only.
AmxOverlapNs amx_overlap_probe(int fma_blocks, int64_t items);
}  // namespace tessera
