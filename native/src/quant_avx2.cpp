// Quantized kernels, AVX2: per 32 codes, maddubs (u8 x s8 -> i16 pairs) + madd by ones gives the same 4-value int32
// lanes as vpdpbusd. Codes up to 63 (Q4_0, Q4_K, Q5_K, Q6_K) cannot saturate maddubs (63 * 127 * 2 < 32767). Wide
// codes (Q8_0, IQ4_XS: u = s + 128) use the signed value s = u ^ 0x80 as |s| x sign(q, s) (at most 128 * 127 * 2),
// and since their B is exactly 128 A, A * u - B = A * s: the B terms are skipped. AVX2 + FMA + F16C code between
// the ISA markers only (isa_target.h).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant_kernels.h"
#include "tessera/bf16.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX2)

namespace tessera {
namespace quant {
namespace {

#include "quant_body.inc"

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int R, bool Wide>
void dot_rows_n(const uint8_t* u, const float* a4, const float* b16, int64_t K, const ActRow& x, float* out) {
  const int64_t Kp = padded_k(K), S16 = padded_s16(K), K4 = Kp / 4;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(char(0x80));
  for (int64_t c = 0; c < Kp / 32; ++c) {
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 32 * c));
    const __m256 dx = _mm256_set1_ps(x.d256[c / 8]);
    for (int r = 0; r < R; ++r) {
      const __m256i uv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + r * Kp + 32 * c));
      __m256i p16;
      if (Wide) {
        const __m256i s = _mm256_xor_si256(uv, flip);
        p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(s), _mm256_sign_epi8(xq, s));
      } else {
        p16 = _mm256_maddubs_epi16(uv, xq);
      }
      const __m256i p = _mm256_madd_epi16(p16, ones);
      const __m256 ad = _mm256_mul_ps(_mm256_loadu_ps(a4 + r * K4 + 8 * c), dx);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), ad, acc[r]);
    }
  }
  if (!Wide) {
    for (int64_t g = 0; g < S16; g += 8) {
      const __m256 s = _mm256_loadu_ps(x.s16 + g);
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fnmadd_ps(_mm256_loadu_ps(b16 + r * S16 + g), s, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

template <bool Wide>
void dot_rows_w(const uint8_t* u, const float* a4, const float* b16, int R, int64_t K, const ActRow& x, float* out) {
  switch (R) {
    case 4: dot_rows_n<4, Wide>(u, a4, b16, K, x, out); break;
    case 3: dot_rows_n<3, Wide>(u, a4, b16, K, x, out); break;
    case 2: dot_rows_n<2, Wide>(u, a4, b16, K, x, out); break;
    default: dot_rows_n<1, Wide>(u, a4, b16, K, x, out); break;
  }
}

void dot_rows_avx2(const uint8_t* u, const float* a4, const float* b16, int R, int64_t K, const ActRow& x, bool wide,
                   float* out) {
  if (wide) dot_rows_w<true>(u, a4, b16, R, K, x, out);
  else dot_rows_w<false>(u, a4, b16, R, K, x, out);
}

}  // namespace
}  // namespace quant
}  // namespace tessera

TESSERA_ISA_END

namespace tessera {
namespace quant {
namespace {
const Kernels kAvx2 = {QIsa::AVX2, quantize_row_body, unpack_rows_body, dot_rows_avx2, nullptr};
}  // namespace
const Kernels& kernels_avx2() { return kAvx2; }
}  // namespace quant
}  // namespace tessera
