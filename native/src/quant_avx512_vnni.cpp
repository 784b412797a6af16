// Quantized kernels, AVX-512 VNNI. Activations are int8 with one f32 scale per 256 values (quant_kernels.h), so the
// K-quants and IQ4_XS apply their integer sub-scales to integer dots (vpmaddubsw + vpdpwssd, exact in int32) and keep
// one f32 multiply-add per 256 values; Q8_0 / Q4_0 (f32 scale per 32) keep one vpdpbusd + one FMA per 64 codes.
// Decode and prefill read the file's blocks directly (dot_direct); the row tiles (unpack_rows + dot_rows) are
// Reference's alone.
// AVX-512F/BW/VL/DQ + VNNI code between the ISA markers only (isa_target.h); the unpacking and activation
// quantization come from quant_body.inc.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "quant_kernels.h"
#include "tessera/tuning.h"
#include "tessera/bf16.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_VNNI)

namespace tessera {
namespace quant {
namespace {

#include "quant_body.inc"

// quantize_row_body (quant_body.inc) in zmm registers, the same single IEEE operations on every value, so the same
// bits: max|x| by vmaxps with the running max second (a NaN value leaves it, as std::max does), q = round-to-even of
// x * (1 / d) clamped by vmaxps / vminps (NaN -> -127 as std::max(-127, NaN)), exact int32 sums of 16. The scalar
// loops ran ~1.7 ns per value (their max does not vectorize): at prefill that was ~1.8 ms of every 512 x 2048 call
// on one core, as much as the GEMM itself.
void quantize_row_avx512(const float* x, int64_t K, int8_t* q, float* d256, int16_t* bs16, float* s16) {
  const int64_t nb = padded_k256(K) / 256;
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + 256 * b;
    const int n = int(std::min<int64_t>(256, K - 256 * b));
    auto mask_at = [n](int i) { return n - i >= 16 ? __mmask16(0xFFFF) : n <= i ? __mmask16(0) : __mmask16((1u << (n - i)) - 1); };
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16)
      m = _mm512_max_ps(_mm512_and_ps(_mm512_maskz_loadu_ps(mask_at(i), xb + i), absmask), m);
    const float amax = _mm512_reduce_max_ps(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 idv = _mm512_set1_ps(id);
    d256[b] = d;
    for (int g = 0; g < 16; ++g) {
      const __m512 v = _mm512_maskz_loadu_ps(mask_at(16 * g), xb + 16 * g);  // zeros past n: q = 0
      __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
      const __m512i qi = _mm512_cvtps_epi32(r);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 256 * b + 16 * g), _mm512_cvtepi32_epi8(qi));
      const int s = _mm512_reduce_add_epi32(qi);
      bs16[16 * b + g] = int16_t(s);
      s16[16 * b + g] = d * float(s);
    }
  }
}

// ---- Direct path: the codes and scales of 256 values at a time (one K-quant super-block, or 8 blocks of Q8_0/Q4_0)
// decoded from the file's blocks into registers, then every token (one activation block of 256 values, one dx) passes
// over them. Same codes and scales as unpack_row_body; only the f32 rounding order differs from the tile path.
//
// K-quants and IQ4_XS: integer sub-scales (llama.cpp's scheme). Per 64 codes, vpmaddubsw (u8 code x s8 activation ->
// 32 int16 pair sums, no saturation: codes <= 63, |IQ4_XS code| <= 127) and vpdpwssd by the int16 sub-scale of each
// pair accumulate the super-block's sum(sc * code * q) exactly in int32; then one int32 -> f32 conversion and one FMA
// with d * dx per 256 values, and for the B terms one vpmaddwd of the 16 per-16 multipliers by the activation's
// int16 per-16 sums. Block-32 types (f32 scale per 32 values) keep vpdpbusd and one f32 FMA per 64 codes.

inline __m512i lane_div(int shift) {  // lane l -> l >> shift
  return _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), shift);
}
inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
inline float hsum256(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
inline __m512i cat(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
inline __m512i epi16_index(int per_lane_shift, int add) {  // int16 lane i -> (i >> per_lane_shift) + add
  const __m512i i = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12,
                                     11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  return _mm512_add_epi16(_mm512_srli_epi16(i, per_lane_shift), _mm512_set1_epi16(short(add)));
}

// Horizontal sums of 16 tokens at once, bit-identical to _mm512_reduce_add_ps / hsum256 of each: the same pairwise
// tree (lane j + lane j + 8, then k + k + 4, then 0 + 2 and 1 + 3, then 0 + 1; f32 addition commutes), run on
// transposed lanes. Steps 2-4 take w[p] = [8 lanes of token 2p | 8 lanes of token 2p + 1]; the result's lane 4L + j
// holds token L + 4j (kSum16Token).
constexpr int kSum16Token[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
__attribute__((always_inline)) inline __m512 sum16_from8(const __m512* w) {
  __m512 z[4], u[2];
  for (int q = 0; q < 4; ++q)
    z[q] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * q], w[2 * q + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w[2 * q], w[2 * q + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int r = 0; r < 2; ++r)
    u[r] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * r], z[2 * r + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(z[2 * r], z[2 * r + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
__attribute__((always_inline)) inline __m512 sum16(const __m512* v) {  // v: 16 tokens' 16 lanes
  __m512 w[8];
  for (int p = 0; p < 8; ++p)
    w[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return sum16_from8(w);
}
__attribute__((always_inline)) inline __m512 sum16(const __m256* v) {  // v: 16 tokens' 8 lanes
  __m512 w[8];
  for (int p = 0; p < 8; ++p) w[p] = _mm512_insertf32x8(_mm512_castps256_ps512(v[2 * p]), v[2 * p + 1], 1);
  return sum16_from8(w);
}
// out[i] = reduce(acc[i]) - hsum256(macc[i]) for i < nt (macc null: no B term), 16 tokens per pass.
__attribute__((always_inline)) inline void reduce_tokens(const __m512* acc, const __m256* macc, int nt, float* out) {
  int i = 0;
  for (; i + 16 <= nt; i += 16) {
    alignas(64) float s[16];
    _mm512_store_ps(s, macc ? _mm512_sub_ps(sum16(acc + i), sum16(macc + i)) : sum16(acc + i));
    for (int l = 0; l < 16; ++l) out[i + kSum16Token[l]] = s[l];
  }
  for (; i < nt; ++i) out[i] = macc ? _mm512_reduce_add_ps(acc[i]) - hsum256(macc[i]) : _mm512_reduce_add_ps(acc[i]);
}

// Decode prefetches its row stream into L1 (quant_kernels.h prefetch_ahead). A short token block (prefill's experts
// with few tokens) reads its rows the same way and prefetches them into L2 only (T1), leaving L1 to its tokens'
// activations: bench-moe Q4_K_M on Zen 4, 32 / 128 tokens a layer 8-12 % faster than without a prefetch (into L1:
// about half that gain); 512 tokens (mostly the GEMM) unchanged.

// Block-32 super-chunk: codes, f32 A per vpdpbusd lane, B per 16-group.
struct Chunk32 {
  __m512i u[4];
  __m512 a[4];
  __m512 b;
  int nc;  // chunks present (fewer at the end of a row whose K is not a multiple of 256)
};

// `scale` multiplies A (decode folds the token's dx in here; B pairs with s16, which has dx already).
template <QType t>
__attribute__((always_inline)) inline void load_block32(const uint8_t* row, int64_t K, int64_t sb, float scale,
                                                        Chunk32& s) {
  const int bytes = t == QType::Q8_0 ? 34 : 18;
  const int64_t b0 = 8 * sb, nblk = std::min<int64_t>(8, K / 32 - b0);
  const uint8_t* base = row + b0 * bytes;
  uint64_t dh[2] = {0, 0};  // the blocks' f16 scales packed in GPRs, converted together (vcvtph2ps: exact)
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  __m256i code[8];
  auto one = [&](int j) {
    const uint8_t* blk = base + j * bytes;
    uint16_t h;
    std::memcpy(&h, blk, 2);
    dh[j / 4] |= uint64_t(h) << (16 * (j % 4));
    if (t == QType::Q8_0) {
      code[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    } else {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      code[j] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), m4);
    }
  };
  if (nblk == 8) {
    for (int j = 0; j < 8; ++j) one(j);
  } else {
    for (int j = 0; j < 8; ++j) {
      if (j < nblk) one(j); else code[j] = _mm256_setzero_si256();
    }
  }
  s.nc = int((nblk + 1) / 2);
  for (int c = 0; c < 4; ++c) {
    const __m512i v = cat(code[2 * c], code[2 * c + 1]);
    s.u[c] = t == QType::Q8_0 ? _mm512_xor_si512(v, flip) : v;  // Q8_0: u = q + 128
  }
  const __m256 d = _mm256_cvtph_ps(_mm_set_epi64x(int64_t(dh[1]), int64_t(dh[0])));
  const __m512 dv = _mm512_castps256_ps512(d);
  const __m512 av = _mm512_castps256_ps512(_mm256_mul_ps(d, _mm256_set1_ps(scale)));
  const __m512i l8 = lane_div(3);
  for (int c = 0; c < 4; ++c) s.a[c] = _mm512_permutexvar_ps(_mm512_add_epi32(l8, _mm512_set1_epi32(2 * c)), av);
  s.b = _mm512_mul_ps(_mm512_set1_ps(t == QType::Q8_0 ? 128.0f : 8.0f), _mm512_permutexvar_ps(lane_div(1), dv));
}

// K-quant / IQ4_XS super-block for the integer path: out += dx * (d * sum_c sc[c] . maddubs(u[c], q) - dm * m16 . bs16)
struct SuperInt {
  __m512i u[4];      // codes of values 64c .. 64c + 63 (IQ4_XS: |code|)
  __m512i sc[4];     // paired<t>: sc[p] (p < 2) the int16 pair (sub-scale of chunk 2p, of chunk 2p + 1) of each int32
                     // lane; else the int16 sub-scale of each int16 lane of maddubs(u[c], q)
  __m256i m16;       // int16 B multiplier per 16-group (Q4_K/Q5_K: min; Q6_K: sub-scale)
  __mmask64 neg[4];  // IQ4_XS: the values whose code is negative (their activation is negated)
  float d, dm;
};

template <QType t>
constexpr bool has_b() { return t != QType::IQ4_XS; }

// Whether the type's super-block dot takes the paired path (dot_super): codes <= 63 against |q| <= 127, so the
// vpdpbusd sum of 4 products (|s| <= 4 * 63 * 127 = 32004) fits an int16, and two chunks' sums share one vpdpwssd by
// their sub-scales. IQ4_XS (|code| <= 127) keeps vpmaddubsw + vpdpwssd.
template <QType t>
constexpr bool paired() { return t != QType::IQ4_XS; }

// int16 lane i -> index of the scale of int32 lane i / 2 of chunk 2p + i % 2: the 32-value sub-block (Q4_K / Q5_K:
// chunk c lanes 0-7 = sub-block 2c, lanes 8-15 = 2c + 1), or the 16-value group (Q6_K: lane l of chunk c = values
// 64c + 4l .. 64c + 4l + 3), or'ed with `high` (0x8000: vpshufb zeroes the high byte).
inline __m512i pair_index(int p, bool per16, short high) {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 32; ++i) {
    const int c = 2 * p + (i & 1), l = i >> 1;
    idx[i] = short((per16 ? 4 * c + l / 4 : 2 * c + l / 8) | high);
  }
  return _mm512_load_si512(idx);
}

template <QType t>
__attribute__((always_inline)) inline void load_super(const uint8_t* row, int64_t sb, SuperInt& s) {
  switch (t) {
    case QType::Q4_K:
    case QType::Q5_K: {
      const bool five = t == QType::Q5_K;
      const uint8_t* blk = row + sb * (five ? 176 : 144);
      // ggml's unpacking of the 12 scale bytes (get_scale_min_k4, 4 at a time): sub-scales 0-7, then mins 0-7.
      uint64_t s01;
      uint32_t s2;
      std::memcpy(&s01, blk + 4, 8);
      std::memcpy(&s2, blk + 12, 4);
      const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
      const uint32_t u0 = uint32_t(s01), u1 = uint32_t(s01 >> 32);
      const uint64_t sc = uint64_t(u0 & k1) | uint64_t((s2 & k2) | (((u0 >> 6) & k3) << 4)) << 32;
      const uint64_t mn = uint64_t(u1 & k1) | uint64_t(((s2 >> 4) & k2) | (((u1 >> 6) & k3) << 4)) << 32;
      const __m512i sm = _mm512_broadcast_i32x4(_mm_set_epi64x(int64_t(mn), int64_t(sc)));
      // int16 lane -> byte (index, 0): chunk c holds sub-blocks 2c (int16 lanes 0-15) and 2c + 1 (16-31).
      for (int p = 0; p < 2; ++p) s.sc[p] = _mm512_shuffle_epi8(sm, pair_index(p, false, short(0x8000)));
      s.m16 = _mm256_shuffle_epi8(_mm512_castsi512_si256(sm),
                                  _mm256_setr_epi16(short(0x8008), short(0x8008), short(0x8009), short(0x8009),
                                                    short(0x800A), short(0x800A), short(0x800B), short(0x800B),
                                                    short(0x800C), short(0x800C), short(0x800D), short(0x800D),
                                                    short(0x800E), short(0x800E), short(0x800F), short(0x800F)));
      s.d = f16(blk);
      s.dm = f16(blk + 2);
      // Chunk c = [low nibbles of qs[32c .. 32c + 31] | their high nibbles]: the 32 bytes broadcast to both halves,
      // the upper half shifted right by 4, masked (Q5_K: the high bit 2c / 2c + 1 of qh the same way, at bit 4).
      const uint8_t* qs = blk + (five ? 48 : 16);
      const __m512i m4z = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
      const __m512i nib_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
      const __m512i qh = five ? _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)))
                              : _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c)));
        const __m512i nib = _mm512_and_si512(_mm512_srlv_epi16(v, nib_shift), m4z);
        if (five) {  // bit 2c (low half) or 2c + 1 (high half) of each qh byte, moved to bit 4
          const __m512i hb = _mm512_slli_epi16(
              _mm512_srlv_epi16(qh, _mm512_inserti64x4(_mm512_set1_epi16(short(2 * c)), _mm256_set1_epi16(short(2 * c + 1)), 1)),
              4);
          s.u[c] = _mm512_ternarylogic_epi32(nib, hb, b4, 0xF8);  // nib | (hb & 0x10)
        } else {
          s.u[c] = nib;
        }
      }
      break;
    }
    case QType::Q6_K: {
      const uint8_t* blk = row + sb * 210;
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
      s.m16 = sc16;  // B = 32 A: the B multiplier is the sub-scale, dm = 32 d
      for (int p = 0; p < 2; ++p) s.sc[p] = _mm512_permutexvar_epi16(pair_index(p, true, 0), _mm512_castsi256_si512(sc16));
      s.d = f16(blk + 208);
      s.dm = 32.0f * s.d;
      // Half h: ql[64h + l] low nibble = value 128h + l, high = 128h + 64 + l (l < 64); the 2 high bits of value
      // 128h + 32k + l (l < 32, k < 4) are bits 2k, 2k + 1 of qh[32h + l]. qh is broadcast to both 256-bit halves and
      // the upper half shifted by 2, so one shift serves k = 0/1 (chunk 2h) and another k = 2/3 (chunk 2h + 1).
      const __m512i m4z = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
      const __m512i half_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
      for (int h = 0; h < 2; ++h) {
        const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
        const __m512i hb = _mm512_srlv_epi16(
            _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h))), half_shift);
        // a | (b & c): imm 0xF8
        s.u[2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, m4z), _mm512_slli_epi16(hb, 4), m30, 0xF8);
        s.u[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4z), hb, m30, 0xF8);
      }
      break;
    }
    default: {  // IQ4_XS: sub-block ib: ls = ((scales_l >> 4 ib) & 15) | ((scales_h >> 2 ib) & 3) << 4, all 8 at once
      const uint8_t* blk = row + sb * 136;
      uint32_t sl;
      std::memcpy(&sl, blk + 4, 4);
      const int sh = int(blk[2]) | int(blk[3]) << 8;
      const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(sl)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                          _mm256_set1_epi32(0xF));
      const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sh), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                          _mm256_set1_epi32(3));
      const __m128i ls = _mm256_cvtepi32_epi16(_mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32)));
      for (int c = 0; c < 4; ++c) s.sc[c] = _mm512_permutexvar_epi16(epi16_index(4, 2 * c), _mm512_castsi128_si512(ls));
      s.m16 = _mm256_setzero_si256();
      s.d = f16(blk);
      s.dm = 0.0f;
      alignas(16) static const int8_t tab[16] = {127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113};  // |kIQ4Values|
      const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(tab)));
      const __m512i half_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
      const __m512i m4z = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
      for (int c = 0; c < 4; ++c) {
        // qs[32c .. 32c + 31] in both halves; the upper half's high nibbles: 128-bit lanes = block 2c values 0-15,
        // block 2c + 1 values 0-15, block 2c values 16-31, block 2c + 1 values 16-31 -> natural order (0, 2, 1, 3).
        const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 8 + 32 * c)));
        __m512i nib = _mm512_and_si512(_mm512_srlv_epi16(v, half_shift), m4z);
        nib = _mm512_shuffle_i64x2(nib, nib, _MM_SHUFFLE(3, 1, 2, 0));
        s.u[c] = _mm512_shuffle_epi8(table, nib);
        s.neg[c] = _mm512_testn_epi8_mask(nib, eight);  // kIQ4Values[i] < 0 for i < 8
      }
      break;
    }
  }
}

// The integer sum of one super-block against one token's 256 activations.
// Paired (paired<t>): per chunk c, vpdpbusd gives the int32 sum of each 4 products (values 64c + 4l .. + 3 in lane l);
// chunks 2p and 2p + 1 go into the low and high int16 of one vector and one vpdpwssd multiplies each by its sub-scale
// and adds the two: per lane the same integers as maddubs + vpdpwssd per chunk (pair sums 2l, 2l + 1 of chunk c are
// that lane's 4 products), so the same int32 lanes, with 6 multiply-unit instructions a super-block instead of 8.
template <QType t>
__attribute__((always_inline)) inline __m512i dot_super(const SuperInt& s, const int8_t* q) {
  if (paired<t>()) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i acc = zero;
    for (int p = 0; p < 2; ++p) {
      const __m512i lo = _mm512_dpbusd_epi32(zero, s.u[2 * p], _mm512_loadu_si512(q + 128 * p));
      const __m512i hi = _mm512_dpbusd_epi32(zero, s.u[2 * p + 1], _mm512_loadu_si512(q + 128 * p + 64));
      const __m512i both = _mm512_mask_blend_epi16(__mmask32(0xAAAAAAAAu), lo, _mm512_slli_epi32(hi, 16));
      acc = _mm512_dpwssd_epi32(acc, both, s.sc[p]);
    }
    return acc;
  }
  __m512i acc[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
  for (int c = 0; c < 4; ++c) {
    __m512i xq = _mm512_loadu_si512(q + 64 * c);
    if (t == QType::IQ4_XS) xq = _mm512_mask_sub_epi8(xq, s.neg[c], _mm512_setzero_si512(), xq);
    acc[c & 1] = _mm512_dpwssd_epi32(acc[c & 1], _mm512_maddubs_epi16(s.u[c], xq), s.sc[c]);
  }
  return _mm512_add_epi32(acc[0], acc[1]);
}

// acc += d dx * dot; macc += dm dx * (m16 . bs16) for super-block sb of token x.
template <QType t>
__attribute__((always_inline)) inline void accumulate_super(const SuperInt& s, const ActRow& x, int64_t sb, __m512& acc,
                                                            __m256& macc) {
  const float dx = x.d256[sb];
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_super<t>(s, x.q + 256 * sb)), _mm512_set1_ps(s.d * dx), acc);
  if (has_b<t>()) {
    const __m256i m = _mm256_madd_epi16(s.m16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bs16 + 16 * sb)));
    macc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(s.dm * dx), macc);
  }
}

// A short token block's tokens in chunks of at most kShortChunk, as even as they come (11 tokens: 6 + 5), each chunk's
// size a compile-time NT so its per-token accumulators live in registers: with the accumulators in a stack array
// (indexed by a runtime token count) every token's update was a load, an FMA and a store of a zmm per 256 values,
// and the loop ran at ~23 % of the vpdpbusd rate (Zen 4, 8 tokens an expert; docs/BENCHMARKS.md). A row's blocks are
// decoded once per chunk. fn(NT, first token of the chunk).
constexpr int kShortChunk = 8;
template <class Fn>
__attribute__((always_inline)) inline void short_block(int nt, Fn&& fn) {
  const int chunks = (nt + kShortChunk - 1) / kShortChunk;
  for (int c = 0, i0 = 0; c < chunks; ++c) {
    const int n = (nt - i0 + (chunks - c) - 1) / (chunks - c);  // the rest split evenly over the chunks left
    switch (n) {
      case 1: fn(std::integral_constant<int, 1>{}, i0); break;
      case 2: fn(std::integral_constant<int, 2>{}, i0); break;
      case 3: fn(std::integral_constant<int, 3>{}, i0); break;
      case 4: fn(std::integral_constant<int, 4>{}, i0); break;
      case 5: fn(std::integral_constant<int, 5>{}, i0); break;
      case 6: fn(std::integral_constant<int, 6>{}, i0); break;
      case 7: fn(std::integral_constant<int, 7>{}, i0); break;
      default: fn(std::integral_constant<int, 8>{}, i0); break;
    }
    i0 += n;
  }
}
static_assert(kShortChunk == 8, "short_block's switch covers chunks of 1..8 tokens");

// One row of a super-block type against NT tokens: out[i] = the row . xs[i], with the same per-token arithmetic, in
// the same order, as the one-token path (the same bits). sbb: bytes per super-block; fetch: prefetch the row stream
// (a row's first chunk).
template <QType t, int NT>
__attribute__((always_inline)) inline void row_tokens_int(const uint8_t* row, int sbb, int64_t nsb,
                                                          const ActRow* xs, bool fetch, float* out) {
  __m512 acc[NT];
  __m256 macc[NT];
  for (int i = 0; i < NT; ++i) {
    acc[i] = _mm512_setzero_ps();
    macc[i] = _mm256_setzero_ps();
  }
  for (int64_t sb = 0; sb < nsb; ++sb) {
    if (fetch) prefetch_ahead<_MM_HINT_T1>(row + sb * sbb, sbb);
    SuperInt s;
    load_super<t>(row, sb, s);
    for (int i = 0; i < NT; ++i) accumulate_super<t>(s, xs[i], sb, acc[i], macc[i]);
  }
  reduce_tokens(acc, has_b<t>() ? macc : nullptr, NT, out);
}

template <QType t>
void dot_direct_int(const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt, float* out) {
  const int64_t nsb = K / 256;
  if (nt == 1) {  // decode: each row's sums kept, then reduced 16 rows at a time (reduce_tokens: the same bits)
    const ActRow& x = xs[0];
    const int sbb = int(row_bytes / nsb);
    auto step = [&](const uint8_t* row, int64_t sb, __m512& acc, __m256& macc) __attribute__((always_inline)) {
      prefetch_ahead(row + sb * sbb, sbb);
      SuperInt s;
      load_super<t>(row, sb, s);
      accumulate_super<t>(s, x, sb, acc, macc);
    };
    // decode_streams() sequential streams: rows [0, h) and [h, R) (h = R for one), a row of each in turn, super-block
    // by super-block; h a whole number of row groups.
    const int h = decode_streams() == 2
                      ? std::min<int>(R, ((R + 1) / 2 + int(kRowGroup) - 1) / int(kRowGroup) * int(kRowGroup))
                      : R;
    alignas(64) __m512 accs[2][kRowGroup];
    alignas(32) __m256 maccs[2][kRowGroup];
    for (int g0 = 0; g0 < h; g0 += kRowGroup) {
      const int na = std::min<int>(h - g0, int(kRowGroup));
      const int nb = std::max(0, std::min<int>(R - h - g0, int(kRowGroup)));
      for (int r = 0; r < na; ++r) {
        const bool two = r < nb;
        const uint8_t* ra = w + size_t(g0 + r) * row_bytes;
        const uint8_t* rb = w + size_t(h + g0 + r) * row_bytes;
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        __m256 macc0 = _mm256_setzero_ps(), macc1 = _mm256_setzero_ps();
        for (int64_t sb = 0; sb < nsb; ++sb) {
          step(ra, sb, acc0, macc0);
          if (two) step(rb, sb, acc1, macc1);
        }
        accs[0][r] = acc0;
        maccs[0][r] = macc0;
        accs[1][r] = acc1;
        maccs[1][r] = macc1;
      }
      reduce_tokens(accs[0], has_b<t>() ? maccs[0] : nullptr, na, out + g0);
      if (nb > 0) reduce_tokens(accs[1], has_b<t>() ? maccs[1] : nullptr, nb, out + h + g0);
    }
    return;
  }
  // A short token block (prefill blocks of kGemmMinTokens and more take quant_gemm_avx512.cpp): one row at a time,
  // its tokens in register-held chunks (short_block).
  const int sbb = int(row_bytes / nsb);
  for (int r = 0; r < R; ++r)  // a row's later chunks read it from L1
    short_block(nt, [&](auto NT, int i0) {
      row_tokens_int<t, NT>(w + size_t(r) * row_bytes, sbb, nsb, xs + i0, i0 == 0, out + r * nt + i0);
    });
}

// One row of a block-32 type against NT tokens (short_block), the per-token arithmetic of the loop it replaced.
template <QType t, int NT>
__attribute__((always_inline)) inline void row_tokens_32(const uint8_t* row, int64_t K, int64_t nsb, const ActRow* xs,
                                                         bool fetch, float* out) {
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm512_setzero_ps();
  const int sbb = int(8 * (t == QType::Q8_0 ? 34 : 18));
  for (int64_t sb = 0; sb < nsb; ++sb) {
    if (fetch) prefetch_ahead<_MM_HINT_T1>(row + sb * sbb, sbb);
    Chunk32 s;
    load_block32<t>(row, K, sb, 1.0f, s);
    for (int i = 0; i < NT; ++i) {
      const ActRow& x = xs[i];
      __m512 f = _mm512_setzero_ps();
      for (int c = 0; c < s.nc; ++c) {
        const __m512i p = _mm512_dpbusd_epi32(zero, s.u[c], _mm512_loadu_si512(x.q + 256 * sb + 64 * c));
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s.a[c], f);
      }
      acc[i] = _mm512_fnmadd_ps(s.b, _mm512_loadu_ps(x.s16 + 16 * sb),
                                _mm512_fmadd_ps(f, _mm512_set1_ps(x.d256[sb]), acc[i]));
    }
  }
  reduce_tokens(acc, nullptr, NT, out);
}

template <QType t>
void dot_direct_32(const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt, float* out) {
  const int64_t nsb = (K + 255) / 256;
  const __m512i zero = _mm512_setzero_si512();
  if (nt == 1) {  // decode: dx folded into A
    const ActRow& x = xs[0];
    const int sbb = int(8 * (t == QType::Q8_0 ? 34 : 18));
    // One row's sum: acc over its super-blocks (chunks of 256 values), in order.
    auto step = [&](const uint8_t* row, int64_t sb, __m512& acc) __attribute__((always_inline)) {
      prefetch_ahead(row + sb * sbb, sbb);
      Chunk32 s;
      load_block32<t>(row, K, sb, x.d256[sb], s);
      acc = _mm512_fnmadd_ps(s.b, _mm512_loadu_ps(x.s16 + 16 * sb), acc);
      for (int c = 0; c < s.nc; ++c) {
        const __m512i p = _mm512_dpbusd_epi32(zero, s.u[c], _mm512_loadu_si512(x.q + 256 * sb + 64 * c));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s.a[c], acc);
      }
    };
    // decode_streams() sequential streams: rows [0, h) and [h, R) (h = R for one), a row of each in turn.
    const int h = decode_streams() == 2 ? (R + 1) / 2 : R;
    for (int r = 0; r < h; ++r) {
      const bool two = h + r < R;
      const uint8_t* ra = w + size_t(r) * row_bytes;
      const uint8_t* rb = w + size_t(h + r) * row_bytes;
      __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
      for (int64_t sb = 0; sb < nsb; ++sb) {
        step(ra, sb, acc0);
        if (two) step(rb, sb, acc1);
      }
      out[r] = _mm512_reduce_add_ps(acc0);
      if (two) out[h + r] = _mm512_reduce_add_ps(acc1);
    }
    return;
  }
  // A short token block (prefill blocks of kGemmMinTokens and more take quant_gemm_avx512.cpp): one row at a time,
  // its tokens in register-held chunks (short_block).
  for (int r = 0; r < R; ++r)  // a row's later chunks read it from L1
    short_block(nt, [&](auto NT, int i0) {
      row_tokens_32<t, NT>(w + size_t(r) * row_bytes, K, nsb, xs + i0, i0 == 0, out + r * nt + i0);
    });
}

void dot_direct_avx512(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt,
                       float* out) {
  switch (t) {
    case QType::Q8_0: dot_direct_32<QType::Q8_0>(w, row_bytes, R, K, xs, nt, out); break;
    case QType::Q4_0: dot_direct_32<QType::Q4_0>(w, row_bytes, R, K, xs, nt, out); break;
    case QType::Q4_K: dot_direct_int<QType::Q4_K>(w, row_bytes, R, K, xs, nt, out); break;
    case QType::Q5_K: dot_direct_int<QType::Q5_K>(w, row_bytes, R, K, xs, nt, out); break;
    case QType::Q6_K: dot_direct_int<QType::Q6_K>(w, row_bytes, R, K, xs, nt, out); break;
    case QType::IQ4_XS: dot_direct_int<QType::IQ4_XS>(w, row_bytes, R, K, xs, nt, out); break;
  }
}

}  // namespace
}  // namespace quant
}  // namespace tessera

TESSERA_ISA_END

namespace tessera {
namespace quant {
namespace {
const Kernels kAvx512 = {QIsa::AVX512VNNI, quantize_row_avx512, nullptr, nullptr, dot_direct_avx512};
}  // namespace
const Kernels& kernels_avx512_vnni() { return kAvx512; }
}  // namespace quant
}  // namespace tessera
