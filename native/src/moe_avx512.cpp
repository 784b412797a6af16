// AVX512 backend: bf16 weights in the pair-panel layout; f32-activation FMA tiles (decode, exact bf16 weights) and,
// when the CPU has avx512_bf16, vdpbf16ps tiles for prefill (moe_avx512_bf16.cpp). AVX-512F/BW/VL/DQ code between the ISA markers (isa_target.h).
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

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512)

namespace tessera {
namespace avx512 {

struct V {
  using f = __m512;
  static constexpr int W = 16;
  static f zero() { return _mm512_setzero_ps(); }
  static f set1(float v) { return _mm512_set1_ps(v); }
  static f load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, f v) { _mm512_storeu_ps(p, v); }
  static f fma(f a, f b, f c) { return _mm512_fmadd_ps(a, b, c); }
  static f mul(f a, f b) { return _mm512_mul_ps(a, b); }
  static f add(f a, f b) { return _mm512_add_ps(a, b); }
  static f sub(f a, f b) { return _mm512_sub_ps(a, b); }
  static f div(f a, f b) { return _mm512_div_ps(a, b); }
  // 16 bf16 pairs (64 bytes) -> even and odd elements as f32.
  static void bf16_pairs(const uint8_t* p, f& even, f& odd) {
    __m512i r = _mm512_load_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(int(0xffff0000u))));
  }
  // Cephes expf: exp(x) = 2^n * p(r), |r| <= ln2/2; ~1 ulp.
  static f exp(f x) {
    x = _mm512_min_ps(_mm512_max_ps(x, set1(-88.3762626647949f)), set1(88.3762626647949f));
    f n = _mm512_roundscale_ps(mul(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    f r = fma(n, set1(-0.693359375f), x);
    r = fma(n, set1(2.12194440e-4f), r);
    f p = set1(1.9875691500e-4f);
    p = fma(p, r, set1(1.3981999507e-3f));
    p = fma(p, r, set1(8.3334519073e-3f));
    p = fma(p, r, set1(4.1665795894e-2f));
    p = fma(p, r, set1(1.6666665459e-1f));
    p = fma(p, r, set1(5.0000001201e-1f));
    p = fma(p, mul(r, r), add(r, set1(1.0f)));
    return _mm512_scalef_ps(p, n);
  }
  // n f32 values -> bf16 (round to nearest even), zero-filled up to n_padded.
  static void store_bf16_row(uint16_t* dst, const float* src, int64_t n, int64_t n_padded) {
    int64_t i = 0;
    const __m512i lsb = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    for (; i + 16 <= n; i += 16) {
      __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
      __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), lsb)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
    for (; i < n_padded; ++i) dst[i] = 0;
  }
};

}  // namespace avx512
}  // namespace tessera

#define TESSERA_ISA_NS avx512
#include "moe_body.inc"
#undef TESSERA_ISA_NS

// Baseline code from here: supported() and the registration run on every CPU.
TESSERA_ISA_END

namespace tessera {
void tile_bf16_avx512(const uint8_t* B, size_t panel_bytes, int nb, int64_t kp, const void* const* A, int mr, float* C,
                      int ldc, bool accumulate, size_t prefetch);  // moe_avx512_bf16.cpp
namespace avx512 {
namespace {

constexpr const char* kName = "AVX512";

bool supported(const CpuFeatures& c, std::string* why) {
  if (!(c.avx512f && c.avx512bw && c.avx512vl && c.avx512dq)) {
    *why = "CPU lacks avx512f/bw/vl/dq";
    return false;
  }
  if (!c.os_avx512) {
    *why = "OS does not enable AVX-512 state (XCR0)";
    return false;
  }
  *why = c.avx512_bf16 ? "bf16 weights; vdpbf16ps prefill, f32 FMA decode"
                       : "bf16 weights; CPU lacks avx512_bf16: f32 FMA throughout";
  return true;
}

size_t packed_bytes(const MoeDims& d, WeightType) { return PanelLayout(d).total; }
void pack(const MoeDims& d, const WeightsIn& w, uint8_t* dst, ThreadPool& pool) { pack_panels(kName, d, w, dst, pool); }
void unpack(const uint8_t* p, int64_t e, float* g, float* u, float* d) { unpack_panels(kName, p, e, g, u, d); }

void forward(const uint8_t* packed, int64_t T, int64_t k, const int64_t* ids, const float* w, const float* x,
             float* out, ThreadPool& pool) {
  static const TileFn bf16 = cpu_features().avx512_bf16 ? tile_bf16_avx512 : nullptr;
  forward_panels(kName, packed, T, k, ids, w, x, out, pool, bf16, 6);
}

const BackendOps kOps = {kName, IsaLevel::AVX512, false, 20, "bf16",
                         "AVX-512, bf16 weights, f32 FMA decode (vdpbf16ps prefill where the CPU has avx512_bf16)",
                         supported, packed_bytes, pack, unpack, forward};
TESSERA_REGISTER_BACKEND(kOps);

}  // namespace
}  // namespace avx512
}  // namespace tessera
