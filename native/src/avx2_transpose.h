// 8 x 8 transpose of 32-bit lanes in ymm registers (r[i] lane j -> r[j] lane i), for the AVX2 files that turn token or
// row vectors into panels: quant_gemm_avx2_body.inc (int8 activations, 4 to a lane) and dense_gemm_avx2.cpp (f32
// weights). Include it after TESSERA_ISA_BEGIN (isa_target.h): the function is static, so each including file keeps
// its own copy compiled for its own ISA.
#pragma once

#include <immintrin.h>

namespace tessera {

__attribute__((always_inline)) static inline void transpose8x32(__m256i* r) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {  // u[4i + j], 128-bit lane L: element 4L + j of rows 4i .. 4i + 3
    u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
    r[4 + j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
  }
}

}  // namespace tessera
