// AVX512-BF16 probe kernel: register-only vdpbf16ps loop (the bf16 compute peak the prefill kernels are judged by).
#include <immintrin.h>

#include "probe_isa.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_BF16)

namespace tessera {

double bf16_dot_loop_avx512(int64_t iters) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3400);  // 1.0, tiny
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 r = acc[0];
  for (int i = 1; i < 24; ++i) r = _mm512_add_ps(r, acc[i]);
  volatile float keep = _mm512_reduce_add_ps(r);
  (void)keep;
  return double(iters) * 24 * 64;  // 16 lanes x 2 pairs x (mul + add)
}

}  // namespace tessera

TESSERA_ISA_END
