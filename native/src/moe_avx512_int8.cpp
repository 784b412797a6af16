// AVX512Int8 backend: int8 weights, symmetric, group-wise along the input dimension (TESSERA_INT8_GROUP inputs per
// scale, default 128 (tessera/tuning.h); 0 = one scale per output channel), activations quantized per token and group on the
// fly, vpdpbusd (AVX-512 VNNI) with u8 activations (q + 128) and a per-(output, group) compensation of 128 * sum(w).
// Activations get two int8 digits: x ~ s * (254 * hi + lo) with s = amax / (127 * 254), so their quantization error
// is ~1/254 of plain int8 and the layer error is the weights' alone (measured: 2.7 % -> ~1.1 % relative L2 on the
// Qwen3-30B-A3B shape; plain per-token int8 activations are the largest error term because silu(g)*u is heavy-tailed).
// Decode stays memory-bound (two vpdpbusd per weight load cost nothing there); prefill pays 2x VNNI work.
// AVX-512F/BW/VL/DQ + VNNI code between the ISA markers (isa_target.h).
//
// Layout ("quad panels"): W [N, K] -> ceil(N/16) panels; panel = Kq = ceil(K/4) rows of 64 bytes (row q = 16 outputs x
// 4 consecutive inputs, int8), then ng rows of 16 f32 scales, then ng rows of 16 i32 compensations. Per expert: gate
// and up panels interleaved (gate 0, up 0, ...), then down panels; blob = header | int8 params | gate/up | down.
// Letters as in moe_body.inc; G inputs per group, ng groups, Kq quads.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "moe_panels.h"
#include "vnni_asm.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_VNNI)
#include "avx512_lanes.h"  // after BEGIN: compiled for this file's ISA

namespace tessera {
namespace avx512_int8 {
namespace {

constexpr const char* kName = "AVX512Int8";

int64_t group_param() { return tuning().int8_group; }

struct Params {  // the 64 bytes after the header
  int64_t group;  // 0 = per output channel
  uint8_t pad[56];
};

struct MatLayout {
  int64_t N, K, kq, gq, ng, nb;  // gq: quads per group
  size_t panel;
  MatLayout(int64_t n, int64_t k, int64_t group) : N(n), K(k) {
    kq = (K + 3) / 4;
    gq = group <= 0 ? kq : std::min(kq, group / 4);
    ng = (kq + gq - 1) / gq;
    nb = (N + 15) / 16;
    panel = size_t(kq + 2 * ng) * 64;
  }
  // Activation row (4-byte units): kq quads of hi digits, kq quads of lo digits, ng scales.
  size_t row_units() const { return round_up(size_t(2 * kq + ng), 16); }
};

struct Layout {
  MoeDims d;
  MatLayout gu, dn;
  size_t expert_gu, expert_d, off_gu, off_d, total;
  Layout(const MoeDims& dims, int64_t group) : d(dims), gu(dims.I, dims.H, group), dn(dims.H, dims.I, group) {
    expert_gu = 2 * size_t(gu.nb) * gu.panel;
    expert_d = size_t(dn.nb) * dn.panel;
    off_gu = sizeof(PackedHeader) + sizeof(Params);
    off_d = off_gu + size_t(d.E) * expert_gu;
    total = off_d + size_t(d.E) * expert_d;
  }
  uint8_t* gu_panel(const uint8_t* b, int64_t e, int64_t p) const {
    return const_cast<uint8_t*>(b) + off_gu + size_t(e) * expert_gu + size_t(p) * gu.panel;
  }
  uint8_t* dn_panel(const uint8_t* b, int64_t e, int64_t p) const {
    return const_cast<uint8_t*>(b) + off_d + size_t(e) * expert_d + size_t(p) * dn.panel;
  }
};

Layout read_layout(const uint8_t* packed) {
  MoeDims d = read_header(packed, kName);
  Params prm;
  std::memcpy(&prm, packed + sizeof(PackedHeader), sizeof(prm));
  return Layout(d, prm.group);
}

// ---------------------------------------------------------------------------------------------------------- packing

// Panel b of W [N, K] (expert e of a stacked [E, N, K] tensor) -> dst.
void pack_panel(WeightType t, const void* W, int64_t e, const MatLayout& m, int64_t b, uint8_t* dst) {
  int8_t* q = reinterpret_cast<int8_t*>(dst);
  float* scales = reinterpret_cast<float*>(dst + size_t(m.kq) * 64);
  int32_t* comp = reinterpret_cast<int32_t*>(dst + size_t(m.kq + m.ng) * 64);
  std::memset(dst, 0, m.panel);
  std::vector<float> row(size_t(m.K));
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t n = b * 16 + i;
    if (n >= m.N) continue;
    for (int64_t k = 0; k < m.K; ++k) row[size_t(k)] = load_weight(t, W, size_t((e * m.N + n) * m.K + k));
    for (int64_t g = 0; g < m.ng; ++g) {
      const int64_t k0 = g * m.gq * 4, k1 = std::min(m.K, k0 + m.gq * 4);
      float amax = 0.0f;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(row[size_t(k)]));
      const float s = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
      int32_t sum = 0;
      for (int64_t k = k0; k < k1; ++k) {
        int v = int(std::nearbyint(row[size_t(k)] * inv));
        v = std::max(-127, std::min(127, v));
        q[(k / 4) * 64 + i * 4 + k % 4] = int8_t(v);
        sum += v;
      }
      scales[g * 16 + i] = s;
      comp[g * 16 + i] = 128 * sum;
    }
  }
}

// pack_panel for bf16 weights (the files' common type), 16 values at a time: the same amax (a NaN skipped, as
// std::max(amax, NaN) skips it), scale, inverse, rounding (nearbyint in the default mode = cvtps' round to nearest
// even; NaN -> INT_MIN, as the scalar conversion gives on x86), clamp and sums, so the same bytes: 0.99-1.00 GB/s of
// source on two cores of the AMX Xeon for the scalar loop (a libm call and a scattered byte store per value).
void pack_panel_bf16(const uint16_t* W, int64_t e, const MatLayout& m, int64_t b, uint8_t* dst) {
  int8_t* q = reinterpret_cast<int8_t*>(dst);
  float* scales = reinterpret_cast<float*>(dst + size_t(m.kq) * 64);
  int32_t* comp = reinterpret_cast<int32_t*>(dst + size_t(m.kq + m.ng) * 64);
  std::memset(dst, 0, m.panel);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t n = b * 16 + i;
    if (n >= m.N) continue;
    const uint16_t* row = W + size_t(e * m.N + n) * size_t(m.K);
    for (int64_t g = 0; g < m.ng; ++g) {
      const int64_t k0 = g * m.gq * 4, k1 = std::min(m.K, k0 + m.gq * 4);
      __m512 vmax = _mm512_setzero_ps();
      for (int64_t k = k0; k < k1; k += 16)
        vmax = _mm512_max_ps(_mm512_abs_ps(load_bf16x16(tail_mask(k1 - k), row + k)), vmax);
      const float amax = _mm512_reduce_max_ps(vmax);
      const float s = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
      const __m512 vinv = _mm512_set1_ps(inv);
      __m512i sum = _mm512_setzero_si512();
      for (int64_t k = k0; k < k1; k += 16) {  // k0 and the group size are multiples of 4: whole quads
        const __mmask16 mk = tail_mask(k1 - k);
        const __m512 p = _mm512_mul_ps(load_bf16x16(mk, row + k), vinv);
        const __m512i v = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(p), lo), hi);
        const __m512i vz = _mm512_maskz_mov_epi32(mk, v);
        sum = _mm512_add_epi32(sum, vz);
        alignas(16) uint32_t quads[4];
        _mm_store_si128(reinterpret_cast<__m128i*>(quads), _mm512_cvtepi32_epi8(vz));
        for (int64_t j = 0; j < (std::min<int64_t>(16, k1 - k) + 3) / 4; ++j)
          std::memcpy(q + (k / 4 + j) * 64 + i * 4, &quads[j], 4);
      }
      scales[g * 16 + i] = s;
      comp[g * 16 + i] = 128 * _mm512_reduce_add_epi32(sum);
    }
  }
}

void unpack_panel(const uint8_t* src, const MatLayout& m, int64_t b, float* W) {
  const int8_t* q = reinterpret_cast<const int8_t*>(src);
  const float* scales = reinterpret_cast<const float*>(src + size_t(m.kq) * 64);
  for (int64_t i = 0; i < 16 && b * 16 + i < m.N; ++i)
    for (int64_t k = 0; k < m.K; ++k)
      W[(b * 16 + i) * m.K + k] = float(q[(k / 4) * 64 + i * 4 + k % 4]) * scales[(k / (m.gq * 4)) * 16 + i];
}

size_t packed_bytes(const MoeDims& d, WeightType) { return Layout(d, group_param()).total; }

void pack(const MoeDims& d, const WeightsIn& w, uint8_t* dst, ThreadPool& pool) {
  write_header(dst, kName, d, w.type);
  Params prm{};
  prm.group = group_param();
  std::memcpy(dst + sizeof(PackedHeader), &prm, sizeof(prm));
  const Layout L(d, prm.group);
  const auto panel = [&](const void* W, int64_t e, const MatLayout& m, int64_t b, uint8_t* out) {
    if (w.type == WeightType::BF16)
      pack_panel_bf16(static_cast<const uint16_t*>(W), e, m, b, out);
    else
      pack_panel(w.type, W, e, m, b, out);
  };
  pool.parallel_for(d.E, [&](int64_t e, int) {
    for (int64_t b = 0; b < L.gu.nb; ++b) {
      panel(w.gate, e, L.gu, b, L.gu_panel(dst, e, 2 * b));
      panel(w.up, e, L.gu, b, L.gu_panel(dst, e, 2 * b + 1));
    }
    for (int64_t b = 0; b < L.dn.nb; ++b) panel(w.down, e, L.dn, b, L.dn_panel(dst, e, b));
  });
}

void unpack(const uint8_t* packed, int64_t e, float* gate, float* up, float* down) {
  const Layout L = read_layout(packed);
  for (int64_t b = 0; b < L.gu.nb; ++b) {
    unpack_panel(L.gu_panel(packed, e, 2 * b), L.gu, b, gate);
    unpack_panel(L.gu_panel(packed, e, 2 * b + 1), L.gu, b, up);
  }
  for (int64_t b = 0; b < L.dn.nb; ++b) unpack_panel(L.dn_panel(packed, e, b), L.dn, b, down);
}

// ---------------------------------------------------------------------------------------------------------- compute

// src [K] f32 -> dst: kq quads of hi digits, kq quads of lo digits (both u8 = digit + 128), ng f32 scales s:
// x ~ s * (254 * hi + lo), |hi| <= 127, |lo| <= 127.
void quantize_row(const float* src, const MatLayout& m, uint32_t* dst) {
  uint8_t* hi = reinterpret_cast<uint8_t*>(dst);
  uint8_t* lo = reinterpret_cast<uint8_t*>(dst + m.kq);
  float* scales = reinterpret_cast<float*>(dst + 2 * m.kq);
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m128i bias = _mm_set1_epi8(char(0x80));
  for (int64_t g = 0; g < m.ng; ++g) {
    const int64_t k0 = g * m.gq * 4, k1 = std::min(m.K, k0 + m.gq * 4), kend = std::min(m.kq * 4, k0 + m.gq * 4);
    __m512 vmax = _mm512_setzero_ps();
    int64_t k = k0;
    for (; k + 16 <= k1; k += 16) vmax = _mm512_max_ps(vmax, _mm512_and_ps(_mm512_loadu_ps(src + k), absmask));
    float amax = _mm512_reduce_max_ps(vmax);
    for (; k < k1; ++k) amax = std::max(amax, std::fabs(src[k]));
    const float inv_hi = amax > 0 ? 127.0f / amax : 0.0f;  // x * inv_hi in [-127, 127]
    const float s_hi = amax / 127.0f, inv_lo = amax > 0 ? 127.0f * 254.0f / amax : 0.0f;
    scales[g] = s_hi / 254.0f;
    const __m512 vinv_hi = _mm512_set1_ps(inv_hi), vs_hi = _mm512_set1_ps(s_hi), vinv_lo = _mm512_set1_ps(inv_lo);
    for (k = k0; k + 16 <= k1; k += 16) {
      const __m512 v = _mm512_loadu_ps(src + k);
      const __m512i h = _mm512_cvtps_epi32(_mm512_mul_ps(v, vinv_hi));  // round to nearest even
      const __m512 resid = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(h), vs_hi, v);  // |resid| <= s_hi / 2
      const __m512i l = _mm512_cvtps_epi32(_mm512_mul_ps(resid, vinv_lo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + k), _mm_xor_si128(_mm512_cvtsepi32_epi8(h), bias));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + k), _mm_xor_si128(_mm512_cvtsepi32_epi8(l), bias));
    }
    for (; k < k1; ++k) {
      const int h = std::max(-127, std::min(127, int(std::nearbyint(src[k] * inv_hi))));
      const float resid = src[k] - float(h) * s_hi;
      const int l = std::max(-127, std::min(127, int(std::nearbyint(resid * inv_lo))));
      hi[k] = uint8_t(h + 128);
      lo[k] = uint8_t(l + 128);
    }
    for (; k < kend; ++k) hi[k] = lo[k] = 128;  // padding = 0
  }
}

// C[m][b*16 + n] = sum over groups of (254 * (acc_hi - comp) + (acc_lo - comp)) * wscale * ascale, mr rows, nb panels.
template <int MR, int NB>
void kern(const uint8_t* B, const MatLayout& L, const uint32_t* const* A, float* C, int ldc) {
  _Pragma("GCC unroll 8") for (int m = 0; m < MR; ++m)
    _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) _mm512_storeu_ps(C + m * ldc + b * 16, _mm512_setzero_ps());
  const size_t pb = L.panel;
  const __m512i k254 = _mm512_set1_epi32(254);
  for (int64_t g = 0; g < L.ng; ++g) {
    const int64_t q0 = g * L.gq, q1 = std::min(L.kq, q0 + L.gq);
    __m512i acc_hi[MR][NB], acc_lo[MR][NB];
    _Pragma("GCC unroll 8") for (int m = 0; m < MR; ++m)
      _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) acc_hi[m][b] = acc_lo[m][b] = _mm512_setzero_si512();
    for (int64_t q = q0; q < q1; ++q) {
      __m512i w[NB];
      _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) {
        const uint8_t* p = B + size_t(b) * pb + size_t(q) * 64;
        _mm_prefetch(reinterpret_cast<const char*>(p + 1024), _MM_HINT_T0);
        w[b] = _mm512_load_si512(p);
      }
      _Pragma("GCC unroll 8") for (int m = 0; m < MR; ++m) {
        const __m512i ah = _mm512_set1_epi32(int(A[m][q])), al = _mm512_set1_epi32(int(A[m][L.kq + q]));
        _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) {
          TESSERA_VPDPBUSD_ZMM(acc_hi[m][b], ah, w[b]);  // vnni_asm.h: the intrinsic spills here (GCC 12)
          TESSERA_VPDPBUSD_ZMM(acc_lo[m][b], al, w[b]);
        }
      }
    }
    _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) {
      const uint8_t* tail = B + size_t(b) * pb + size_t(L.kq) * 64;
      const __m512 ws = _mm512_loadu_ps(reinterpret_cast<const float*>(tail) + g * 16);
      const __m512i cp = _mm512_loadu_si512(tail + size_t(L.ng) * 64 + size_t(g) * 64);
      _Pragma("GCC unroll 8") for (int m = 0; m < MR; ++m) {
        const float as = reinterpret_cast<const float*>(A[m] + 2 * L.kq)[g];
        // Exact in int32 while 254 * 127 * 127 * 4 * gq < 2^31 (gq <= 64 quads); larger groups convert each half.
        __m512 v;
        if (L.gq <= 64) {
          v = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_mullo_epi32(_mm512_sub_epi32(acc_hi[m][b], cp), k254),
                                                  _mm512_sub_epi32(acc_lo[m][b], cp)));
        } else {
          v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc_hi[m][b], cp)), _mm512_set1_ps(254.0f),
                              _mm512_cvtepi32_ps(_mm512_sub_epi32(acc_lo[m][b], cp)));
        }
        float* c = C + m * ldc + b * 16;
        _mm512_storeu_ps(c, _mm512_fmadd_ps(v, _mm512_mul_ps(ws, _mm512_set1_ps(as)), _mm512_loadu_ps(c)));
      }
    }
  }
}

template <int MR>
void kern_nb(int nb, const uint8_t* B, const MatLayout& L, const uint32_t* const* A, float* C, int ldc) {
  switch (nb) {
    case 1: return kern<MR, 1>(B, L, A, C, ldc);
    case 2: return kern<MR, 2>(B, L, A, C, ldc);
    case 3: return kern<MR, 3>(B, L, A, C, ldc);
    case 4: return kern<MR, 4>(B, L, A, C, ldc);
  }
}

constexpr int kMR = 3;  // 3 rows x 4 panels x (hi, lo) = 24 zmm accumulators

void tile(const uint8_t* B, const MatLayout& L, int nb, const uint32_t* const* A, int mr, float* C, int ldc) {
  switch (mr) {
    case 1: return kern_nb<1>(nb, B, L, A, C, ldc);
    case 2: return kern_nb<2>(nb, B, L, A, C, ldc);
    case 3: return kern_nb<3>(nb, B, L, A, C, ldc);
  }
}

uint8_t* scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes + 64) buf.resize(bytes + 64 + bytes / 4);
  uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<uint8_t*>((p + 63) & ~uintptr_t(63));
}

float* cbuf(int64_t M) {
  thread_local std::vector<float> c;
  if (c.size() < size_t(M + kMR) * 64) c.resize(size_t(M + kMR) * 64);
  return c.data();
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__m512 silu_mul(__m512 g, __m512 u) {  // g * u / (1 + exp(-g)), Cephes expf
  __m512 x = _mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), g), _mm512_set1_ps(-88.3762626647949f)),
                           _mm512_set1_ps(88.3762626647949f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  __m512 ex = _mm512_scalef_ps(p, n);
  return _mm512_div_ps(_mm512_mul_ps(g, u), _mm512_add_ps(_mm512_set1_ps(1.0f), ex));
}

// Phases as in moe_body.inc: quantize x | gate/up -> act (f32) | quantize act | down -> Y | reduce.
void forward_chunk(const Layout& L, const uint8_t* packed, int64_t T, int64_t k, const int64_t* ids, const float* wts,
                   const float* x, float* out, ThreadPool& pool) {
  const int64_t H = L.d.H;
  Routing rt;
  rt.build(L.d.E, T, k, ids);
  const int64_t R = int64_t(rt.rows.size());
  if (R == 0) {
    std::memset(out, 0, size_t(T * H) * sizeof(float));
    return;
  }
  const size_t xq_stride = L.gu.row_units(), aq_stride = L.dn.row_units();
  const size_t act_stride = size_t(L.gu.nb * 16), y_stride = size_t(L.dn.nb * 16);
  const size_t xq_bytes = round_up(size_t(T) * xq_stride * 4, 64), act_bytes = round_up(size_t(R) * act_stride * 4, 64);
  const size_t aq_bytes = round_up(size_t(R) * aq_stride * 4, 64);
  uint8_t* base = scratch(xq_bytes + act_bytes + aq_bytes + size_t(R) * y_stride * 4);
  uint32_t* xq = reinterpret_cast<uint32_t*>(base);                                // [T, xq_stride]
  float* act = reinterpret_cast<float*>(base + xq_bytes);                          // [R, act_stride]
  uint32_t* aq = reinterpret_cast<uint32_t*>(base + xq_bytes + act_bytes);         // [R, aq_stride]
  float* Y = reinterpret_cast<float*>(base + xq_bytes + act_bytes + aq_bytes);     // [R, y_stride]

  const bool prof = tuning().profile;  // TESSERA_PROFILE=1: wall time per phase on stderr, as moe_body.inc prints
  const double t_start = prof ? now_us() : 0.0;
  if (T <= 8) {
    for (int64_t t = 0; t < T; ++t) quantize_row(x + t * H, L.gu, xq + size_t(t) * xq_stride);
  } else {
    pool.parallel_for(T, [&](int64_t t, int) { quantize_row(x + t * H, L.gu, xq + size_t(t) * xq_stride); });
  }

  const double t_x = prof ? now_us() : 0.0;
  const int64_t groups_i = (L.gu.nb + 1) / 2, n_active = int64_t(rt.active.size());
  pool.parallel_for(n_active * groups_i, [&](int64_t task, int) {
    const int64_t e = rt.active[size_t(task / groups_i)], b0 = (task % groups_i) * 2;
    const int nblk = int(std::min<int64_t>(2, L.gu.nb - b0));
    const int64_t r0 = rt.offset[size_t(e)], M = rt.offset[size_t(e + 1)] - r0;
    float* C = cbuf(M);
    const uint32_t* A[kMR];
    for (int64_t m0 = 0; m0 < M; m0 += kMR) {
      const int mr = int(std::min<int64_t>(kMR, M - m0));
      for (int i = 0; i < mr; ++i) A[i] = xq + size_t(rt.rows[size_t(r0 + m0 + i)] / k) * xq_stride;
      tile(L.gu_panel(packed, e, 2 * b0), L.gu, 2 * nblk, A, mr, C + m0 * 64, 64);
    }
    for (int64_t i = 0; i < M; ++i)
      for (int blk = 0; blk < nblk; ++blk) {
        const float* c = C + i * 64 + blk * 32;
        _mm512_storeu_ps(act + size_t(r0 + i) * act_stride + (b0 + blk) * 16,
                         silu_mul(_mm512_loadu_ps(c), _mm512_loadu_ps(c + 16)));
      }
  });

  const double t_gu = prof ? now_us() : 0.0;
  auto quantize_act = [&](int64_t r, int) { quantize_row(act + size_t(r) * act_stride, L.dn, aq + size_t(r) * aq_stride); };
  if (R <= 16) {  // decode: a few rows, cheaper than a pool phase
    for (int64_t r = 0; r < R; ++r) quantize_act(r, 0);
  } else {
    pool.parallel_for(R, quantize_act);
  }

  const double t_aq = prof ? now_us() : 0.0;
  const int64_t groups_h = (L.dn.nb + 3) / 4;
  pool.parallel_for(n_active * groups_h, [&](int64_t task, int) {
    const int64_t e = rt.active[size_t(task / groups_h)], p0 = (task % groups_h) * 4;
    const int nb = int(std::min<int64_t>(4, L.dn.nb - p0));
    const int64_t r0 = rt.offset[size_t(e)], M = rt.offset[size_t(e + 1)] - r0;
    float* C = cbuf(M);
    const uint32_t* A[kMR];
    for (int64_t m0 = 0; m0 < M; m0 += kMR) {
      const int mr = int(std::min<int64_t>(kMR, M - m0));
      for (int i = 0; i < mr; ++i) A[i] = aq + size_t(r0 + m0 + i) * aq_stride;
      tile(L.dn_panel(packed, e, p0), L.dn, nb, A, mr, C + m0 * 64, 64);
    }
    for (int64_t i = 0; i < M; ++i) {
      const int64_t r = r0 + i;
      const __m512 w = _mm512_set1_ps(wts[rt.rows[size_t(r)]]);
      float* yrow = Y + size_t(r) * y_stride + p0 * 16;
      for (int j = 0; j < nb * 16; j += 16) _mm512_storeu_ps(yrow + j, _mm512_mul_ps(w, _mm512_loadu_ps(C + i * 64 + j)));
    }
  });

  const double t_down = prof ? now_us() : 0.0;
  const int64_t chunk = 256, chunks = (H + chunk - 1) / chunk;
  auto reduce = [&](int64_t task, int) {
    const int64_t t = task / chunks, h0 = (task % chunks) * chunk, h1 = std::min(H, h0 + chunk);
    float* o = out + size_t(t * H);
    std::memset(o + h0, 0, size_t(h1 - h0) * 4);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = rt.row_of[size_t(t * k + j)];
      if (r < 0) continue;
      const float* y = Y + size_t(r) * y_stride;
      int64_t h = h0;
      for (; h + 16 <= h1; h += 16) _mm512_storeu_ps(o + h, _mm512_add_ps(_mm512_loadu_ps(o + h), _mm512_loadu_ps(y + h)));
      for (; h < h1; ++h) o[h] += y[h];
    }
  };
  if (T <= 4) {  // decode: ~k*H adds, cheaper than a pool phase
    for (int64_t task = 0; task < T * chunks; ++task) reduce(task, 0);
  } else {
    pool.parallel_for(T * chunks, reduce);
  }
  if (prof)
    std::fprintf(stderr, "tessera int8 T=%lld R=%lld experts=%lld: quantize x %.0f us, gate/up %.0f us, quantize act %.0f us, "
                 "down %.0f us, reduce %.0f us\n", (long long)T, (long long)R, (long long)n_active, t_x - t_start,
                 t_gu - t_x, t_aq - t_gu, t_down - t_aq, now_us() - t_down);
}

void forward(const uint8_t* packed, int64_t T, int64_t k, const int64_t* ids, const float* wts, const float* x,
             float* out, ThreadPool& pool) {
  const Layout L = read_layout(packed);
  for (int64_t t0 = 0; t0 < T; t0 += kMaxChunkTokens) {  // bounded scratch for long prompts (moe_panels.h)
    const int64_t n = std::min(kMaxChunkTokens, T - t0);
    forward_chunk(L, packed, n, k, ids + t0 * k, wts + t0 * k, x + t0 * L.d.H, out + t0 * L.d.H, pool);
  }
}

}  // namespace
}  // namespace avx512_int8
}  // namespace tessera

// Baseline code from here: supported() and the registration run on every CPU.
TESSERA_ISA_END

namespace tessera {
namespace avx512_int8 {
namespace {
bool supported(const CpuFeatures& c, std::string* why) {
  if (!(c.avx512f && c.avx512bw && c.avx512vl && c.avx512dq && c.avx512_vnni)) {
    *why = "CPU lacks avx512_vnni (or avx512f/bw/vl/dq)";
    return false;
  }
  if (!c.os_avx512) {
    *why = "OS does not enable AVX-512 state (XCR0)";
    return false;
  }
  *why = group_param() ? "int8 weights (group " + std::to_string(group_param()) + "), VNNI"
                       : std::string("int8 weights (per channel), VNNI");
  return true;
}

const BackendOps kOps = {kName, IsaLevel::AVX512, false, 25, "int8",
                         "AVX-512 VNNI, int8 weights in groups, two-digit int8 activations", supported, packed_bytes, pack, unpack, forward};
TESSERA_REGISTER_BACKEND(kOps);

}  // namespace
}  // namespace avx512_int8
}  // namespace tessera
