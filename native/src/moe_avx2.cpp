// AVX2 backend (consumer CPUs without AVX-512): the same bf16 pair-panel layout and body as AVX512, 8-lane f32 FMA
// tiles (exact bf16 weights, f32 activations). AVX2 + FMA + F16C code between the ISA markers (isa_target.h).
#include <immintrin.h>

// moe_body.inc's headers, here so they are compiled before TESSERA_ISA_BEGIN (baseline)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "moe_panels.h"
#include "tessera/bf16.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX2)

namespace tessera {
namespace avx2 {

struct V {
  using f = __m256;
  static constexpr int W = 8;
  static f zero() { return _mm256_setzero_ps(); }
  static f set1(float v) { return _mm256_set1_ps(v); }
  static f load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, f v) { _mm256_storeu_ps(p, v); }
  static f fma(f a, f b, f c) { return _mm256_fmadd_ps(a, b, c); }
  static f mul(f a, f b) { return _mm256_mul_ps(a, b); }
  static f add(f a, f b) { return _mm256_add_ps(a, b); }
  static f sub(f a, f b) { return _mm256_sub_ps(a, b); }
  static f div(f a, f b) { return _mm256_div_ps(a, b); }
  static void bf16_pairs(const uint8_t* p, f& even, f& odd) {  // 8 bf16 pairs (32 bytes)
    __m256i r = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(r, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(int(0xffff0000u))));
  }
  static f exp(f x) {  // Cephes expf, as in the AVX512 traits
    x = _mm256_min_ps(_mm256_max_ps(x, set1(-88.3762626647949f)), set1(88.3762626647949f));
    f n = _mm256_round_ps(mul(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    f r = fma(n, set1(-0.693359375f), x);
    r = fma(n, set1(2.12194440e-4f), r);
    f p = set1(1.9875691500e-4f);
    p = fma(p, r, set1(1.3981999507e-3f));
    p = fma(p, r, set1(8.3334519073e-3f));
    p = fma(p, r, set1(4.1665795894e-2f));
    p = fma(p, r, set1(1.6666665459e-1f));
    p = fma(p, r, set1(5.0000001201e-1f));
    p = fma(p, mul(r, r), add(r, set1(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return mul(p, _mm256_castsi256_ps(e));
  }
  static void store_bf16_row(uint16_t* dst, const float* src, int64_t n, int64_t n_padded) {
    int64_t i = 0;
    for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
    for (; i < n_padded; ++i) dst[i] = 0;
  }
};

}  // namespace avx2
}  // namespace tessera

#define TESSERA_ISA_NS avx2
#include "moe_body.inc"
#undef TESSERA_ISA_NS

// Baseline code from here: supported() and the registration run on every CPU.
TESSERA_ISA_END

namespace tessera {
namespace avx2 {
namespace {

constexpr const char* kName = "AVX2";

bool supported(const CpuFeatures& c, std::string* why) {
  if (!(c.avx2 && c.fma)) {
    *why = "CPU lacks avx2/fma";
    return false;
  }
  if (!c.os_avx) {
    *why = "OS does not enable AVX state (XCR0)";
    return false;
  }
  *why = "bf16 weights, f32 FMA";
  return true;
}

size_t packed_bytes(const MoeDims& d, WeightType) { return PanelLayout(d).total; }
void pack(const MoeDims& d, const WeightsIn& w, uint8_t* dst, ThreadPool& pool) { pack_panels(kName, d, w, dst, pool); }
void unpack(const uint8_t* p, int64_t e, float* g, float* u, float* d) { unpack_panels(kName, p, e, g, u, d); }

void forward(const uint8_t* packed, int64_t T, int64_t k, const int64_t* ids, const float* w, const float* x,
             float* out, ThreadPool& pool) {
  forward_panels(kName, packed, T, k, ids, w, x, out, pool, nullptr, 0);
}

const BackendOps kOps = {kName, IsaLevel::AVX2, false, 10, "bf16",
                         "AVX2 + FMA, bf16 weights, f32 activations: CPUs without AVX-512", supported, packed_bytes, pack, unpack, forward};
TESSERA_REGISTER_BACKEND(kOps);

}  // namespace
}  // namespace avx2
}  // namespace tessera
