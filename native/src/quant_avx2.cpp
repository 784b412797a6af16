// Quantized kernels, AVX2 + FMA + F16C: decode and prefill blocks below the AVX2 GEMM's threshold (quant_gemm_avx2.cpp)
// read each row straight from the file's blocks (dot_direct, below); the activations are quantized by quant_body.inc.
// Code between the ISA markers only (isa_target.h).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant_kernels.h"
#include "tessera/tuning.h"
#include "tessera/bf16.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX2)

namespace tessera {
namespace quant {
namespace {

#include "quant_body.inc"

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- Decode straight from the blocks (dot_direct) ----
// One token: Q4_K, Q5_K and Q6_K rows (the Q4_K_M / Q5_K_M mixes) are read from their blocks into registers, with no
// tile in memory between: per 32 codes one maddubs (u8 code x s8 activation -> int16 pairs) and one madd by the
// sub-scale (int16 -> int32), summed in int32 over the super-block, then one f32 multiply-add per 256 values (d * dx)
// and one for the mins (Q4_K, Q5_K) or the codes' offset 32 (Q6_K) against the activations' 16-value sums (bs16);
// IQ4_XS looks its codes up (vpshufb) and multiplies them as signed bytes. Q8_0, Q4_0: one f32 multiply-add per
// 32-value block. The rows are read one after the other, prefetched ahead (prefetch_ahead, as the AVX-512 decode).
// Token blocks below the AVX2 GEMM's threshold take the same per-token dots (rows_direct).

inline float f16_to_f32(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 16 int16 lanes from the bytes of `bytes16` that `idx` picks, zero- or sign-extended.
inline __m256i pick_u16(__m128i bytes16, __m128i idx) { return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(bytes16, idx)); }
inline __m256i pick_s16(__m128i bytes16, __m128i idx) { return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(bytes16, idx)); }
inline __m128i bytes_idx(int a, int b) {  // 8 x byte a, then 8 x byte b
  const char x = char(a), y = char(b);
  return _mm_setr_epi8(x, x, x, x, x, x, x, x, y, y, y, y, y, y, y, y);
}

// Q4_K / Q5_K row . x. Block (144 / 176 bytes): d (f16), dmin (f16), 12 bytes of 6-bit sub-scales and mins, (Q5_K:
// 32 bytes qh of the codes' fifth bits,) 128 bytes qs: the low nibbles of qs[32j .. 32j + 31] are values 64j .. 64j + 31
// (sub-block 2j), their high nibbles the next 32 (sub-block 2j + 1); Q5_K's bit 4 of them is bit 2j / 2j + 1 of
// qh[0 .. 31]. value = d * sc[sub] * code - dmin * m[sub].
template <bool Five>
float row_dot_q45_k(const uint8_t* row, int64_t nsb, const ActRow& x, bool fetch) {
  constexpr int kBlockBytes = Five ? 176 : 144;
  const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
  const __m128i dup_mins = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = row + sb * kBlockBytes;
    if (fetch) prefetch_ahead(blk, kBlockBytes);
    // The 12 scale bytes -> sub-scales 0-7 and mins 0-7, a byte each (ggml's get_scale_min_k4, 4 at a time).
    uint32_t u0, u1, s2;
    std::memcpy(&u0, blk + 4, 4);
    std::memcpy(&u1, blk + 8, 4);
    std::memcpy(&s2, blk + 12, 4);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    const uint64_t sc = uint64_t(u0 & k1) | uint64_t((s2 & k2) | (((u0 >> 6) & k3) << 4)) << 32;
    const uint64_t mn = uint64_t(u1 & k1) | uint64_t(((s2 >> 4) & k2) | (((u1 >> 6) & k3) << 4)) << 32;
    const __m128i scv = _mm_cvtsi64_si128(int64_t(sc)), mnv = _mm_cvtsi64_si128(int64_t(mn));
    const uint8_t* qs = blk + (Five ? 48 : 16);
    const __m256i qh = Five ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)) : _mm256_setzero_si256();
    const int8_t* xq = x.q + 256 * sb;
    __m256i isum = _mm256_setzero_si256();  // [8] int32: |sum| <= 8 * 4 * 31 * 127 * 63
    for (int j = 0; j < 4; ++j) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
      __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      if (Five) {  // bit 2j (2j + 1) of each qh byte -> bit 4 of the low (high) nibbles' codes
        const __m256i bit_lo = _mm256_set1_epi8(char(1 << (2 * j))), bit_hi = _mm256_set1_epi8(char(1 << (2 * j + 1)));
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_lo), bit_lo), b4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_hi), bit_hi), b4));
      }
      const __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64 * j)));
      const __m256i phi =
          _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64 * j + 32)));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(plo, pick_u16(scv, bytes_idx(2 * j, 2 * j))));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(phi, pick_u16(scv, bytes_idx(2 * j + 1, 2 * j + 1))));
    }
    const float dx = x.d256[sb];
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(f16_to_f32(blk) * dx), acc);
    // mins: lane k = m[k] * (bs16[2k] + bs16[2k + 1])
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bs16 + 16 * sb));
    const __m256i mterm = _mm256_madd_epi16(pick_u16(mnv, dup_mins), bs);
    macc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mterm), _mm256_set1_ps(f16_to_f32(blk + 2) * dx), macc);
  }
  return hsum(acc) - hsum(macc);
}

// Q6_K row . x. Block (210 bytes): ql (128: low 4 bits), qh (64: high 2 bits), 16 int8 sub-scales (16 values each),
// d (f16). In half h, for l < 32: the low / high nibble of ql[64h + l] are values 128h + l / 128h + 64 + l, of
// ql[64h + 32 + l] values 128h + 32 + l / 128h + 96 + l; their high bits are bits 0-1 / 4-5 / 2-3 / 6-7 of qh[32h + l].
// value = d * sc[value / 16] * (code - 32): the 32 is taken off against the activations' 16-value sums.
float row_dot_q6_k(const uint8_t* row, int64_t nsb, const ActRow& x, bool fetch) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  __m256 acc = _mm256_setzero_ps(), oacc = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = row + sb * 210;
    if (fetch) prefetch_ahead(blk, 210);
    const __m128i scb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));  // [16] int8
    const int8_t* xq = x.q + 256 * sb;
    __m256i isum = _mm256_setzero_si256();  // [8] int32: |sum| <= 16 * 2 * 63 * 127 * 128
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      __m256i q[4];  // q[k]: codes of values 128h + 32k + l, l < 32
      q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
      q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
      for (int k = 0; k < 4; ++k) {
        const int g = 8 * h + 2 * k;  // the 16-value groups of these 32 values: g, g + 1
        const __m256i p = _mm256_maddubs_epi16(
            q[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 128 * h + 32 * k)));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, pick_s16(scb, bytes_idx(g, g + 1))));
      }
    }
    const float ddx = f16_to_f32(blk + 208) * x.d256[sb];
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(ddx), acc);
    // the offset: 32 * sum_g sc[g] * bs16[g]
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bs16 + 16 * sb));
    const __m256i oterm = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scb), bs);
    oacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(oterm), _mm256_set1_ps(32.0f * ddx), oacc);
  }
  return hsum(acc) - hsum(oacc);
}

// Q8_0 / Q4_0 row . x. Q8_0 block (34 bytes): d (f16), 32 int8 codes, value = d * code; Q4_0 block (18 bytes): d
// (f16), 16 bytes whose low nibbles are values 0-15 and high nibbles 16-31, value = d * (nibble - 8). `vpmaddubsw`
// wants one operand unsigned: |w| x (x with w's sign), at most 128 * 127 * 2 in an int16 pair.
template <QType t>
float row_dot_32(const uint8_t* row, int64_t K, const ActRow& x, bool fetch) {
  constexpr int kBlockBytes = t == QType::Q8_0 ? 34 : 18;
  const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  const int64_t nb = K / 32;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {  // the 8 blocks of one 256-value activation block (fewer at the end)
    const int64_t b1 = std::min(nb, b0 + 8);
    __m256 part = _mm256_setzero_ps();
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* blk = row + b * kBlockBytes;
      if (fetch) prefetch_ahead(blk, kBlockBytes);
      __m256i w;  // [32] int8: the block's values / d
      if (t == QType::Q8_0) {
        w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      } else {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
        w = _mm256_sub_epi8(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4), eight);
      }
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 32 * b));
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xq, w)), ones);
      part = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(f16_to_f32(blk)), part);
    }
    acc = _mm256_fmadd_ps(part, _mm256_set1_ps(x.d256[b0 / 8]), acc);
  }
  return hsum(acc);
}

// IQ4_XS row . x. Block (136 bytes): d (f16), scales_h (16 bits: 2 per sub-block), scales_l (4 bytes: a nibble per
// sub-block), qs (128 bytes). Sub-block ib (32 values): scale ls - 32 with ls = scales_l nibble | scales_h bits << 4;
// qs[16 ib + l] low / high nibble = value 32 ib + l / 32 ib + 16 + l, an index into the non-linear code book.
float row_dot_iq4_xs(const uint8_t* row, int64_t nsb, const ActRow& x, bool fetch) {
  const __m256i book = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = row + sb * 136;
    if (fetch) prefetch_ahead(blk, 136);
    const int sh = int(blk[2]) | int(blk[3]) << 8;
    uint64_t ls = 0;  // byte ib: the sub-block's scale ls - 32 (int8)
    for (int ib = 0; ib < 8; ++ib) {
      const int l = ((blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
      ls |= uint64_t(uint8_t(l - 32)) << (8 * ib);
    }
    const __m128i lsv = _mm_cvtsi64_si128(int64_t(ls));
    const int8_t* xq = x.q + 256 * sb;
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {  // sub-blocks 2c (low 128-bit lane) and 2c + 1 (high lane)
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 8 + 32 * c));
      const __m256i wlo = _mm256_shuffle_epi8(book, _mm256_and_si256(v, m4));
      const __m256i whi = _mm256_shuffle_epi8(book, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
      const int8_t* xc = xq + 64 * c;  // values 0-15 / 16-31 of sub-block 2c, then of 2c + 1
      const __m256i xlo = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(xc + 32), reinterpret_cast<const __m128i*>(xc));
      const __m256i xhi =
          _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(xc + 48), reinterpret_cast<const __m128i*>(xc + 16));
      const __m256i scale = pick_s16(lsv, bytes_idx(2 * c, 2 * c + 1));
      const __m256i plo = _mm256_maddubs_epi16(_mm256_abs_epi8(wlo), _mm256_sign_epi8(xlo, wlo));
      const __m256i phi = _mm256_maddubs_epi16(_mm256_abs_epi8(whi), _mm256_sign_epi8(xhi, whi));
      isum = _mm256_add_epi32(isum, _mm256_add_epi32(_mm256_madd_epi16(plo, scale), _mm256_madd_epi16(phi, scale)));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(f16_to_f32(blk) * x.d256[sb]), acc);
  }
  return hsum(acc);
}

// Rows [0, R) at `w`, nt tokens (decode, and token blocks below the AVX2 GEMM's threshold) -> out[r * nt + i]: each
// (row, token) straight from the blocks, a row's blocks re-read from L1 for its next tokens (only its first token
// prefetches the stream ahead); a token's result is the same bits whatever its companions.
template <QType t>
void rows_direct(const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt, float* out) {
  const int64_t nsb = K / 256;
  auto dot = [&](int r, int i) __attribute__((always_inline)) {  // out[r * nt + i] = row r . token i
    const uint8_t* row = w + size_t(r) * row_bytes;
    float& o = out[r * nt + i];
    const bool fetch = i == 0;
    if constexpr (t == QType::Q4_K || t == QType::Q5_K) o = row_dot_q45_k<t == QType::Q5_K>(row, nsb, xs[i], fetch);
    else if constexpr (t == QType::Q6_K) o = row_dot_q6_k(row, nsb, xs[i], fetch);
    else if constexpr (t == QType::IQ4_XS) o = row_dot_iq4_xs(row, nsb, xs[i], fetch);
    else o = row_dot_32<t>(row, K, xs[i], fetch);
  };
  if (nt == 1) {  // decode: decode_streams() sequential streams, rows [0, h) and [h, R), a row of each in turn
    const int h = decode_streams() == 2 ? (R + 1) / 2 : R;
    for (int r = 0; r < h; ++r) {
      dot(r, 0);
      if (h + r < R) dot(h + r, 0);
    }
    return;
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < nt; ++i) dot(r, i);
}

void dot_direct_avx2(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt,
                     float* out) {
  switch (t) {
    case QType::Q4_K: return rows_direct<QType::Q4_K>(w, row_bytes, R, K, xs, nt, out);
    case QType::Q5_K: return rows_direct<QType::Q5_K>(w, row_bytes, R, K, xs, nt, out);
    case QType::Q6_K: return rows_direct<QType::Q6_K>(w, row_bytes, R, K, xs, nt, out);
    case QType::IQ4_XS: return rows_direct<QType::IQ4_XS>(w, row_bytes, R, K, xs, nt, out);
    case QType::Q4_0: return rows_direct<QType::Q4_0>(w, row_bytes, R, K, xs, nt, out);
    case QType::Q8_0: return rows_direct<QType::Q8_0>(w, row_bytes, R, K, xs, nt, out);
  }
}

}  // namespace
}  // namespace quant
}  // namespace tessera

TESSERA_ISA_END

namespace tessera {
namespace quant {
namespace {
const Kernels kAvx2 = {QIsa::AVX2, quantize_row_body, nullptr, nullptr, dot_direct_avx2};
}  // namespace
const Kernels& kernels_avx2() { return kAvx2; }
}  // namespace quant
}  // namespace tessera
