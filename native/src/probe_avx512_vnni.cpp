// AVX512-VNNI probe kernel: register-only vpdpbusd loop (the int8 compute peak AVX512Int8's prefill is judged by).
//
// Written in inline asm on twelve named accumulators: with the intrinsic on an array, GCC 12 copies every accumulator
// to another register and back around each vpdpbusd (two vmovdqa32 per dot), and the loop measured half the real rate
// (Zen 4: 224 instead of 468 GOP/s a core, checked against a hand-written loop), so every "% of the vpdpbusd peak"
// read twice what it was.
#include <immintrin.h>

#include "probe_isa.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_VNNI)

namespace tessera {

double int8_dot_loop_avx512_vnni(int64_t iters) {
  __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2), c3 = _mm512_set1_epi32(3);
  __m512i c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5), c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7);
  __m512i c8 = _mm512_set1_epi32(8), c9 = _mm512_set1_epi32(9), c10 = _mm512_set1_epi32(10);
  __m512i c11 = _mm512_set1_epi32(11);
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);  // u8 x s8; int32 sums wrap harmlessly
// acc += a (u8) . b (s8), four byte pairs a lane; AT&T order: vpdpbusd b, a, acc.
#define TESSERA_DPBUSD(acc) asm volatile("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))
  for (int64_t it = 0; it < iters; ++it) {  // 24 dots an iteration, each accumulator's chain two dots long
    TESSERA_DPBUSD(c0); TESSERA_DPBUSD(c1); TESSERA_DPBUSD(c2); TESSERA_DPBUSD(c3);
    TESSERA_DPBUSD(c4); TESSERA_DPBUSD(c5); TESSERA_DPBUSD(c6); TESSERA_DPBUSD(c7);
    TESSERA_DPBUSD(c8); TESSERA_DPBUSD(c9); TESSERA_DPBUSD(c10); TESSERA_DPBUSD(c11);
    TESSERA_DPBUSD(c0); TESSERA_DPBUSD(c1); TESSERA_DPBUSD(c2); TESSERA_DPBUSD(c3);
    TESSERA_DPBUSD(c4); TESSERA_DPBUSD(c5); TESSERA_DPBUSD(c6); TESSERA_DPBUSD(c7);
    TESSERA_DPBUSD(c8); TESSERA_DPBUSD(c9); TESSERA_DPBUSD(c10); TESSERA_DPBUSD(c11);
  }
#undef TESSERA_DPBUSD
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                               _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
  r = _mm512_add_epi32(r, _mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)));
  volatile int keep = _mm512_reduce_add_epi32(r);
  (void)keep;
  return double(iters) * 24 * 128;  // 16 lanes x 4 byte pairs x (mul + add)
}

}  // namespace tessera

TESSERA_ISA_END
