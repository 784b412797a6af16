// Quantized prefill GEMM, AVX2: R weight rows (one driver task, <= kRowGroup) times nt tokens (<= kTokenBlock) on
// the file's blocks, for every type of quant_kernels.h: the AVX2 twin of quant_gemm_avx512.cpp, for CPUs without
// AVX-512. AVX2 has no vpdpbusd; AVX-VNNI's 256-bit one (a CPUID flag of its own) is not used: no development machine
// here has it to test on.
//
// Why a GEMM: the AVX2 row path (quant_avx2.cpp) runs every token over a 4-row tile: per 32 values of one (row, token)
// a maddubs, a madd, an int -> f32 conversion, a multiply by A * dx and an FMA into a lane accumulator, then a
// horizontal sum. Here the 8 lanes of a ymm are 8 tokens, their int8 activations transposed so that one int32 lane
// holds 4 consecutive values of one token; 4 consecutive codes of a row are broadcast and vpmaddubsw multiplies them
// by those 8 tokens' 4 values (32 MACs, int16 pair sums). The int16 pair sums of several steps are added in int16 while
// they provably cannot overflow (below), then one vpmaddwd by ones widens them to int32; the group's sub-scale A_g is
// applied once per (row, 16- or 32-value group, 8 tokens) in f32, the token scale dx once per (row, 256 values, 8
// tokens), the B term (Q4_K/Q5_K mins) as a small f32 GEMM of B_g by dx * sum(q). No horizontal sums.
//
// int16 bounds (activations q in [-127, 127], quant_body.inc clamps them; vpmaddubsw saturates past 32767):
//   Q4_0, Q4_K  codes 0..15: one vpmaddubsw lane <= 2 * 15 * 127 = 3810,  8 steps (a 32-group) in int16 <= 30480
//   Q5_K        codes 0..31: <= 7874,  4 steps in int16 <= 31496
//   Q6_K        codes 0..63: <= 16002, 2 steps in int16 <= 32004
//   Q8_0, IQ4_XS (codes u = s + 128, s in [-128, 127]): the sign trick, |s| x sign(q, s) <= 2 * 128 * 127 = 32512,
//               one step per vpmaddwd; A * u - B = A * s exactly (B = 128 A), so no B term and no offset.
// Q4_0 and Q6_K subtract their code offset (8, 32) as an integer start z = -off * sum(q) of each group's dot, as the
// AVX-512 GEMM does. So every group's dot is the exact integer sum_i (u_i - off) q_i, as in every other path.
//
// Steps per call: (1) transpose the tokens' activations 8 at a time; (2) per 4 rows, decode them once into a per-thread
// scratch (u8 codes, f32 A_g and B_g: the same values as quant_body.inc's unpack, by SIMD per block; wide types also
// get the signed codes), then for every 8-token group the register micro-kernel (4 rows x 8 tokens:
// int16 and int32 group sums and f32 partial sums per 256 values in 12 ymm). Rows past R are decoded as zeros and not
// stored; tokens past nt are zero and not stored.
//
// Arithmetic: not bit-identical to the row path (that one rounds a product per 4 values in f32; this one per group,
// as the AVX-512 GEMM), held to Reference at NMSE 1e-10 like the AVX-512 GEMM; each (row, token) result depends only on
// that row and that token (lanes and rows never mix), not on which other rows or tokens share the call.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "quant_kernels.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX2)

namespace tessera {
namespace quant {
namespace {

constexpr int kLanes = 8;  // tokens per ymm
constexpr int kMR = 4;     // rows per micro-tile
#ifndef TESSERA_AVX2_GEMM_PF_ROWS
#define TESSERA_AVX2_GEMM_PF_ROWS 2
#endif
constexpr int kPrefetchRows = TESSERA_AVX2_GEMM_PF_ROWS;  // rows decoded ahead of their prefetch

// How a type's group dot is formed (see the file comment).
enum class Mode {
  kMins,    // Q4_K, Q5_K: dot(u, q), minus the f32 B term
  kOffset,  // Q4_0, Q6_K: dot(u, q) - off * sum(q), the offset as the int32 start z
  kSigned,  // Q8_0, IQ4_XS: dot(s, q) by |s| x sign(q, s)
};

// 8 x 8 int32 transpose in registers: r[i] lane j -> r[j] lane i.
__attribute__((always_inline)) inline void transpose8(__m256i* r) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {  // u[4i + j], 128-bit lane L: element 4L + j of rows 4i .. 4i + 3
    u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
    r[4 + j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
  }
}

// One 8-token group's activations: xt [Kq/4][8] int32 (4 int8 values of one token per lane), dx [nsb][8], and per
// G-value group g either (kOffset) the integer start of its dot, z [g][8] = -off * sum(q), or (kMins) the B term's
// factor sb [g][8] = dx * sum(q). Tokens past n: zero.
template <int G, Mode M>
void pack_tokens(const ActRow* xs, int n, int64_t Kq, int off, const int8_t* zeros, int32_t* xt, float* dx,
                 float* sb, int32_t* z) {
  const int64_t nsb = Kq / 256, ng = Kq / G;
  const int8_t* q[kLanes];
  for (int l = 0; l < kLanes; ++l) q[l] = l < n ? xs[l].q : zeros;
  for (int64_t k = 0; k < Kq; k += 32) {
    __m256i r[8];
    for (int l = 0; l < kLanes; ++l) r[l] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[l] + k));
    transpose8(r);
    for (int j = 0; j < 8; ++j) _mm256_store_si256(reinterpret_cast<__m256i*>(xt + (k / 4 + j) * kLanes), r[j]);
  }
  for (int64_t s = 0; s < nsb; ++s)
    for (int l = 0; l < kLanes; ++l) dx[s * kLanes + l] = l < n ? xs[l].d256[s] : 0.0f;
  for (int64_t g = 0; g < ng; ++g)
    for (int l = 0; l < kLanes; ++l) {
      if (M == Mode::kOffset)
        z[g * kLanes + l] = l >= n ? 0 : -off * (G == 16 ? xs[l].bs16[g] : xs[l].bs16[2 * g] + xs[l].bs16[2 * g + 1]);
      else if (M == Mode::kMins)
        sb[g * kLanes + l] = l >= n ? 0.0f : G == 16 ? xs[l].s16[g] : xs[l].s16[2 * g] + xs[l].s16[2 * g + 1];
    }
}

// f16 -> f32 by F16C: the same value as quant_body.inc's load_f16 for every finite or infinite scale (only a NaN's
// payload may differ, and quant_validate refuses NaN scales at load).
inline float f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 8 f32 = d * float(8 bytes at p, unsigned or signed), stored at out: one IEEE product each, as in unpack_row_body.
inline void scale8_u(float d, const uint8_t* p, float* out) {
  const __m256 s = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_set1_ps(d), s));
}
inline void scale8_s(float d, const uint8_t* p, float* out) {
  const __m256 s = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_set1_ps(d), s));
}

// One row of K values from its blocks -> u [Kq] codes (kSigned types: |s| in u, the signed code s in sg [Kq]),
// a [ng] A_g, b [ng] B_g (Q4_K/Q5_K only), everything past K zero. SIMD per block; the same codes and the same
// single-rounding f32 products A = d * sc, B = dmin * m as quant_body.inc's unpack_row_body (every other path).
void decode_row(QType t, const uint8_t* src, int64_t K, int64_t Kq, uint8_t* u, int8_t* sg, float* a, float* b) {
  const __m128i m4x = _mm_set1_epi8(0x0F);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  int64_t k_done = K, g_done = 0;  // values and groups written
  switch (t) {
    case QType::Q4_0:
      for (int64_t blk = 0; blk < K / 32; ++blk) {
        const uint8_t* p = src + 18 * blk;
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(u + 32 * blk), _mm_and_si128(q, m4x));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(u + 32 * blk + 16), _mm_and_si128(_mm_srli_epi16(q, 4), m4x));
        a[blk] = f16c(p);
      }
      g_done = K / 32;
      break;
    case QType::Q8_0:
      for (int64_t blk = 0; blk < K / 32; ++blk) {
        const uint8_t* p = src + 34 * blk;
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(sg + 32 * blk), q);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + 32 * blk), _mm256_abs_epi8(q));
        a[blk] = f16c(p);
      }
      g_done = K / 32;
      break;
    case QType::Q4_K:
    case QType::Q5_K: {
      const bool five = t == QType::Q5_K;
      const int bytes = five ? 176 : 144;
      const __m256i bit4 = _mm256_set1_epi8(0x10);
      for (int64_t sb = 0; sb < K / 256; ++sb) {
        const uint8_t* blk = src + bytes * sb;
        const float d = f16c(blk), dmin = f16c(blk + 2);
        const uint8_t* qs = blk + (five ? 48 : 16);  // 128 bytes of nibbles
        const __m256i qh = five ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)) : _mm256_setzero_si256();
        uint8_t* ub = u + 256 * sb;
        for (int j = 0; j < 4; ++j) {  // sub-blocks 2j (low nibbles) and 2j + 1 (high nibbles)
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
          __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
          if (five) {  // Q5_K: bit s of qh[l] is bit 4 of value 32 s + l
            const __m256i bl = _mm256_set1_epi8(char(1 << (2 * j))), bh = _mm256_set1_epi8(char(1 << (2 * j + 1)));
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl), bit4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh), bit4));
          }
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(ub + 64 * j), lo);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(ub + 64 * j + 32), hi);
        }
        // The 8 6-bit sub-scales and mins of the 12 packed bytes (scale_min_k4 for all 8 at once, llama.cpp's
        // u32 trick): bytes 0-7 of sm = sc[0..7], bytes 8-15 = m[0..7].
        uint32_t sm[4];
        std::memcpy(sm, blk + 4, 12);
        const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
        sm[3] = ((sm[2] >> 4) & k2) | (((sm[1] >> 6) & k3) << 4);
        const uint32_t m_lo = sm[1] & k1;
        sm[1] = (sm[2] & k2) | (((sm[0] >> 6) & k3) << 4);
        sm[2] = m_lo;
        sm[0] &= k1;
        scale8_u(d, reinterpret_cast<const uint8_t*>(sm), a + 8 * sb);
        scale8_u(dmin, reinterpret_cast<const uint8_t*>(sm) + 8, b + 8 * sb);
      }
      g_done = K / 32;
      break;
    }
    case QType::Q6_K: {
      const __m256i m2 = _mm256_set1_epi8(0x03), m2_2 = _mm256_set1_epi8(0x0C), m2_4 = _mm256_set1_epi8(0x30),
                    m2_6 = _mm256_set1_epi8(char(0xC0));
      for (int64_t sb = 0; sb < K / 256; ++sb) {
        const uint8_t* blk = src + 210 * sb;
        const float d = f16c(blk + 208);
        uint8_t* ub = u + 256 * sb;
        for (int h = 0; h < 2; ++h) {  // value 32 g32 + l, g32 = 4h + 2s + k: ql nibble s of ql[64h + 32k + l],
                                       // high bits 2 (2s + k) of qh[32h + l]
          const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
          const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
          const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4);
          const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(qh, m2_2), 2);
          const __m256i h2 = _mm256_and_si256(qh, m2_4);
          const __m256i h3 = _mm256_srli_epi16(_mm256_and_si256(qh, m2_6), 2);
          __m256i* o = reinterpret_cast<__m256i*>(ub + 128 * h);
          _mm256_storeu_si256(o, _mm256_or_si256(_mm256_and_si256(ql0, m4), h0));
          _mm256_storeu_si256(o + 1, _mm256_or_si256(_mm256_and_si256(ql1, m4), h1));
          _mm256_storeu_si256(o + 2, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), h2));
          _mm256_storeu_si256(o + 3, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), h3));
        }
        scale8_s(d, blk + 192, a + 16 * sb);
        scale8_s(d, blk + 200, a + 16 * sb + 8);
      }
      g_done = K / 16;
      break;
    }
    case QType::IQ4_XS: {
      const __m128i book = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Values));
      for (int64_t sb = 0; sb < K / 256; ++sb) {
        const uint8_t* blk = src + 136 * sb;
        const float d = f16c(blk);
        const unsigned scales_h = unsigned(blk[2]) | unsigned(blk[3]) << 8;
        for (int ib = 0; ib < 8; ++ib) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 8 + 16 * ib));
          const __m128i lo = _mm_shuffle_epi8(book, _mm_and_si128(q, m4x));
          const __m128i hi = _mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16(q, 4), m4x));
          const __m256i v = _mm256_set_m128i(hi, lo);  // values 32 ib + 0..15, then + 16..31
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(sg + 256 * sb + 32 * ib), v);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + 256 * sb + 32 * ib), _mm256_abs_epi8(v));
          const int ls = ((blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
          a[8 * sb + ib] = d * float(ls - 32);
        }
      }
      g_done = K / 32;
      break;
    }
  }
  std::memset(u + k_done, 0, size_t(Kq - k_done));
  if (sg) std::memset(sg + k_done, 0, size_t(Kq - k_done));
  const int64_t ng = Kq / (t == QType::Q6_K ? 16 : 32);
  std::fill(a + g_done, a + ng, 0.0f);
  std::fill(b + (t == QType::Q4_K || t == QType::Q5_K ? g_done : 0), b + ng, 0.0f);
}

// Rows r0 .. r0 + kMR - 1 of the task's R rows (those past R: zero) from their blocks -> u [kMR][Kq] codes (kSigned:
// |s|, and the signed codes in sg [kMR][Kq]), a [kMR][ng] A_g, b [kMR][ng] B_g. A task's rows are one contiguous
// stream of a cold expert: the rows kPrefetchRows ahead are prefetched, or the decode waits on the stream's loads
// (measured: -5 % of the MoE layer at 8 tokens per expert).
template <int G, Mode M>
void decode_tile(QType t, const uint8_t* w, size_t row_bytes, int R, int r0, int64_t K, int64_t Kq, uint8_t* u,
                 int8_t* sg, float* a, float* b) {
  const int64_t ng = Kq / G;
  const auto prefetch_row = [&](int r) {
    const uint8_t* p = w + size_t(r) * row_bytes;
    for (size_t off = 0; off < row_bytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
  };
  if (r0 == 0)
    for (int r = 0; r < std::min(R, kPrefetchRows); ++r) prefetch_row(r);
  for (int i = 0; i < kMR; ++i) {
    const int r = r0 + i;
    uint8_t* ur = u + i * Kq;
    int8_t* sr = M == Mode::kSigned ? sg + i * Kq : nullptr;
    if (r + kPrefetchRows < R) prefetch_row(r + kPrefetchRows);
    if (r < R) {
      decode_row(t, w + size_t(r) * row_bytes, K, Kq, ur, sr, a + i * ng, b + i * ng);
      continue;
    }
    std::memset(ur, 0, size_t(Kq));
    if (sr) std::memset(sr, 0, size_t(Kq));
    std::fill(a + i * ng, a + (i + 1) * ng, 0.0f);
    std::fill(b + i * ng, b + (i + 1) * ng, 0.0f);
  }
}

// Steps (of 4 values) whose int16 pair sums are added in int16 before one vpmaddwd (the bounds of the file comment).
constexpr int chunk_steps(QType t) {
  return t == QType::Q4_0 || t == QType::Q4_K ? 8 : t == QType::Q5_K ? 4 : t == QType::Q6_K ? 2 : 1;
}

inline __m256i bcast4(const void* p) {
  int32_t c;
  std::memcpy(&c, p, 4);
  return _mm256_set1_epi32(c);
}

// acc[r][lane] for kMR rows x 8 tokens: sum over 256-value blocks s of dx[s] * sum_{g in s} A_g * dot_g, where dot_g is
// the group's exact integer dot (see Mode), minus (kMins) sum_g B_g * sb[g].
template <int G, Mode M, int kChunk>
__attribute__((always_inline)) inline void micro(const uint8_t* u, const int8_t* sg, const float* a, const float* b,
                                                 int64_t Kq, const int32_t* xt, const float* dx, const float* sb,
                                                 const int32_t* z, float* acc /* [kMR][8] */) {
  const int64_t nsb = Kq / 256, ng = Kq / G;
  constexpr int kGroups = 256 / G, kSteps = G / 4;
  static_assert(kSteps % kChunk == 0, "a chunk never straddles a group");
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 total[kMR];
  for (int r = 0; r < kMR; ++r) total[r] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    __m256 part[kMR];
    for (int r = 0; r < kMR; ++r) part[r] = _mm256_setzero_ps();
    for (int gi = 0; gi < kGroups; ++gi) {
      const int64_t g = s * kGroups + gi;
      __m256i d[kMR];
      const __m256i d0 = M == Mode::kOffset ? _mm256_load_si256(reinterpret_cast<const __m256i*>(z + g * kLanes))
                                            : _mm256_setzero_si256();
      for (int r = 0; r < kMR; ++r) d[r] = d0;
      for (int j0 = 0; j0 < kSteps; j0 += kChunk) {
        __m256i p16[kMR];
        for (int r = 0; r < kMR; ++r) p16[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = j0; j < j0 + kChunk; ++j) {
          const int64_t k4 = g * kSteps + j;
          const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(xt + k4 * kLanes));
          for (int r = 0; r < kMR; ++r) {
            __m256i p;
            if (M == Mode::kSigned)
              p = _mm256_maddubs_epi16(bcast4(u + r * Kq + 4 * k4), _mm256_sign_epi8(x, bcast4(sg + r * Kq + 4 * k4)));
            else
              p = _mm256_maddubs_epi16(bcast4(u + r * Kq + 4 * k4), x);
            p16[r] = kChunk == 1 ? p : _mm256_add_epi16(p16[r], p);
            // Keep the sum a chain in this order: without the barrier GCC reassociates the int16 adds into a tree
            // with every product live at once, and spills half of them to the stack.
            if (kChunk > 1) __asm__("" : "+x"(p16[r]));
          }
        }
        for (int r = 0; r < kMR; ++r) d[r] = _mm256_add_epi32(d[r], _mm256_madd_epi16(p16[r], ones));
      }
      for (int r = 0; r < kMR; ++r)
        part[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[r]), _mm256_set1_ps(a[r * ng + g]), part[r]);
    }
    const __m256 dxs = _mm256_load_ps(dx + s * kLanes);
    for (int r = 0; r < kMR; ++r) total[r] = _mm256_fmadd_ps(part[r], dxs, total[r]);
  }
  for (int64_t g = 0; g < (M == Mode::kMins ? ng : 0); ++g) {
    const __m256 sv = _mm256_load_ps(sb + g * kLanes);
    for (int r = 0; r < kMR; ++r) total[r] = _mm256_fnmadd_ps(_mm256_set1_ps(b[r * ng + g]), sv, total[r]);
  }
  for (int r = 0; r < kMR; ++r) _mm256_store_ps(acc + r * kLanes, total[r]);
}

inline size_t align64(size_t n) { return (n + 63) / 64 * 64; }

template <int G, Mode M, int kChunk>
void gemm_g(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt, float* out) {
  const int64_t Kq = padded_k256(K), ng = Kq / G, nsb = Kq / 256;
  const int ngroups = (nt + kLanes - 1) / kLanes;
  // Scratch: one micro-tile's codes, signed codes (kSigned), A, B; zero activations; per token group xt, dx, sb, z.
  const size_t n_u = align64(size_t(kMR * Kq)), n_sg = M == Mode::kSigned ? n_u : 0,
               n_ab = align64(size_t(kMR * ng) * 4), n_zero = align64(size_t(Kq)), n_xt = align64(size_t(Kq) * kLanes),
               n_dx = align64(size_t(nsb) * kLanes * 4), n_sb = align64(size_t(ng) * kLanes * 4);
  const size_t n_tok = n_xt + n_dx + 2 * n_sb;
  const int off = t == QType::Q6_K ? 32 : t == QType::Q4_0 ? 8 : 0;
  uint8_t* base = gemm_scratch(n_u + n_sg + 2 * n_ab + n_zero + size_t(ngroups) * n_tok);
  uint8_t* u = base;
  int8_t* sg = reinterpret_cast<int8_t*>(base + n_u);
  float* a = reinterpret_cast<float*>(base + n_u + n_sg);
  float* b = reinterpret_cast<float*>(base + n_u + n_sg + n_ab);
  int8_t* zeros = reinterpret_cast<int8_t*>(base + n_u + n_sg + 2 * n_ab);
  uint8_t* tok = base + n_u + n_sg + 2 * n_ab + n_zero;
  std::memset(zeros, 0, size_t(Kq));

  for (int gi = 0; gi < ngroups; ++gi) {
    uint8_t* p = tok + size_t(gi) * n_tok;
    pack_tokens<G, M>(xs + gi * kLanes, std::min(kLanes, nt - gi * kLanes), Kq, off, zeros,
                      reinterpret_cast<int32_t*>(p), reinterpret_cast<float*>(p + n_xt),
                      reinterpret_cast<float*>(p + n_xt + n_dx), reinterpret_cast<int32_t*>(p + n_xt + n_dx + n_sb));
  }
  alignas(32) float acc[kMR * kLanes];
  for (int r0 = 0; r0 < R; r0 += kMR) {  // each micro-tile decoded just before use: its codes stay in L1
    decode_tile<G, M>(t, w, row_bytes, R, r0, K, Kq, u, sg, a, b);
    for (int gi = 0; gi < ngroups; ++gi) {
      const uint8_t* p = tok + size_t(gi) * n_tok;
      const int t0 = gi * kLanes, n = std::min(kLanes, nt - t0);
      micro<G, M, kChunk>(u, sg, a, b, Kq, reinterpret_cast<const int32_t*>(p), reinterpret_cast<const float*>(p + n_xt),
                          reinterpret_cast<const float*>(p + n_xt + n_dx),
                          reinterpret_cast<const int32_t*>(p + n_xt + n_dx + n_sb), acc);
      for (int r = 0; r < kMR && r0 + r < R; ++r)
        std::memcpy(out + (r0 + r) * nt + t0, acc + r * kLanes, size_t(n) * sizeof(float));
    }
  }
}

}  // namespace

void gemm_avx2(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt, float* out) {
  switch (t) {
    case QType::Q4_0: gemm_g<32, Mode::kOffset, chunk_steps(QType::Q4_0)>(t, w, row_bytes, R, K, xs, nt, out); break;
    case QType::Q6_K: gemm_g<16, Mode::kOffset, chunk_steps(QType::Q6_K)>(t, w, row_bytes, R, K, xs, nt, out); break;
    case QType::Q4_K: gemm_g<32, Mode::kMins, chunk_steps(QType::Q4_K)>(t, w, row_bytes, R, K, xs, nt, out); break;
    case QType::Q5_K: gemm_g<32, Mode::kMins, chunk_steps(QType::Q5_K)>(t, w, row_bytes, R, K, xs, nt, out); break;
    default: gemm_g<32, Mode::kSigned, 1>(t, w, row_bytes, R, K, xs, nt, out); break;  // Q8_0, IQ4_XS
  }
}

}  // namespace quant
}  // namespace tessera

TESSERA_ISA_END
