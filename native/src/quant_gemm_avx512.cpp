// Quantized prefill GEMM, AVX-512 VNNI: R weight rows (one driver task, <= kRowGroup) times nt tokens (<= kTokenBlock)
// on the file's blocks, for every type of quant_kernels.h. Decode (nt = 1) stays with the mat-vec (dot_direct).
//
// Why a GEMM: the mat-vec path keeps one row's 256 decoded values in registers and runs each token over them with
// vpmaddubsw + vpdpwssd (2 multiply ops per 64 MACs) and a 16-lane f32 accumulator per (row, token), reduced across
// lanes at the end. Here the lanes are tokens instead: 16 tokens per zmm, their int8 activations transposed so that
// one int32 lane holds 4 consecutive values of one token, and one vpdpbusd multiplies 4 consecutive codes of a row
// (broadcast) by those 16 tokens' 4 values: 64 MACs per op, one op. The sub-scale A_g of the row's 16- or 32-value
// group is applied once per (row, group, 16 tokens) in f32 (convert + FMA), the token scale dx once per (row, 256
// values, 16 tokens), and the B term (mins, code offsets) is a small f32 GEMM of the rows' B_g by the tokens' dx * sum(q)
// per group, one FMA per (row, group, 16 tokens). No horizontal sums.
//
// Steps per call: (1) transpose the tokens' activations 16 at a time; (2) per 8 rows (a micro-tile), decode the rows
// once into a per-thread scratch that stays in L1 (u8 codes, f32 A_g and B_g by SIMD decoders that give
// quant_body.inc's values), prefetch the next 8 rows' blocks, and run the register micro-kernel for every 16-token
// group (8 int32 group sums, 8 f32 partial sums per 256 values, 8 f32 results = 24 zmm). Rows past R are decoded as
// zeros and not stored; tokens past nt are zero and not stored.
//
// Arithmetic: u8 codes x int8 activations summed exactly in int32 per group, then f32. Not bit-identical to the
// mat-vec path (different f32 rounding order; tests hold both to Reference at NMSE 1e-10), but each (row, token)
// result depends only on that row and that token, not on which other rows or tokens share the call.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "quant_kernels.h"
#include "tessera/bf16.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_VNNI)

namespace tessera {
namespace quant {
namespace {

#include "quant_body.inc"

constexpr int kLanes = 16;  // tokens per zmm
constexpr int kMR = 8;      // rows per micro-tile

// 16 x 16 int32 transpose in registers: r[i] lane j -> r[j] lane i.
__attribute__((always_inline)) inline void transpose16(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // r[4i + j], 128-bit lane L: element 4L + j of rows 4i .. 4i + 3.
  for (int j = 0; j < 4; ++j) {
    const __m512i a = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88), b = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xDD);
    const __m512i c = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88), d = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xDD);
    t[j] = _mm512_shuffle_i32x4(a, c, 0x88);
    t[8 + j] = _mm512_shuffle_i32x4(a, c, 0xDD);
    t[4 + j] = _mm512_shuffle_i32x4(b, d, 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(b, d, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// One 16-token group's activations: xt [Kq/4][16] int32 (4 int8 values of one token per lane), dx [nsb][16], and per
// G-value group g either (off > 0) the integer start of its dot, z [g][16] = -off * sum(q), or (off = 0) the B term's
// factor sb [g][16] = dx * sum(q). Tokens past n: zero.
template <int G>
void pack_tokens(const ActRow* xs, int n, int64_t Kq, int off, const int8_t* zeros, int32_t* xt, float* dx,
                 float* sb, int32_t* z) {
  const int64_t nsb = Kq / 256, ng = Kq / G;
  const int8_t* q[kLanes];
  for (int l = 0; l < kLanes; ++l) q[l] = l < n ? xs[l].q : zeros;
  for (int64_t k = 0; k < Kq; k += 64) {
    __m512i r[16];
    for (int l = 0; l < kLanes; ++l) r[l] = _mm512_loadu_si512(q[l] + k);
    transpose16(r);
    for (int j = 0; j < 16; ++j) _mm512_storeu_si512(xt + (k / 4 + j) * kLanes, r[j]);
  }
  for (int64_t s = 0; s < nsb; ++s)
    for (int l = 0; l < kLanes; ++l) dx[s * kLanes + l] = l < n ? xs[l].d256[s] : 0.0f;
  // One token (lane) at a time, so its row pointers stay in registers; the same operations as per group.
  for (int l = 0; l < kLanes; ++l) {
    if (off > 0) {
      const int16_t* bs = xs[l].bs16;
      for (int64_t g = 0; g < ng; ++g)
        z[g * kLanes + l] = l >= n ? 0 : -off * (G == 16 ? bs[g] : bs[2 * g] + bs[2 * g + 1]);
    } else {
      const float* s16 = xs[l].s16;
      for (int64_t g = 0; g < ng; ++g)
        sb[g * kLanes + l] = l >= n ? 0.0f : G == 16 ? s16[g] : s16[2 * g] + s16[2 * g + 1];
    }
  }
}

// SIMD row decoders for decode_panel: one row of K values straight from its blocks -> codes ur [K] and, per G-value
// group g < K / G, ar[g] = A_g (and br[g] = B_g where the B term is not an integer offset, i.e. Q4_K / Q5_K). Each value
// is the one unpack_row_body (quant_body.inc) gives, by the same single f32 operations (A = d * float(sc), B = dmin *
// float(m)); only the code unpacking is vectorized. The caller zeroes what lies past K.

// Q4_K / Q5_K (G = 32): nibbles j of bytes 32 j' .. 32 j' + 31 are values 64 j' + 32 j + l; Q5_K's bit 4 of value
// 32 s + l is bit s of qh[l].
template <bool kFive>
void decode_row_q45k(const uint8_t* src, int64_t K, uint8_t* ur, float* ar, float* br) {
  const int bytes = kFive ? 176 : 144;
  const __m256i lo4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  for (int64_t b = 0; b < K / 256; ++b) {
    const uint8_t* blk = src + bytes * b;
    const float d = load_f16(blk), dmin = load_f16(blk + 2);
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    uint8_t* ub = ur + 256 * b;
    const __m256i qh = kFive ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)) : _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
      __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
      if (kFive) {
        const __mmask32 ml = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1u << (2 * j))));
        const __mmask32 mh = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1u << (2 * j + 1))));
        lo = _mm256_mask_add_epi8(lo, ml, lo, bit4);
        hi = _mm256_mask_add_epi8(hi, mh, hi, bit4);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(ub + 64 * j), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(ub + 64 * j + 32), hi);
    }
    // The 8 6-bit scales and mins of the 12 packed bytes (scale_min_k4's values, by llama.cpp's u32 shuffle), then
    // A = d * float(sc), B = dmin * float(m) eight at a time.
    uint32_t q[4];
    std::memcpy(q, blk + 4, 12);
    const uint32_t sc_hi = (q[2] & 0x0f0f0f0fu) | (((q[0] >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((q[2] >> 4) & 0x0f0f0f0fu) | (((q[1] >> 6) & 0x03030303u) << 4);
    const uint64_t scs = uint64_t(q[0] & 0x3f3f3f3fu) | uint64_t(sc_hi) << 32;
    const uint64_t mins = uint64_t(q[1] & 0x3f3f3f3fu) | uint64_t(m_hi) << 32;
    const __m256 fsc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(scs))));
    const __m256 fm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(mins))));
    _mm256_storeu_ps(ar + 8 * b, _mm256_mul_ps(_mm256_set1_ps(d), fsc));
    _mm256_storeu_ps(br + 8 * b, _mm256_mul_ps(_mm256_set1_ps(dmin), fm));
  }
}

// Q6_K (G = 16; B = 32 A is the integer offset): value 32 (4 h + 2 s + k) + l = nibble s of ql[64 h + 32 k + l] plus
// bits 2 (2 s + k) .. +1 of qh[32 h + l] as bits 4-5.
void decode_row_q6k(const uint8_t* src, int64_t K, uint8_t* ur, float* ar) {
  const __m256i lo4 = _mm256_set1_epi8(0x0F), lo2 = _mm256_set1_epi8(0x03);
  for (int64_t b = 0; b < K / 256; ++b) {
    const uint8_t* blk = src + 210 * b;
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = load_f16(blk + 208);
    uint8_t* ub = ur + 256 * b;
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      for (int k = 0; k < 2; ++k) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * k));
        for (int s = 0; s < 2; ++s) {
          const __m256i nib = s ? _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4) : _mm256_and_si256(v, lo4);
          // 16-bit shifts: after the & 3 each byte holds only its own bits, so the << 4 stays inside it.
          const __m256i top = _mm256_slli_epi16(
              _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * (2 * s + k))), lo2), 4);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(ub + 32 * (4 * h + 2 * s + k)), _mm256_or_si256(nib, top));
        }
      }
    }
    const __m512 fsc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc))));
    _mm512_storeu_ps(ar + 16 * b, _mm512_mul_ps(_mm512_set1_ps(d), fsc));  // A = d * float(sc), 16 at a time
  }
}

// Q8_0 / Q4_0 / IQ4_XS (G = 32, integer offsets 128 / 8 / 128): codes q + 128, the two nibbles, kvalues[nibble] + 128.
void decode_row_q8_0(const uint8_t* src, int64_t K, uint8_t* ur, float* ar) {
  const __m256i flip = _mm256_set1_epi8(char(0x80));
  for (int64_t b = 0; b < K / 32; ++b) {
    const uint8_t* blk = src + 34 * b;
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ur + 32 * b), _mm256_xor_si256(q, flip));
    ar[b] = load_f16(blk);
  }
}

void decode_row_q4_0(const uint8_t* src, int64_t K, uint8_t* ur, float* ar) {
  const __m128i lo4 = _mm_set1_epi8(0x0F);
  for (int64_t b = 0; b < K / 32; ++b) {
    const uint8_t* blk = src + 18 * b;
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(ur + 32 * b), _mm_and_si128(v, lo4));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(ur + 32 * b + 16), _mm_and_si128(_mm_srli_epi16(v, 4), lo4));
    ar[b] = load_f16(blk);
  }
}

void decode_row_iq4_xs(const uint8_t* src, int64_t K, uint8_t* ur, float* ar) {
  const __m128i lo4 = _mm_set1_epi8(0x0F);
  alignas(16) uint8_t book[16];
  for (int i = 0; i < 16; ++i) book[i] = uint8_t(kIQ4Values[i] + 128);
  const __m128i table = _mm_load_si128(reinterpret_cast<const __m128i*>(book));
  for (int64_t b = 0; b < K / 256; ++b) {
    const uint8_t* blk = src + 136 * b;
    const float d = load_f16(blk);
    const unsigned scales_h = unsigned(blk[2]) | unsigned(blk[3]) << 8;
    for (int ib = 0; ib < 8; ++ib) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 8 + 16 * ib));
      uint8_t* u = ur + 256 * b + 32 * ib;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(u), _mm_shuffle_epi8(table, _mm_and_si128(v, lo4)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(u + 16),
                       _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(v, 4), lo4)));
      const int ls = ((blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
      ar[8 * b + ib] = d * float(ls - 32);
    }
  }
}

// One row by its type's SIMD decoder, then zeros past K (codes up to Kq, A and B up to ng).
template <int G>
void decode_row(QType t, const uint8_t* src, int64_t K, int64_t Kq, uint8_t* ur, float* ar, float* br) {
  switch (t) {
    case QType::Q4_K: decode_row_q45k<false>(src, K, ur, ar, br); break;
    case QType::Q5_K: decode_row_q45k<true>(src, K, ur, ar, br); break;
    case QType::Q6_K: decode_row_q6k(src, K, ur, ar); break;
    case QType::Q8_0: decode_row_q8_0(src, K, ur, ar); break;
    case QType::Q4_0: decode_row_q4_0(src, K, ur, ar); break;
    case QType::IQ4_XS: decode_row_iq4_xs(src, K, ur, ar); break;
  }
  std::memset(ur + K, 0, size_t(Kq - K));
  const bool has_b = t == QType::Q4_K || t == QType::Q5_K;  // the others' B is an integer offset (never read)
  for (int64_t g = K / G; g < Kq / G; ++g) {
    ar[g] = 0.0f;
    if (has_b) br[g] = 0.0f;
  }
}

// R rows from their blocks -> u [R8][Kq] codes, a [R8][ng] A_g, b [R8][ng] B_g (R8 = R rounded up to kMR; the rows
// past R and the values past K are zero; b is read only for Q4_K / Q5_K, whose B term is not an integer offset).
template <int G>
void decode_panel(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, int64_t Kq, uint8_t* u, float* a,
                  float* b) {
  const int64_t ng = Kq / G;
  const int R8 = (R + kMR - 1) / kMR * kMR;
  for (int r = 0; r < R8; ++r) {
    uint8_t* ur = u + r * Kq;
    float* ar = a + r * ng;
    float* br = b + r * ng;
    if (r < R) {
      decode_row<G>(t, w + size_t(r) * row_bytes, K, Kq, ur, ar, br);
      continue;
    }
    std::memset(ur, 0, size_t(Kq));
    std::fill(ar, ar + ng, 0.0f);
    std::fill(br, br + ng, 0.0f);
  }
}

// out[r][lane] for kMR rows x 16 tokens: sum over 256-value blocks s of dx[s] * sum_{g in s} A_g * dot_g, where
// dot_g = sum_{i in g} (u_i - off) q_i exactly in int32 (kOff: the group's dot starts at z[g] = -off * sum(q)),
// minus (!kOff, Q4_K/Q5_K's mins) sum_g B_g * sb[g].
template <int G, bool kOff>
__attribute__((always_inline)) inline void micro(const uint8_t* u, const float* a, const float* b, int64_t Kq,
                                                 const int32_t* xt, const float* dx, const float* sb, const int32_t* z,
                                                 __m512* acc) {
  const int64_t nsb = Kq / 256, ng = Kq / G;
  constexpr int kGroups = 256 / G, kSteps = G / 4;
  for (int r = 0; r < kMR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    __m512 part[kMR];
    for (int r = 0; r < kMR; ++r) part[r] = _mm512_setzero_ps();
    for (int gi = 0; gi < kGroups; ++gi) {
      const int64_t g = s * kGroups + gi;
      __m512i d[kMR];
      const __m512i d0 = kOff ? _mm512_load_si512(z + g * kLanes) : _mm512_setzero_si512();
      for (int r = 0; r < kMR; ++r) d[r] = d0;
      for (int j = 0; j < kSteps; ++j) {
        const int64_t k4 = g * kSteps + j;
        const __m512i x = _mm512_load_si512(xt + k4 * kLanes);
        for (int r = 0; r < kMR; ++r) {
          int32_t c;
          std::memcpy(&c, u + r * Kq + 4 * k4, 4);
          d[r] = _mm512_dpbusd_epi32(d[r], _mm512_set1_epi32(c), x);
        }
      }
      for (int r = 0; r < kMR; ++r) part[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r]), _mm512_set1_ps(a[r * ng + g]), part[r]);
    }
    const __m512 dxs = _mm512_load_ps(dx + s * kLanes);
    for (int r = 0; r < kMR; ++r) acc[r] = _mm512_fmadd_ps(part[r], dxs, acc[r]);
  }
  for (int64_t g = 0; g < (kOff ? 0 : ng); ++g) {
    const __m512 sv = _mm512_load_ps(sb + g * kLanes);
    for (int r = 0; r < kMR; ++r) acc[r] = _mm512_fnmadd_ps(_mm512_set1_ps(b[r * ng + g]), sv, acc[r]);
  }
}

// micro's arithmetic on the low 8 lanes of a group (its tokens 0..7) in ymm registers: a group's last tokens when
// they are 8 or fewer (a 16-lane zmm pass would spend half its lanes or more on padding; on Zen 4 two ymm vpdpbusd
// issue per cycle against one zmm). Lane for lane the same operations in the same order as micro: bit-identical.
template <int G, bool kOff>
__attribute__((always_inline)) inline void micro8(const uint8_t* u, const float* a, const float* b, int64_t Kq,
                                                  const int32_t* xt, const float* dx, const float* sb,
                                                  const int32_t* z, __m256* acc) {
  const int64_t nsb = Kq / 256, ng = Kq / G;
  constexpr int kGroups = 256 / G, kSteps = G / 4;
  for (int r = 0; r < kMR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    __m256 part[kMR];
    for (int r = 0; r < kMR; ++r) part[r] = _mm256_setzero_ps();
    for (int gi = 0; gi < kGroups; ++gi) {
      const int64_t g = s * kGroups + gi;
      __m256i d[kMR];
      const __m256i d0 = kOff ? _mm256_load_si256(reinterpret_cast<const __m256i*>(z + g * kLanes))
                              : _mm256_setzero_si256();
      for (int r = 0; r < kMR; ++r) d[r] = d0;
      for (int j = 0; j < kSteps; ++j) {
        const int64_t k4 = g * kSteps + j;
        const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(xt + k4 * kLanes));
        for (int r = 0; r < kMR; ++r) {
          int32_t c;
          std::memcpy(&c, u + r * Kq + 4 * k4, 4);
          d[r] = _mm256_dpbusd_epi32(d[r], _mm256_set1_epi32(c), x);
        }
      }
      for (int r = 0; r < kMR; ++r)
        part[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[r]), _mm256_set1_ps(a[r * ng + g]), part[r]);
    }
    const __m256 dxs = _mm256_load_ps(dx + s * kLanes);
    for (int r = 0; r < kMR; ++r) acc[r] = _mm256_fmadd_ps(part[r], dxs, acc[r]);
  }
  for (int64_t g = 0; g < (kOff ? 0 : ng); ++g) {
    const __m256 sv = _mm256_load_ps(sb + g * kLanes);
    for (int r = 0; r < kMR; ++r) acc[r] = _mm256_fnmadd_ps(_mm256_set1_ps(b[r * ng + g]), sv, acc[r]);
  }
}

// Prefetch the blocks of rows [r0, r1) (contiguous) into L1 (kHint _MM_HINT_T0) or L2 (_MM_HINT_T1).
template <_mm_hint kHint>
inline void prefetch_rows(const uint8_t* w, size_t row_bytes, int r0, int r1) {
  const uint8_t* p = w + size_t(r0) * row_bytes;
  const size_t n = size_t(std::max(0, r1 - r0)) * row_bytes;
  for (size_t i = 0; i < n; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), kHint);
}

inline int offset_of(QType t) {
  return t == QType::Q8_0 || t == QType::IQ4_XS ? 128 : t == QType::Q6_K ? 32 : t == QType::Q4_0 ? 8 : 0;
}

template <int G>
void pack_all(QType t, int64_t K, const ActRow* xs, int nt, uint8_t* dst, const int8_t* zeros) {
  const int64_t Kq = padded_k256(K);
  const TokenLayout L(Kq, G);
  for (int gi = 0; gi * kLanes < nt; ++gi) {
    uint8_t* p = dst + gi * L.group();
    pack_tokens<G>(xs + gi * kLanes, std::min(kLanes, nt - gi * kLanes), Kq, offset_of(t), zeros,
                   reinterpret_cast<int32_t*>(p), reinterpret_cast<float*>(p + L.n_xt),
                   reinterpret_cast<float*>(p + L.n_xt + L.n_dx),
                   reinterpret_cast<int32_t*>(p + L.n_xt + L.n_dx + L.n_sb));
  }
}

// R rows over nt packed tokens; tile: scratch for one micro-tile (kMR rows of codes, A, B).
template <int G, bool kOff>
void gemm_on_packed(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tok, int nt,
                    float* out, uint8_t* tile) {
  const int64_t Kq = padded_k256(K), ng = Kq / G;
  const int ngroups = (nt + kLanes - 1) / kLanes;
  const TokenLayout L(Kq, G);
  const size_t n_u = align64(size_t(kMR * Kq)), n_ab = align64(size_t(kMR * ng) * 4);
  uint8_t* u = tile;
  float* a = reinterpret_cast<float*>(tile + n_u);
  float* b = reinterpret_cast<float*>(tile + n_u + n_ab);
  prefetch_rows<_MM_HINT_T0>(w, row_bytes, 0, std::min(R, kMR));
  prefetch_rows<_MM_HINT_T1>(w, row_bytes, kMR, std::min(R, 2 * kMR));
  // Micro-tiles of kMR rows: decode the tile's rows (prefetched), prefetch the next tiles', run every token group.
  for (int r0 = 0; r0 < R; r0 += kMR) {
    const int rn = std::min(kMR, R - r0);
    decode_panel<G>(t, w + size_t(r0) * row_bytes, row_bytes, rn, K, Kq, u, a, b);
    // The next tile's rows into L1 (already on their way to L2), the one after into L2.
    prefetch_rows<_MM_HINT_T0>(w, row_bytes, r0 + kMR, std::min(R, r0 + 2 * kMR));
    prefetch_rows<_MM_HINT_T1>(w, row_bytes, r0 + 2 * kMR, std::min(R, r0 + 3 * kMR));
    for (int gi = 0; gi < ngroups; ++gi) {
      const uint8_t* p = tok + gi * L.group();
      const int t0 = gi * kLanes, n = std::min(kLanes, nt - t0);
      const auto* xt = reinterpret_cast<const int32_t*>(p);
      const auto* dx = reinterpret_cast<const float*>(p + L.n_xt);
      const auto* sb = reinterpret_cast<const float*>(p + L.n_xt + L.n_dx);
      const auto* z = reinterpret_cast<const int32_t*>(p + L.n_xt + L.n_dx + L.n_sb);
      if (n <= kLanes / 2) {  // a short last group: its 8 low lanes in ymm
        const __mmask8 mask = __mmask8((1u << n) - 1);
        __m256 acc[kMR];
        micro8<G, kOff>(u, a, b, Kq, xt, dx, sb, z, acc);
        for (int r = 0; r < rn; ++r) _mm256_mask_storeu_ps(out + (r0 + r) * nt + t0, mask, acc[r]);
        continue;
      }
      const __mmask16 mask = __mmask16((1u << n) - 1);
      __m512 acc[kMR];
      micro<G, kOff>(u, a, b, Kq, xt, dx, sb, z, acc);
      for (int r = 0; r < rn; ++r) _mm512_mask_storeu_ps(out + (r0 + r) * nt + t0, mask, acc[r]);
    }
  }
}

inline size_t tile_bytes(int64_t Kq, int G) { return align64(size_t(kMR * Kq)) + 2 * align64(size_t(kMR * Kq / G) * 4); }

// One call: pack its tokens into the scratch, then the GEMM on them.
template <int G, bool kOff>
void gemm_g(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt, float* out) {
  const int64_t Kq = padded_k256(K);
  const int ngroups = (nt + kLanes - 1) / kLanes;
  // Scratch: one micro-tile (kMR rows: stays in L1), zero activations, then the packed token groups.
  const size_t n_tile = tile_bytes(Kq, G), n_zero = align64(size_t(Kq));
  uint8_t* base = gemm_scratch(n_tile + n_zero + ngroups * TokenLayout(Kq, G).group());
  int8_t* zeros = reinterpret_cast<int8_t*>(base + n_tile);
  uint8_t* tok = base + n_tile + n_zero;
  std::memset(zeros, 0, size_t(Kq));
  prefetch_rows<_MM_HINT_T0>(w, row_bytes, 0, std::min(R, kMR));
  pack_all<G>(t, K, xs, nt, tok, zeros);
  gemm_on_packed<G, kOff>(t, w, row_bytes, R, K, tok, nt, out, base);
}

template <int G>
void pack_g(QType t, int64_t K, const ActRow* xs, int nt, uint8_t* dst) {
  const int64_t Kq = padded_k256(K);
  uint8_t* zeros = gemm_scratch(size_t(Kq));
  std::memset(zeros, 0, size_t(Kq));
  pack_all<G>(t, K, xs, nt, dst, reinterpret_cast<const int8_t*>(zeros));
}

template <int G, bool kOff>
void packed_g(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tok, int nt, float* out) {
  gemm_on_packed<G, kOff>(t, w, row_bytes, R, K, tok, nt, out, gemm_scratch(tile_bytes(padded_k256(K), G)));
}

}  // namespace

size_t gemm_avx512_vnni_packed_bytes(QType t, int64_t K, int nt) {
  return size_t((nt + kLanes - 1) / kLanes) * TokenLayout(padded_k256(K), t == QType::Q6_K ? 16 : 32).group();
}

bool gemm_avx512_vnni_same_packing(QType a, QType b) {
  return (a == QType::Q6_K) == (b == QType::Q6_K) && offset_of(a) == offset_of(b);  // same G, same z or sb term
}

void silu_mul_avx512(float* g, const float* u, int64_t n) {
  // exp(x) = 2^m * p(r), x = m ln2 + r, |r| <= ln2/2 (Cephes expf's split of ln2 and its polynomial). vscalefps
  // saturates: x -> +inf gives inf (silu -> -0), x -> -inf gives 0 (silu -> g); NaN stays NaN.
  using E = ExpfCephes;
  const __m512 log2e = _mm512_set1_ps(E::kLog2e), c1 = _mm512_set1_ps(E::kC1), c2 = _mm512_set1_ps(E::kC2),
               one = _mm512_set1_ps(1.0f);
  const __m512 p0 = _mm512_set1_ps(E::kP[0]), p1 = _mm512_set1_ps(E::kP[1]), p2 = _mm512_set1_ps(E::kP[2]),
               p3 = _mm512_set1_ps(E::kP[3]), p4 = _mm512_set1_ps(E::kP[4]), p5 = _mm512_set1_ps(E::kP[5]);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + i), uv = _mm512_maskz_loadu_ps(m, u + i);
    const __m512 x = _mm512_sub_ps(_mm512_setzero_ps(), gv);  // exp(-g)
    const __m512 e2 = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fnmadd_ps(e2, c2, _mm512_fnmadd_ps(e2, c1, x));
    __m512 p = _mm512_fmadd_ps(p0, r, p1);
    p = _mm512_fmadd_ps(p, r, p2);
    p = _mm512_fmadd_ps(p, r, p3);
    p = _mm512_fmadd_ps(p, r, p4);
    p = _mm512_fmadd_ps(p, r, p5);
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, one));  // 1 + r + r^2 P(r)
    const __m512 ex = _mm512_scalef_ps(p, e2);
    _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, ex)), uv));
  }
}

void rows_to_tokens_avx512(const float* res, int R, int nt, float* const* dst, bool stream) {
  for (int s0 = 0; s0 < nt; s0 += 16) {
    const int ns = std::min(16, nt - s0);
    const __mmask16 smask = __mmask16((1u << ns) - 1);
    for (int r0 = 0; r0 < R; r0 += 16) {
      const int nr = std::min(16, R - r0);
      __m512i v[16];  // v[i] lane j: res[r0 + i][s0 + j]; rows past R and tokens past nt are zero (never stored)
      for (int i = 0; i < 16; ++i)
        v[i] = i < nr ? _mm512_castps_si512(_mm512_maskz_loadu_ps(smask, res + size_t(r0 + i) * nt + s0))
                      : _mm512_setzero_si512();
      transpose16(v);  // v[j] lane i: res[r0 + i][s0 + j]
      const __mmask16 rmask = __mmask16((1u << nr) - 1);
      for (int j = 0; j < ns; ++j) {
        float* d = dst[s0 + j] + r0;
        if (stream && nr == 16 && reinterpret_cast<uintptr_t>(d) % 64 == 0)  // a whole, aligned line: not read first
          _mm512_stream_ps(d, _mm512_castsi512_ps(v[j]));
        else
          _mm512_mask_storeu_ps(d, rmask, _mm512_castsi512_ps(v[j]));
      }
    }
  }
  if (stream) _mm_sfence();  // the streamed lines are visible before the pool's join publishes the task as done
}

void gemm_avx512_vnni_pack(QType t, int64_t K, const ActRow* xs, int nt, uint8_t* dst) {
  if (t == QType::Q6_K)
    pack_g<16>(t, K, xs, nt, dst);
  else
    pack_g<32>(t, K, xs, nt, dst);
}

void gemm_avx512_vnni_packed(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tokens,
                             int nt, float* out) {
  switch (t) {
    case QType::Q6_K: packed_g<16, true>(t, w, row_bytes, R, K, tokens, nt, out); break;
    case QType::Q4_K:
    case QType::Q5_K: packed_g<32, false>(t, w, row_bytes, R, K, tokens, nt, out); break;
    default: packed_g<32, true>(t, w, row_bytes, R, K, tokens, nt, out); break;  // Q8_0, Q4_0, IQ4_XS
  }
}

void gemm_avx512_vnni(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt,
                      float* out) {
  switch (t) {
    case QType::Q6_K: gemm_g<16, true>(t, w, row_bytes, R, K, xs, nt, out); break;
    case QType::Q4_K:
    case QType::Q5_K: gemm_g<32, false>(t, w, row_bytes, R, K, xs, nt, out); break;
    default: gemm_g<32, true>(t, w, row_bytes, R, K, xs, nt, out); break;  // Q8_0, Q4_0, IQ4_XS
  }
}

}  // namespace quant
}  // namespace tessera

TESSERA_ISA_END
