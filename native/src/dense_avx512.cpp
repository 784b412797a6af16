// Dense mat-vec, AVX-512F: 16 f32 lanes, blocks of 32 weights, 4 rows x 4 tokens per tile (16 accumulators).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "isa_target.h"
#include "tessera/dense.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512)
#include "dense_body.h"  // after BEGIN: the body is this file's ISA code (file-local names)

namespace tessera {
namespace {

struct V512 {
  using f = __m512;
  static constexpr int W = 16;
  static f zero() { return _mm512_setzero_ps(); }
  static f load(const float* p) { return _mm512_loadu_ps(p); }
  static f fma(f a, f b, f c) { return _mm512_fmadd_ps(a, b, c); }
  static f add(f a, f b) { return _mm512_add_ps(a, b); }
  static f mul(f a, f b) { return _mm512_mul_ps(a, b); }
  static void store(float* p, f v) { _mm512_storeu_ps(p, v); }
  static void opaque(f& v) { __asm__("" : "+v"(v)); }  // the compiler cannot fuse across it
  static float hsum(f v) { return _mm512_reduce_add_ps(v); }
  static void widen_bf16(const uint16_t* p, f& even, f& odd) {  // 32 bf16 = 16 pairs
    __m512i r = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(int(0xffff0000u))));
  }
  static void widen_f16(const uint16_t* p, f& lo, f& hi) {
    lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
  }
};

}  // namespace

void dense_isa::matvec_avx512(const DenseArgs& a, ThreadPool& pool) { dense_body::matvec<V512, 4, 4>(a, pool); }
void dense_isa::matvec_multi_avx512(const DenseMatvecPart* parts, int n, const float* x, int64_t K, ThreadPool& pool) {
  dense_body::matvec_multi<V512>(parts, n, x, K, pool);
}

void dense_isa::matvec_f32_rows_avx512(const float* w, int64_t rows, int64_t K, const float* x, float* out) {
  dense_body::f32_rows<V512>(w, rows, K, x, out);
}

}  // namespace tessera

TESSERA_ISA_END
