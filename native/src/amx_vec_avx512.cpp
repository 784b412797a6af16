// AVX-512 vector kernels of the AMX backends on the tile packing (contract in amx_vec.h): VNNI for int8, fp32 FMA on
// widened bf16 weights for bf16. AVX-512 VNNI + FMA code (isa_target.h), built with
// -ffp-contract=off; called only when vec_best() saw the CPU and OS support all of them.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "amx_vec.h"
#include "vnni_asm.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_VNNI)
#include "avx512_lanes.h"  // after BEGIN: compiled for this file's ISA

namespace tessera::amx {

namespace {

constexpr int kRowsPerPass = 4;  // bf16: token rows sharing each loaded weight row
// int8, as AVX512Int8's kernel (moe_avx512_int8.cpp): 3 token rows x 4 n-blocks x 2 digits = 24 zmm accumulators,
// so each 64-byte weight row is loaded once for up to 3 tokens and both digits, 4 weight streams in flight.
constexpr int kI8Rows = 3, kI8Blocks = 4;

inline __m512i bcast_quad(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline __mmask16 lane_mask(const MatLayout& L, int64_t nb) {
  const int64_t left = L.N - nb * kTileN;
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}

// 254 * hi + lo - corr (int32, wrapping like i8_two_digit_dot).
inline __m512i two_digit_dot(__m512i hi, __m512i lo, int32_t corr) {
  return _mm512_sub_epi32(_mm512_add_epi32(_mm512_mullo_epi32(hi, _mm512_set1_epi32(254)), lo),
                          _mm512_set1_epi32(corr));
}

// MR token rows x NB n-blocks from nb. The tiles of one n-block are consecutive, so its tile rows form one panel of
// Kp / 4 rows of 64 bytes (row q: 16 lanes x K quad q), read front to back. VPDPBUSD with the stored (+128, unsigned)
// weight row as the u8 operand and 4 activation bytes (hi or lo digit) broadcast as s8.
// Registers: the 2 x MR x NB int32 accumulators (24 at 3 x 4), NB weight rows and 2 broadcasts fill the 32 zmm, so
// every m/b loop is unrolled by pragma and each dot is vnni_asm.h's tied-register asm (GCC 12 kept the accumulator
// arrays of the intrinsic form on the stack: a copy in, a copy out and a store around every vpdpbusd, as in
// moe_avx512_int8.cpp before session 7). The f32 sums per (row, n-block) live in memory (facc), added to once per
// group in the same order as before: bit-identical.
template <int MR, int NB>
void i8_block(const MatLayout& L, const uint8_t* W, const int8_t* A, int64_t lda, const float* ascale,
              const int32_t* corr, int64_t nb, float* C, int64_t ldc) {
  const size_t panel = static_cast<size_t>(L.kblocks) * kBTileBytes;
  const uint8_t* P = L.tile(W, nb, 0);
  const int64_t quads = L.group / 4;
  alignas(64) float facc[MR][NB][16];
  _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i)
    _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) _mm512_store_ps(facc[i][b], _mm512_setzero_ps());
  for (int64_t g = 0; g < L.ngroups; ++g) {
    __m512i hi[MR][NB], lo[MR][NB];
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i)
      _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) hi[i][b] = lo[i][b] = _mm512_setzero_si512();
    for (int64_t q = g * quads; q < (g + 1) * quads; ++q) {
      __m512i w[NB];
      _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) {
        const uint8_t* p = P + b * panel + q * 64;
        _mm_prefetch(reinterpret_cast<const char*>(p + 1024), _MM_HINT_T0);
        w[b] = _mm512_load_si512(p);
      }
      _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
        const __m512i ah = bcast_quad(A + i * lda + 4 * q), al = bcast_quad(A + i * lda + L.Kp + 4 * q);
        _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) {
          TESSERA_VPDPBUSD_ZMM(hi[i][b], w[b], ah);  // u8 weight row . s8 activation quad
          TESSERA_VPDPBUSD_ZMM(lo[i][b], w[b], al);
        }
      }
    }
    _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) {
      const __m512 ws = _mm512_load_ps(L.scales(W, nb + b) + g * kTileN);
      _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
        const __m512i d = two_digit_dot(hi[i][b], lo[i][b], corr[i * L.ngroups + g]);
        const __m512 p = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), ws),
                                       _mm512_set1_ps(ascale[i * L.ngroups + g]));
        _mm512_store_ps(facc[i][b], _mm512_add_ps(_mm512_load_ps(facc[i][b]), p));
      }
    }
  }
  _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) {
    const __mmask16 mask = lane_mask(L, nb + b);
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i)
      _mm512_mask_storeu_ps(C + i * ldc + (nb + b) * kTileN, mask, _mm512_load_ps(facc[i][b]));
  }
}

template <int MR>
void i8_rows(int nbc, const MatLayout& L, const uint8_t* W, const int8_t* A, int64_t lda, const float* as,
             const int32_t* cr, int64_t nb, float* C, int64_t ldc) {
  switch (nbc) {
    case 4: return i8_block<MR, 4>(L, W, A, lda, as, cr, nb, C, ldc);
    case 3: return i8_block<MR, 3>(L, W, A, lda, as, cr, nb, C, ldc);
    case 2: return i8_block<MR, 2>(L, W, A, lda, as, cr, nb, C, ldc);
    default: return i8_block<MR, 1>(L, W, A, lda, as, cr, nb, C, ldc);
  }
}

void gemm_i8(const MatLayout& L, const uint8_t* W, const int8_t* A, int64_t lda, const float* ascale,
             const int32_t* corr, int64_t M, int64_t nb0, int64_t nb1, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; m += kI8Rows) {
    const int mr = static_cast<int>(std::min<int64_t>(kI8Rows, M - m));
    const int8_t* a = A + m * lda;
    const float* as = ascale + m * L.ngroups;
    const int32_t* cr = corr + m * L.ngroups;
    float* c = C + m * ldc;
    for (int64_t nb = nb0; nb < nb1; nb += kI8Blocks) {
      const int nbc = static_cast<int>(std::min<int64_t>(kI8Blocks, nb1 - nb));
      switch (mr) {
        case 3: i8_rows<3>(nbc, L, W, a, lda, as, cr, nb, c, ldc); break;
        case 2: i8_rows<2>(nbc, L, W, a, lda, as, cr, nb, c, ldc); break;
        default: i8_rows<1>(nbc, L, W, a, lda, as, cr, nb, c, ldc); break;
      }
    }
  }
}

// fp32 FMA on the bf16 pairs of each tile row: the even elements (low halves) and the odd ones (high halves) widened
// by a shift / mask, two accumulators per row (one per element of the pair).
template <int MR>
void bf16_rows(const MatLayout& L, const uint8_t* W, const float* A, int64_t lda, int64_t nb, float* C, int64_t ldc) {
  __m512 e[MR], o[MR];
  for (int i = 0; i < MR; ++i) e[i] = o[i] = _mm512_setzero_ps();
  const __m512i hi = _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u));
  for (int64_t kb = 0; kb < L.kblocks; ++kb) {
    const uint8_t* t = L.tile(W, nb, kb);
    const int64_t k0 = kb * kTileKBF16;
    for (int r = 0; r < 16; ++r) {
      const __m512i b = _mm512_load_si512(t + r * 64);
      const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
      const __m512 w1 = _mm512_castsi512_ps(_mm512_and_si512(b, hi));
      for (int i = 0; i < MR; ++i) {
        e[i] = _mm512_fmadd_ps(_mm512_set1_ps(A[i * lda + k0 + 2 * r]), w0, e[i]);
        o[i] = _mm512_fmadd_ps(_mm512_set1_ps(A[i * lda + k0 + 2 * r + 1]), w1, o[i]);
      }
    }
  }
  const __mmask16 mask = lane_mask(L, nb);
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(C + i * ldc + nb * kTileN, mask, _mm512_add_ps(e[i], o[i]));
}

void gemm_bf16(const MatLayout& L, const uint8_t* W, const float* A, int64_t lda, int64_t M, int64_t nb0,
               int64_t nb1, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; m += kRowsPerPass) {
    const int64_t mr = M - m < kRowsPerPass ? M - m : kRowsPerPass;
    const float* a = A + m * lda;
    float* c = C + m * ldc;
    for (int64_t nb = nb0; nb < nb1; ++nb) {
      switch (mr) {
        case 4: bf16_rows<4>(L, W, a, lda, nb, c, ldc); break;
        case 3: bf16_rows<3>(L, W, a, lda, nb, c, ldc); break;
        case 2: bf16_rows<2>(L, W, a, lda, nb, c, ldc); break;
        default: bf16_rows<1>(L, W, a, lda, nb, c, ldc); break;
      }
    }
  }
}

void i8_epilogue(const int32_t* hi, const int32_t* lo, const float* wscale, const float* ascale, const int32_t* corr,
                 int64_t as_stride, int rows, float* facc, int64_t ldf) {
  const __m512 ws = _mm512_loadu_ps(wscale);
  for (int r = 0; r < rows; ++r) {
    const __m512i d = two_digit_dot(_mm512_loadu_si512(hi + r * 16), _mm512_loadu_si512(lo + r * 16),
                                    corr[r * as_stride]);
    const __m512 p = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), ws), _mm512_set1_ps(ascale[r * as_stride]));
    _mm512_storeu_ps(facc + r * ldf, _mm512_add_ps(_mm512_loadu_ps(facc + r * ldf), p));
  }
}

// exp_poly::exp and silu_mul (amx_vec.h) lane-wise, operation for operation.
inline __m512 exp16(__m512 x) {
  using namespace exp_poly;
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kLo)), _mm512_set1_ps(kHi));
  const __m512 rnd = _mm512_set1_ps(kRound);
  const __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), rnd), rnd);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(kC1)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(kC2)));
  __m512 p = _mm512_set1_ps(kP0);
  for (float c : {kP1, kP2, kP3, kP4, kP5}) p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
  const __m512 y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

void silu_mul_rows(float* g, const float* u, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
    const __m512 q = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_storeu_ps(g + i, _mm512_mul_ps(q, _mm512_loadu_ps(u + i)));
  }
  for (; i < n; ++i) g[i] = silu_mul(g[i], u[i]);
}

// One digit of quantize_row_i8: round to nearest even (the MXCSR default) of clamp(v * inv, +-127), 0 where the
// product is NaN or the lane is outside m.
inline __m512i digit16(__m512 v, __m512 inv, __mmask16 m) {
  const __m512 p = _mm512_mul_ps(v, inv);
  const __m512 c = _mm512_min_ps(_mm512_max_ps(p, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  return _mm512_maskz_cvtps_epi32(m & ~_mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q), c);
}

// amax / 127 of a group's values [k0, k1), read 16 at a time by load(mask, k) (lanes outside mask zero), as
// amx_pack.cpp's group_scale: 0 for a group with no column, NaN when any value is NaN.
template <class Load>
inline float group_scale(int64_t k0, int64_t k1, Load load) {
  __m512 amax = _mm512_setzero_ps();
  __mmask16 nan = 0;
  for (int64_t k = k0; k < k1; k += 16) {
    const __m512 v = load(tail_mask(k1 - k), k);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  return k0 >= k1 ? 0.0f : nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(amax) / 127.0f;
}

// quantize_row_i8 (amx_pack.cpp) 16 lanes at a time: the same amax, scale, reciprocals, residual (an unfused
// multiply and subtract), clamp and rounding, so both digits, scales and corrections match bit for bit.
void quantize_i8(const MatLayout& L, const float* x, int8_t* q, float* scales, int32_t* corr) {
  int8_t* lo = q + L.Kp;
  for (int64_t g = 0; g < L.ngroups; ++g) {
    const int64_t k0 = g * L.group, k1 = std::min(L.K, k0 + L.group);
    const float s = group_scale(k0, k1, [&](__mmask16 m, int64_t k) { return _mm512_maskz_loadu_ps(m, x + k); });
    scales[g] = s / 254.0f;
    const float inv = s == 0.0f ? 0.0f : 1.0f / s;
    const __m512 vinv = _mm512_set1_ps(inv), vinv_lo = _mm512_set1_ps(inv * 254.0f), vs = _mm512_set1_ps(s);
    __m512i sum_hi = _mm512_setzero_si512(), sum_lo = _mm512_setzero_si512();
    for (int64_t k = k0; k < k1; k += 16) {
      const __mmask16 m = tail_mask(k1 - k);
      const __m512 v = _mm512_maskz_loadu_ps(m, x + k);
      const __m512i h = digit16(v, vinv, m);
      const __m512 r = _mm512_sub_ps(v, _mm512_mul_ps(_mm512_cvtepi32_ps(h), vs));
      const __m512i l = digit16(r, vinv_lo, m);
      sum_hi = _mm512_add_epi32(sum_hi, h);
      sum_lo = _mm512_add_epi32(sum_lo, l);
      _mm_mask_storeu_epi8(q + k, m, _mm512_cvtepi32_epi8(h));
      _mm_mask_storeu_epi8(lo + k, m, _mm512_cvtepi32_epi8(l));
    }
    const uint32_t sh = static_cast<uint32_t>(_mm512_reduce_add_epi32(sum_hi));
    const uint32_t sl = static_cast<uint32_t>(_mm512_reduce_add_epi32(sum_lo));
    corr[g] = static_cast<int32_t>(128u * (254u * sh + sl));
  }
  if (L.Kp > L.K) {
    std::memset(q + L.K, 0, L.Kp - L.K);
    std::memset(lo + L.K, 0, L.Kp - L.K);
  }
}

// quantize_weight_row_bf16 (amx_pack.cpp) 16 lanes at a time: bf16 widened exactly, the same amax (NaN anywhere
// in a group makes its scale NaN and its bytes 128), scale, reciprocal, clamp and rounding (cvtps under the default
// MXCSR: round to nearest even, as round_even), so bytes and scales match bit for bit.
void quantize_weight_bf16(const MatLayout& L, const uint16_t* w, uint8_t* out, float* scales, int64_t scale_stride) {
  for (int64_t g = 0; g < L.ngroups; ++g) {
    const int64_t k0 = g * L.group, k1 = std::min(L.K, k0 + L.group);
    const float s = group_scale(k0, k1, [&](__mmask16 m, int64_t k) { return load_bf16x16(m, w + k); });
    scales[g * scale_stride] = s;
    const __m512 vinv = _mm512_set1_ps(s == 0.0f ? 0.0f : 1.0f / s);
    for (int64_t k = k0; k < k1; k += 16) {
      const __mmask16 m = tail_mask(k1 - k);
      const __m512i q = _mm512_add_epi32(digit16(load_bf16x16(m, w + k), vinv, m), _mm512_set1_epi32(128));
      _mm_mask_storeu_epi8(out + k, m, _mm512_cvtepi32_epi8(q));
    }
  }
}

// f32_to_bf16 (tessera/bf16.h) lane-wise: round to nearest even, NaN -> quiet NaN; 16 lanes, each result in the low
// 16 bits of its 32-bit lane.
inline __m512i bf16_lanes(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

void convert_bf16(const MatLayout& L, const float* x, uint16_t* q) {
  for (int64_t k = 0; k < L.K; k += 16) {
    const __mmask16 m = tail_mask(L.K - k);
    _mm256_mask_storeu_epi16(q + k, m, _mm512_cvtepi32_epi16(bf16_lanes(_mm512_maskz_loadu_ps(m, x + k))));
  }
  for (int64_t k = L.K; k < L.Kp; ++k) q[k] = 0;
}

// Products below FLT_MIN in magnitude (denormals) as signed zero, as VCVTNE2PS2BF16 reads them (amx_vec.h).
inline __m512 flush_denormals(__m512 v) {
  const __m512 magnitude = _mm512_abs_ps(v);
  const __mmask16 tiny = _mm512_cmp_ps_mask(magnitude, _mm512_set1_ps(std::numeric_limits<float>::min()), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(v, tiny, _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v),
                                                                          _mm512_set1_epi32(int(0x80000000u)))));
}

// The scalar twin's contract: each int8 tile row r (K quad 4 r .. 4 r + 3 of 16 lanes) gives bf16 rows 2 (r % 8) and
// 2 (r % 8) + 1 of bf16 tile 2 kb + r / 8, as (K, K + 1) pairs per lane. Both variants below walk the rows with this:
// f[q] = float(w_q) * scale for the row's 4 K values q per lane, and where its 64 bf16 pairs go.
struct DequantRow {
  const MatLayout& L;
  const uint8_t* W;
  int64_t nb;
  uint16_t* out;
  __attribute__((always_inline)) inline uint16_t* products(int64_t kb, int r, __m512 f[4]) const {
    const __m512 scale = _mm512_loadu_ps(L.scales(W, nb) + ((kb * kTileKInt8) / L.group) * kTileN);
    const __m512i v = _mm512_xor_si512(_mm512_load_si512(L.tile(W, nb, kb) + r * 64),
                                       _mm512_set1_epi32(int(0x80808080u)));  // bytes w_q, signed
    for (int q = 0; q < 4; ++q)
      f[q] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * q), 24)), scale);
    return out + (2 * kb + r / 8) * 512 + (r % 8) * 64;
  }
};

void dequant_bf16(const MatLayout& L, const uint8_t* W, int64_t nb, uint16_t* out) {
  const DequantRow row{L, W, nb, out};
  for (int64_t kb = 0; kb < L.kblocks; ++kb)
    for (int r = 0; r < 16; ++r) {
      __m512 f[4];
      uint16_t* dst = row.products(kb, r, f);
      __m512i b[4];
      for (int q = 0; q < 4; ++q) b[q] = bf16_lanes(flush_denormals(f[q]));
      _mm512_storeu_si512(dst, _mm512_or_si512(b[0], _mm512_slli_epi32(b[1], 16)));
      _mm512_storeu_si512(dst + 32, _mm512_or_si512(b[2], _mm512_slli_epi32(b[3], 16)));
    }
}

// dequant_bf16 on CPUs with AVX512_BF16 (every AMX CPU): VCVTNE2PS2BF16 rounds two vectors of products in one
// instruction (to nearest even, NaN quiet, denormal inputs as signed zero: the same bits as above, checked on every
// f32 class), and a word permute interleaves them into the (K, K + 1) pairs. A third of the instructions of the
// shift-and-add rounding: the dequantization was 36 % of an AMXInt8 forward at 4096 tokens (docs/BENCHMARKS.md,
// session 20).
__attribute__((target("avx512bf16"))) void dequant_bf16_avx512bf16(const MatLayout& L, const uint8_t* W, int64_t nb,
                                                                   uint16_t* out) {
  const DequantRow row{L, W, nb, out};
  // word 2 i <- word i (the first vector's lane i), word 2 i + 1 <- word 16 + i (the second's)
  const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t kb = 0; kb < L.kblocks; ++kb)
    for (int r = 0; r < 16; ++r) {
      __m512 f[4];
      uint16_t* dst = row.products(kb, r, f);
      _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(f[1], f[0])));
      _mm512_storeu_si512(dst + 32, _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(f[3], f[2])));
    }
}

}  // namespace

}  // namespace tessera::amx

// Baseline from here: vec_best() calls this on every CPU.
TESSERA_ISA_END

namespace tessera::amx {

const VecKernels* vec_avx512() {
  static const VecKernels k{"avx512", gemm_i8, gemm_bf16, i8_epilogue, silu_mul_rows, quantize_i8, convert_bf16,
                            dequant_bf16, quantize_weight_bf16};
  return &k;
}

const VecKernels* vec_avx512_bf16() {
  static const VecKernels k{"avx512+bf16", gemm_i8, gemm_bf16, i8_epilogue, silu_mul_rows, quantize_i8, convert_bf16,
                            dequant_bf16_avx512bf16, quantize_weight_bf16};
  return &k;
}

}  // namespace tessera::amx
