// Quantized kernels, AVX-512 VNNI: one vpdpbusd per 64 codes x 64 int8 activations (u8 x s8 -> 16 int32 lanes of 4
// products, exact), converted to f32 and multiplied into the accumulator with A * dx per lane; the B terms (mins,
// code offsets) are one fnmadd per 16 groups. R rows share each activation load. AVX-512F/BW/VL/DQ + VNNI code
// between the ISA markers only (isa_target.h); the unpacking and activation quantization come from quant_body.inc.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant_kernels.h"
#include "tessera/bf16.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_VNNI)

namespace tessera {
namespace quant {
namespace {

#include "quant_body.inc"

template <int R>
void dot_rows_n(const uint8_t* u, const float* a4, const float* b16, int64_t K, const ActRow& x, float* out) {
  const int64_t Kp = padded_k(K), S16 = padded_s16(K), K4 = Kp / 4;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t c = 0; c < Kp / 64; ++c) {
    const __m512i xq = _mm512_loadu_si512(x.q + 64 * c);
    const __m512 dx = _mm512_loadu_ps(x.d4 + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512i p = _mm512_dpbusd_epi32(zero, _mm512_loadu_si512(u + r * Kp + 64 * c), xq);
      const __m512 ad = _mm512_mul_ps(_mm512_loadu_ps(a4 + r * K4 + 16 * c), dx);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), ad, acc[r]);
    }
  }
  for (int64_t g = 0; g < S16; g += 16) {
    const __m512 s = _mm512_loadu_ps(x.s16 + g);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fnmadd_ps(_mm512_loadu_ps(b16 + r * S16 + g), s, acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
}

void dot_rows_avx512(const uint8_t* u, const float* a4, const float* b16, int R, int64_t K, const ActRow& x, bool,
                     float* out) {
  switch (R) {
    case 4: dot_rows_n<4>(u, a4, b16, K, x, out); break;
    case 3: dot_rows_n<3>(u, a4, b16, K, x, out); break;
    case 2: dot_rows_n<2>(u, a4, b16, K, x, out); break;
    default: dot_rows_n<1>(u, a4, b16, K, x, out); break;
  }
}

}  // namespace
}  // namespace quant
}  // namespace tessera

TESSERA_ISA_END

namespace tessera {
namespace quant {
namespace {
const Kernels kAvx512 = {QIsa::AVX512VNNI, quantize_row_body, unpack_rows_body, dot_rows_avx512};
}  // namespace
const Kernels& kernels_avx512_vnni() { return kAvx512; }
}  // namespace quant
}  // namespace tessera
