// Quantized kernels, AVX-512 VNNI: one vpdpbusd per 64 codes x 64 int8 activations (u8 x s8 -> 16 int32 lanes of 4
// products, exact), converted to f32 and multiplied into the accumulator with A * dx per lane; the B terms (mins,
// code offsets) are one fnmadd per 16 groups. R rows share each activation load. AVX-512F/BW/VL/DQ + VNNI code
// between the ISA markers only (isa_target.h); the unpacking and activation quantization come from quant_body.inc.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant_kernels.h"
#include "tessera/bf16.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_VNNI)

namespace tessera {
namespace quant {
namespace {

#include "quant_body.inc"

template <int R>
void dot_rows_n(const uint8_t* u, const float* a4, const float* b16, int64_t K, const ActRow& x, float* out) {
  const int64_t Kp = padded_k(K), S16 = padded_s16(K), K4 = Kp / 4;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t c = 0; c < Kp / 64; ++c) {
    const __m512i xq = _mm512_loadu_si512(x.q + 64 * c);
    const __m512 dx = _mm512_loadu_ps(x.d4 + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512i p = _mm512_dpbusd_epi32(zero, _mm512_loadu_si512(u + r * Kp + 64 * c), xq);
      const __m512 ad = _mm512_mul_ps(_mm512_loadu_ps(a4 + r * K4 + 16 * c), dx);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), ad, acc[r]);
    }
  }
  for (int64_t g = 0; g < S16; g += 16) {
    const __m512 s = _mm512_loadu_ps(x.s16 + g);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fnmadd_ps(_mm512_loadu_ps(b16 + r * S16 + g), s, acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
}

void dot_rows_avx512(const uint8_t* u, const float* a4, const float* b16, int R, int64_t K, const ActRow& x, bool,
                     float* out) {
  switch (R) {
    case 4: dot_rows_n<4>(u, a4, b16, K, x, out); break;
    case 3: dot_rows_n<3>(u, a4, b16, K, x, out); break;
    case 2: dot_rows_n<2>(u, a4, b16, K, x, out); break;
    default: dot_rows_n<1>(u, a4, b16, K, x, out); break;
  }
}


// ---- Direct path: codes and scales of 256 values at a time ("super-chunk": one K-quant super-block, or 8 blocks of
// Q8_0/Q4_0) decoded from the file's blocks into registers, then every token of the block passes over them. Same codes
// and the same f32 A/B values as unpack_row_body (each A = d * sc is one IEEE multiply in both), so the results equal
// the tile path's up to f32 summation order.
struct SuperChunk {
  __m512i u[4];  // codes of chunk c (64 values)
  __m512 a[4];   // A per vpdpbusd lane of chunk c
  __m512 b;      // B per 16-group
  int nc;        // chunks present (block-32 types: fewer at the end of a row whose K is not a multiple of 256)
};

inline __m512i lane_div(int shift) {  // lane l -> l >> shift
  return _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), shift);
}
inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
inline __m512i cat(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// A16 (per 16-group) -> per-lane A of the four chunks.
inline void spread_groups(__m512 a16, SuperChunk& s) {
  const __m512i q = lane_div(2);
  for (int c = 0; c < 4; ++c) s.a[c] = _mm512_permutexvar_ps(_mm512_add_epi32(q, _mm512_set1_epi32(4 * c)), a16);
}

template <QType t>
__attribute__((always_inline)) inline void load_block32(const uint8_t* row, int64_t K, int64_t sb, SuperChunk& s) {
  const int bytes = t == QType::Q8_0 ? 34 : 18;
  const int64_t b0 = 8 * sb, nblk = std::min<int64_t>(8, K / 32 - b0);
  alignas(16) uint16_t dh[8] = {0};  // the blocks' f16 scales, converted together (vcvtph2ps: exact)
  const __m256i m4 = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8(char(0x80));
  __m256i code[8];
  auto one = [&](int j) {
    const uint8_t* blk = row + (b0 + j) * bytes;
    std::memcpy(&dh[j], blk, 2);
    if (t == QType::Q8_0) {
      code[j] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)), flip);
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
  const __m512 dv = _mm512_insertf32x8(_mm512_setzero_ps(),
                                        _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh))), 0);
  const __m512i l8 = lane_div(3);
  for (int c = 0; c < 4; ++c) {
    s.u[c] = cat(code[2 * c], code[2 * c + 1]);
    s.a[c] = _mm512_permutexvar_ps(_mm512_add_epi32(l8, _mm512_set1_epi32(2 * c)), dv);
  }
  s.b = _mm512_mul_ps(_mm512_set1_ps(t == QType::Q8_0 ? 128.0f : 8.0f), _mm512_permutexvar_ps(lane_div(1), dv));
}

template <QType t>
__attribute__((always_inline)) inline void load_kquant(const uint8_t* row, int64_t sb, SuperChunk& s) {
  s.nc = 4;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  switch (t) {
    case QType::Q4_K:
    case QType::Q5_K: {
      const bool five = t == QType::Q5_K;
      const uint8_t* blk = row + sb * (five ? 176 : 144);
      uint32_t ut[4];
      std::memcpy(ut, blk + 4, 12);
      const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
      ut[3] = ((ut[2] >> 4) & k2) | (((ut[1] >> 6) & k3) << 4);
      const uint32_t aux = ut[1] & k1;
      ut[1] = (ut[2] & k2) | (((ut[0] >> 6) & k3) << 4);
      ut[2] = aux;
      ut[0] &= k1;  // bytes 0-7: sub-scales, 8-15: mins
      const __m512 sm = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ut))));
      const __m512i dup = lane_div(1);
      const __m512 a16 = _mm512_mul_ps(_mm512_set1_ps(f16(blk)), _mm512_permutexvar_ps(dup, sm));
      s.b = _mm512_mul_ps(_mm512_set1_ps(f16(blk + 2)),
                          _mm512_permutexvar_ps(_mm512_add_epi32(dup, _mm512_set1_epi32(8)), sm));
      spread_groups(a16, s);
      const uint8_t* qs = blk + (five ? 48 : 16);
      const __m256i qh = five ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)) : _mm256_setzero_si256();
      const __m256i one = _mm256_set1_epi8(1);
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (five) {
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
        }
        s.u[c] = cat(lo, hi);
      }
      break;
    }
    case QType::Q6_K: {
      const uint8_t* blk = row + sb * 210;
      const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192))));
      const __m512 a16 = _mm512_mul_ps(_mm512_set1_ps(f16(blk + 208)), sc);
      s.b = _mm512_mul_ps(_mm512_set1_ps(32.0f), a16);
      spread_groups(a16, s);
      const __m512i m4z = _mm512_set1_epi8(0x0F);
      const __m256i m3 = _mm256_set1_epi8(3);
      for (int c = 0; c < 4; ++c) {
        const int h = c / 2, sh = 4 * (c % 2);
        const __m512i l = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(blk + 64 * h), sh), m4z);
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
        const __m512i hb = cat(_mm256_and_si256(_mm256_srli_epi16(q, sh), m3), _mm256_and_si256(_mm256_srli_epi16(q, sh + 2), m3));
        s.u[c] = _mm512_or_si512(l, _mm512_slli_epi16(hb, 4));
      }
      break;
    }
    default: {  // IQ4_XS
      const uint8_t* blk = row + sb * 136;
      uint32_t sl;  // sub-block ib: ls = ((scales_l >> 4 ib) & 15) | ((scales_h >> 2 ib) & 3) << 4, all 8 at once
      std::memcpy(&sl, blk + 4, 4);
      const int sh = int(blk[2]) | int(blk[3]) << 8;
      const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(sl)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                          _mm256_set1_epi32(0xF));
      const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sh), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                          _mm256_set1_epi32(3));
      const __m256 ls = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32)));
      const __m512 a16 = _mm512_mul_ps(_mm512_set1_ps(f16(blk)),
                                       _mm512_permutexvar_ps(lane_div(1), _mm512_castps256_ps512(ls)));
      s.b = _mm512_mul_ps(_mm512_set1_ps(128.0f), a16);
      spread_groups(a16, s);
      alignas(16) static const uint8_t tab[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};  // kIQ4Values + 128
      const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(tab)));
      const __m512i order = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 8 + 32 * c));
        const __m512i nib = _mm512_permutex2var_epi64(_mm512_castsi256_si512(_mm256_and_si256(v, m4)), order,
                                                      _mm512_castsi256_si512(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4)));
        s.u[c] = _mm512_shuffle_epi8(table, nib);
      }
      break;
    }
  }
}

template <QType t>
void dot_direct_t(const uint8_t* row, int64_t K, const ActRow* xs, int nt, float* out) {
  constexpr bool block32 = t == QType::Q8_0 || t == QType::Q4_0;
  const int64_t nsb = (K + 255) / 256;
  const __m512i zero = _mm512_setzero_si512();
  SuperChunk s;
  if (nt == 1) {  // decode: four independent accumulators keep the FMA chain short
    const ActRow& x = xs[0];
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t sb = 0; sb < nsb; ++sb) {
      if (block32) load_block32<t>(row, K, sb, s); else load_kquant<t>(row, sb, s);
      for (int c = 0; c < s.nc; ++c) {
        const int64_t ch = 4 * sb + c;
        const __m512i p = _mm512_dpbusd_epi32(zero, s.u[c], _mm512_loadu_si512(x.q + 64 * ch));
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(s.a[c], _mm512_loadu_ps(x.d4 + 16 * ch)), acc[c]);
      }
      acc[0] = _mm512_fnmadd_ps(s.b, _mm512_loadu_ps(x.s16 + 16 * sb), acc[0]);
    }
    out[0] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
    return;
  }
  alignas(64) __m512 acc[kTokenBlock];
  for (int i = 0; i < nt; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    if (block32) load_block32<t>(row, K, sb, s); else load_kquant<t>(row, sb, s);
    for (int i = 0; i < nt; ++i) {
      const ActRow& x = xs[i];
      __m512 a0 = acc[i], a1 = _mm512_setzero_ps();
      for (int c = 0; c < s.nc; ++c) {
        const int64_t ch = 4 * sb + c;
        const __m512i p = _mm512_dpbusd_epi32(zero, s.u[c], _mm512_loadu_si512(x.q + 64 * ch));
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(p), _mm512_loadu_ps(x.d4 + 16 * ch));
        if (c & 1) a1 = _mm512_fmadd_ps(f, s.a[c], a1); else a0 = _mm512_fmadd_ps(f, s.a[c], a0);
      }
      acc[i] = _mm512_add_ps(_mm512_fnmadd_ps(s.b, _mm512_loadu_ps(x.s16 + 16 * sb), a0), a1);
    }
  }
  for (int i = 0; i < nt; ++i) out[i] = _mm512_reduce_add_ps(acc[i]);
}

void dot_direct_avx512(QType t, const uint8_t* row, int64_t K, const ActRow* xs, int nt, float* out) {
  switch (t) {
    case QType::Q8_0: dot_direct_t<QType::Q8_0>(row, K, xs, nt, out); break;
    case QType::Q4_0: dot_direct_t<QType::Q4_0>(row, K, xs, nt, out); break;
    case QType::Q4_K: dot_direct_t<QType::Q4_K>(row, K, xs, nt, out); break;
    case QType::Q5_K: dot_direct_t<QType::Q5_K>(row, K, xs, nt, out); break;
    case QType::Q6_K: dot_direct_t<QType::Q6_K>(row, K, xs, nt, out); break;
    case QType::IQ4_XS: dot_direct_t<QType::IQ4_XS>(row, K, xs, nt, out); break;
  }
}

}  // namespace
}  // namespace quant
}  // namespace tessera

TESSERA_ISA_END

namespace tessera {
namespace quant {
namespace {
const Kernels kAvx512 = {QIsa::AVX512VNNI, quantize_row_body, unpack_rows_body, dot_rows_avx512,
                         dot_direct_avx512};
}  // namespace
const Kernels& kernels_avx512_vnni() { return kAvx512; }
}  // namespace quant
}  // namespace tessera
