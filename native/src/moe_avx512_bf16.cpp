// vdpbf16ps micro-tiles over the pair-panel layout (AVX512 backend prefill). AVX512-BF16 code (isa_target.h); called only
// when CPUID reports avx512_bf16. Register tile: MR rows x NB panels of 16 outputs = MR*NB zmm accumulators.
#include <immintrin.h>

#include <algorithm>

#include "moe_panels.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_BF16)

namespace tessera {
namespace {

template <int MR, int NB>
inline void kern(const uint8_t* B, size_t pb, int64_t kp, const uint32_t* const* A, float* C, int ldc, bool acc_in,
                 size_t pf) {
  __m512 acc[MR][NB];
  for (int m = 0; m < MR; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = acc_in ? _mm512_loadu_ps(C + m * ldc + b * 16) : _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh w[NB];
    for (int b = 0; b < NB; ++b) {
      const uint8_t* bp = B + size_t(b) * pb + size_t(p) * 64;
      _mm_prefetch(reinterpret_cast<const char*>(bp + pf), _MM_HINT_T0);
      w[b] = (__m512bh)_mm512_load_si512(bp);
    }
    for (int m = 0; m < MR; ++m) {
      __m512bh a = (__m512bh)_mm512_set1_epi32(int(A[m][p]));
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], w[b], a);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(C + m * ldc + b * 16, acc[m][b]);
}

template <int MR>
inline void kern_nb(int nb, const uint8_t* B, size_t pb, int64_t kp, const uint32_t* const* A, float* C, int ldc,
                    bool acc, size_t pf) {
  switch (nb) {
    case 1: return kern<MR, 1>(B, pb, kp, A, C, ldc, acc, pf);
    case 2: return kern<MR, 2>(B, pb, kp, A, C, ldc, acc, pf);
    case 3: return kern<MR, 3>(B, pb, kp, A, C, ldc, acc, pf);
    case 4: return kern<MR, 4>(B, pb, kp, A, C, ldc, acc, pf);
  }
}

}  // namespace

void tile_bf16_avx512(const uint8_t* B, size_t pb, int nb, int64_t kp, const void* const* A_, int mr, float* C,
                      int ldc, bool acc, size_t pf) {
  const uint32_t* const* A = reinterpret_cast<const uint32_t* const*>(A_);
  for (int m0 = 0; m0 < mr; m0 += 6) {
    const int r = std::min(6, mr - m0);
    switch (r) {
      case 1: kern_nb<1>(nb, B, pb, kp, A + m0, C + m0 * ldc, ldc, acc, pf); break;
      case 2: kern_nb<2>(nb, B, pb, kp, A + m0, C + m0 * ldc, ldc, acc, pf); break;
      case 3: kern_nb<3>(nb, B, pb, kp, A + m0, C + m0 * ldc, ldc, acc, pf); break;
      case 4: kern_nb<4>(nb, B, pb, kp, A + m0, C + m0 * ldc, ldc, acc, pf); break;
      case 5: kern_nb<5>(nb, B, pb, kp, A + m0, C + m0 * ldc, ldc, acc, pf); break;
      case 6: kern_nb<6>(nb, B, pb, kp, A + m0, C + m0 * ldc, ldc, acc, pf); break;
    }
  }
}

}  // namespace tessera

TESSERA_ISA_END
