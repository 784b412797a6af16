// AVX2/FMA probe kernels: streaming read and a register-only fp32 FMA loop.
#include <immintrin.h>

#include "probe_isa.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX2)

namespace tessera {

uint64_t read_sum_avx2(const uint8_t* p, size_t bytes) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i + 128 <= bytes; i += 128) {
    a = _mm256_xor_si256(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_xor_si256(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_xor_si256(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  return uint64_t(_mm256_extract_epi64(a, 0) ^ _mm256_extract_epi64(a, 1) ^ _mm256_extract_epi64(a, 2) ^
                  _mm256_extract_epi64(a, 3));
}

double fma_loop_avx2(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(float(i));
  const __m256 m = _mm256_set1_ps(0.999999f), s = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, s);
  }
  __m256 r = acc[0];
  for (int i = 1; i < 12; ++i) r = _mm256_add_ps(r, acc[i]);
  alignas(32) float v[8];
  _mm256_store_ps(v, r);
  volatile float keep = v[0];
  (void)keep;
  return double(iters) * 12 * 16;
}

}  // namespace tessera

TESSERA_ISA_END
