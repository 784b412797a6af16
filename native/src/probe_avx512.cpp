// AVX-512F probe kernels: streaming read and a register-only fp32 FMA loop.
#include <immintrin.h>

#include "probe_isa.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512)

namespace tessera {

uint64_t read_sum_avx512(const uint8_t* p, size_t bytes) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (size_t i = 0; i + 256 <= bytes; i += 256) {
    a = _mm512_xor_si512(a, _mm512_load_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_load_si512(p + i + 64));
    c = _mm512_xor_si512(c, _mm512_load_si512(p + i + 128));
    d = _mm512_xor_si512(d, _mm512_load_si512(p + i + 192));
  }
  a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
  return uint64_t(_mm512_reduce_add_epi64(a));
}

double fma_loop_avx512(int64_t iters) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 m = _mm512_set1_ps(0.999999f), s = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, s);
  }
  __m512 r = acc[0];
  for (int i = 1; i < 24; ++i) r = _mm512_add_ps(r, acc[i]);
  volatile float keep = _mm512_reduce_add_ps(r);
  (void)keep;
  return double(iters) * 24 * 32;  // 16 lanes x (mul + add)
}

}  // namespace tessera

TESSERA_ISA_END
