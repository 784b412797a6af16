// Dense mat-vec, AVX2 + FMA + F16C: 8 f32 lanes, blocks of 16 weights, 4 rows x 2 tokens per tile (16 ymm registers).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "isa_target.h"
#include "tessera/dense.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX2)
#include "dense_body.h"  // after BEGIN: the body is this file's ISA code (file-local names)

namespace tessera {
namespace {

struct V256 {
  using f = __m256;
  static constexpr int W = 8;
  static f zero() { return _mm256_setzero_ps(); }
  static f load(const float* p) { return _mm256_loadu_ps(p); }
  static f fma(f a, f b, f c) { return _mm256_fmadd_ps(a, b, c); }
  static f add(f a, f b) { return _mm256_add_ps(a, b); }
  static f mul(f a, f b) { return _mm256_mul_ps(a, b); }
  static void store(float* p, f v) { _mm256_storeu_ps(p, v); }
  static void opaque(f& v) { __asm__("" : "+x"(v)); }  // the compiler cannot fuse across it
  static float hsum(f v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static void widen_bf16(const uint16_t* p, f& even, f& odd) {  // 16 bf16 = 8 pairs
    __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(r, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(int(0xffff0000u))));
  }
  static void widen_f16(const uint16_t* p, f& lo, f& hi) {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
};

}  // namespace

void dense_isa::matvec_avx2(const DenseArgs& a, ThreadPool& pool) { dense_body::matvec<V256, 4, 2>(a, pool); }
void dense_isa::matvec_multi_avx2(const DenseMatvecPart* parts, int n, const float* x, int64_t K, ThreadPool& pool) {
  dense_body::matvec_multi<V256>(parts, n, x, K, pool);
}

void dense_isa::matvec_f32_rows_avx2(const float* w, int64_t rows, int64_t K, const float* x, float* out) {
  dense_body::f32_rows<V256>(w, rows, K, x, out);
}

}  // namespace tessera

TESSERA_ISA_END
