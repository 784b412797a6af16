// AVX512-VNNI probe kernel: register-only vpdpbusd loop (the int8 compute peak AVX512Int8's prefill is judged by).
#include <immintrin.h>

#include "probe_isa.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_VNNI)

namespace tessera {

double int8_dot_loop_avx512_vnni(int64_t iters) {
  __m512i acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);  // u8 x s8; int32 sums wrap harmlessly
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  __m512i r = acc[0];
  for (int i = 1; i < 24; ++i) r = _mm512_add_epi32(r, acc[i]);
  volatile int keep = _mm512_reduce_add_epi32(r);
  (void)keep;
  return double(iters) * 24 * 128;  // 16 lanes x 4 byte pairs x (mul + add)
}

}  // namespace tessera

TESSERA_ISA_END
