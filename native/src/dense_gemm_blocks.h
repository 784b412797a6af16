// What the dense prefill GEMMs (dense_gemm_avx512_bf16.cpp, dense_gemm_avx2.cpp) share around their kernels: their
// thread-local scratch, the pool dispatch of their row blocks and the copy of a partial block's results out of it.
// Baseline code: included before TESSERA_ISA_BEGIN, so the instantiations stay free of ISA flags (isa_target.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "tessera/pool.h"

namespace tessera {
namespace dense_gemm_blocks {

// `bytes` of buf from its first 64-byte boundary (grown, never shrunk: a thread_local buf serves every call).
inline uint8_t* aligned_scratch(std::vector<uint8_t>& buf, size_t bytes) {
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<uint8_t*>((p + 63) & ~uintptr_t(63));
}

// block(b) for every b in [0, blocks): inline where there is one block or one thread, else handed out on the pool.
template <class F>
void run(ThreadPool& pool, int64_t blocks, F&& block) {
  if (blocks == 1 || pool.size() == 1) {
    for (int64_t b = 0; b < blocks; ++b) block(b);
  } else {
    pool.parallel_for(blocks, [&](int64_t b, int) { block(b); });
  }
}

// A block whose tiles wrote more columns than out has: C [T, ldc] -> out [T, N] columns n0 .. n0 + rows - 1.
inline void copy_out(const float* C, int64_t ldc, int64_t T, float* out, int64_t N, int64_t n0, int64_t rows) {
  for (int64_t t = 0; t < T; ++t) std::memcpy(out + t * N + n0, C + t * ldc, size_t(rows) * sizeof(float));
}

}  // namespace dense_gemm_blocks
}  // namespace tessera
