// Quantized prefill GEMM on AMX int8 tiles (TDPBSSD): gemm_avx512_vnni_packed's contract (R <= kRowGroup rows of the
// file's blocks, nt <= 256 tokens packed by gemm_avx512_vnni_pack, out [R, nt]) for every type of quant.h. Decode (one
// token) never comes here. Q8_0 / Q4_0 (an f16 scale per 32 values) are at the end of the file (gemm_blocks); the
// super-block types Q4_K, Q5_K, Q6_K and IQ4_XS first (gemm_fold).
//
// The problem tiles have with the super-block types: every 16 or 32 values of a row have their own integer sub-scale sc (and
// Q4_K/Q5_K a min m), so a tile's int32 sums would have to be scaled per sub-block, i.e. stored and multiplied in
// vector registers after every K = 16/32 step. Instead each code is multiplied by its sub-scale at decode, exactly, in
// 16 bits: v = sc * (u - off) (Q4_K/Q5_K: sc * u <= 63 * 31; Q6_K: sc * (u - 32), |v| <= 128 * 32; IQ4_XS:
// (ls - 32) * kvalue, |v| <= 32 * 127), and v is split into two int8 codes lo = v & 127, hi = v >> 7 (arithmetic:
// -32 <= hi <= 32, v = 128 hi + lo). A row's lo and hi codes are rows r and r + 8 of one A tile (8 weight rows per
// tile), so one TDPBSSD of K = 64 gives both halves of 8 rows x 16 tokens, and the int32 sums run over a whole
// 256-value super-block:
//   S = C[r] + 128 C[r + 8] = sum_g sc_g sum_{i in g} (u_i - off) q_i      (exact: |S| < 2^31)
// Per (row, token, super-block) one f32 step remains: acc += float(S) * (d * dx), d the super-block's f16 scale and dx
// the token's Q8_K scale; Q4_K/Q5_K's mins are subtracted at the end as in the VNNI GEMM: acc -= sum_g (dmin m_g) *
// (dx sum_g q). The integer part is exact, so each weight is exactly the value gguf.quants.dequantize gives; the f32
// rounding differs from the VNNI GEMM's (which scales every sub-block in f32), and each (row, token) result depends
// only on that row and that token.
//
// Blocking: 16 rows (two A tiles) x 32 tokens (two B tiles, the packing's xt rows are a B tile as stored) -> four C
// tiles (tmm0-3; A tmm4-5, B tmm6-7), one super-block at a time: 4 x (2 A + 2 B loads, 4 TDPBSSD), then the four C
// tiles go through memory into f32 accumulators. Rows are decoded 16 at a time into a per-thread panel (L2) that every
// token pair reuses; the next rows' blocks are prefetched meanwhile.
//
// Two tile back ends, the same code: the instructions (inline asm, called only where CpuFeatures grants AMX) and the
// emulator (amx_tile_emu.h), so the blocking and the arithmetic are tested on any CPU with AVX-512 VNNI.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "amx_tile.h"
#include "amx_tile_emu.h"
#include "quant_kernels.h"
#include "tessera/bf16.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_VNNI)

namespace tessera {
namespace quant {
namespace {

using amx::TileConfig;

#include "amx_tiles_local.inc"  // HwTiles (inline asm) and EmuTiles, file-local

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

constexpr int kPanelRows = 16;  // weight rows per panel: two A tiles of 8 (lo and hi codes each)
constexpr int kTileBytes = 1024;

// A panel of 16 weight rows: codes [2 octets][nsb][4 K-steps][16 tile rows][64] int8 (tile row r < 8: lo codes of
// weight row 8 o + r; r >= 8: hi codes of weight row 8 o + r - 8), d [16][nsb] the super-block scales, bmin
// [16][K/32] dmin * m (Q4_K/Q5_K only).
struct Panel {
  int8_t* codes;
  float* d;
  float* bmin;
  int64_t nsb;
  int8_t* lo(int row, int64_t sb, int ks) const {
    return codes + (((int64_t(row / 8) * nsb + sb) * 4 + ks) * 16 + row % 8) * 64;
  }
};

// Byte-shuffle indices that spread a lane's scale bytes over the even (or odd) bytes of a 64-value chunk: chunk j,
// 128-bit lane L gets scale byte (kPerLane ? 4 j + L : 2 j + L / 2), the other bytes zero (index 0x80).
struct ScaleIdx {
  __m512i even[4], odd[4];
  explicit ScaleIdx(bool per_lane) {
    alignas(64) uint8_t e[64], o[64];
    for (int j = 0; j < 4; ++j) {
      for (int b = 0; b < 64; ++b) {
        const int L = b / 16;
        const uint8_t s = uint8_t(per_lane ? 4 * j + L : 2 * j + L / 2);
        e[b] = b % 2 == 0 ? s : 0x80;
        o[b] = b % 2 == 1 ? s : 0x80;
      }
      even[j] = _mm512_load_si512(e);
      odd[j] = _mm512_load_si512(o);
    }
  }
};

// 64 codes u (unsigned bytes, value order) times their scales (se: scale in the even bytes, so: in the odd bytes,
// signed), minus off * scale (kOff), split into lo = v & 127 (-> dst, a panel tile row) and hi = v >> 7 (arithmetic;
// -> dst + 8 tile rows).
template <int kOff>
__attribute__((always_inline)) inline void fold_store(__m512i u, __m512i se, __m512i so, int8_t* dst) {
  __m512i pe = _mm512_maddubs_epi16(u, se);  // u_even * sc: |.| <= 255 * 128, no saturation (the odd byte is 0)
  __m512i po = _mm512_maddubs_epi16(u, so);
  if (kOff) {
    const __m512i off = _mm512_set1_epi8(char(kOff));
    pe = _mm512_sub_epi16(pe, _mm512_maddubs_epi16(off, se));
    po = _mm512_sub_epi16(po, _mm512_maddubs_epi16(off, so));
  }
  const __m512i m7f = _mm512_set1_epi16(0x7F), mff = _mm512_set1_epi16(0xFF);
  // (a & c) | (b & ~c): imm 0xE4.
  const __m512i l = _mm512_ternarylogic_epi32(pe, _mm512_slli_epi16(_mm512_and_si512(po, m7f), 8), m7f, 0xE4);
  const __m512i h = _mm512_ternarylogic_epi32(_mm512_srai_epi16(pe, 7), _mm512_slli_epi16(po, 1), mff, 0xE4);
  _mm512_store_si512(dst, l);
  _mm512_store_si512(dst + 8 * 64, h);
}

inline __m512i join(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }

// Q4_K / Q5_K row -> panel row `row`: codes 64 j .. 64 j + 63 of a super-block are the low nibbles (then the high
// nibbles) of qs[32 j ..]; Q5_K's bit 4 of value 32 s + l is bit s of qh[l]. Scales and mins by llama.cpp's u32
// shuffle (quant_gemm_avx512.cpp decode_row_q45k).
template <bool kFive>
void decode_q45k(const uint8_t* src, int64_t nsb, const ScaleIdx& ix, const Panel& P, int row) {
  const int bytes = kFive ? 176 : 144;
  const __m256i lo4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  for (int64_t b = 0; b < nsb; ++b) {
    const uint8_t* blk = src + bytes * b;
    const float d = f16_at(blk), dmin = f16_at(blk + 2);
    uint32_t q[4];
    std::memcpy(q, blk + 4, 12);
    const uint32_t sc_hi = (q[2] & 0x0f0f0f0fu) | (((q[0] >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((q[2] >> 4) & 0x0f0f0f0fu) | (((q[1] >> 6) & 0x03030303u) << 4);
    const uint64_t scs = uint64_t(q[0] & 0x3f3f3f3fu) | uint64_t(sc_hi) << 32;
    const uint64_t mins = uint64_t(q[1] & 0x3f3f3f3fu) | uint64_t(m_hi) << 32;
    P.d[row * nsb + b] = d;
    const __m256 fm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(mins))));
    _mm256_storeu_ps(P.bmin + row * nsb * 8 + 8 * b, _mm256_mul_ps(_mm256_set1_ps(dmin), fm));
    const __m512i sv = _mm512_broadcast_i32x4(_mm_cvtsi64_si128(int64_t(scs)));
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    const __m256i qh = kFive ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)) : _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
      __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
      if (kFive) {
        lo = _mm256_mask_add_epi8(lo, _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1u << (2 * j)))), lo, bit4);
        hi = _mm256_mask_add_epi8(hi, _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1u << (2 * j + 1)))), hi, bit4);
      }
      fold_store<0>(join(lo, hi), _mm512_shuffle_epi8(sv, ix.even[j]), _mm512_shuffle_epi8(sv, ix.odd[j]),
                    P.lo(row, b, j));
    }
  }
}

// Q6_K row: value 32 (4 h + 2 s + k) + l = nibble s of ql[64 h + 32 k + l] | bits 2 (2 s + k) of qh[32 h + l] << 4;
// chunk j (values 64 j ..) is h = j / 2, s = j % 2, k = 0 and 1. v = sc * (u - 32), 16 scales per super-block.
void decode_q6k(const uint8_t* src, int64_t nsb, const ScaleIdx& ix, const Panel& P, int row) {
  const __m256i lo4 = _mm256_set1_epi8(0x0F), lo2 = _mm256_set1_epi8(0x03);
  for (int64_t b = 0; b < nsb; ++b) {
    const uint8_t* blk = src + 210 * b;
    P.d[row * nsb + b] = f16_at(blk + 208);
    const __m512i sv = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    for (int j = 0; j < 4; ++j) {
      const int h = j / 2, s = j % 2;
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      __m256i part[2];
      for (int k = 0; k < 2; ++k) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * k));
        const __m256i nib = s ? _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4) : _mm256_and_si256(v, lo4);
        const __m256i top = _mm256_slli_epi16(
            _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * (2 * s + k))), lo2), 4);
        part[k] = _mm256_or_si256(nib, top);
      }
      fold_store<32>(join(part[0], part[1]), _mm512_shuffle_epi8(sv, ix.even[j]), _mm512_shuffle_epi8(sv, ix.odd[j]),
                     P.lo(row, b, j));
    }
  }
}

// IQ4_XS row: group ib's 32 values are kvalues[low nibbles of qs[16 ib ..]] then kvalues[high nibbles]; codes
// kvalue + 128 (unsigned), v = (ls - 32) * kvalue.
void decode_iq4xs(const uint8_t* src, int64_t nsb, const ScaleIdx& ix, const Panel& P, int row) {
  const __m128i lo4 = _mm_set1_epi8(0x0F);
  alignas(16) uint8_t book[16];
  for (int i = 0; i < 16; ++i) book[i] = uint8_t(kIQ4Values[i] + 128);
  const __m128i table = _mm_load_si128(reinterpret_cast<const __m128i*>(book));
  for (int64_t b = 0; b < nsb; ++b) {
    const uint8_t* blk = src + 136 * b;
    P.d[row * nsb + b] = f16_at(blk);
    const unsigned scales_h = unsigned(blk[2]) | unsigned(blk[3]) << 8;
    alignas(16) int8_t ls[16] = {};
    for (int ib = 0; ib < 8; ++ib)
      ls[ib] = int8_t((((blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4)) - 32);
    const __m512i sv = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(ls)));
    for (int j = 0; j < 4; ++j) {
      __m128i q[4];
      for (int g = 0; g < 2; ++g) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 8 + 16 * (2 * j + g)));
        q[2 * g] = _mm_shuffle_epi8(table, _mm_and_si128(v, lo4));
        q[2 * g + 1] = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(v, 4), lo4));
      }
      const __m512i u = join(_mm256_inserti128_si256(_mm256_castsi128_si256(q[0]), q[1], 1),
                             _mm256_inserti128_si256(_mm256_castsi128_si256(q[2]), q[3], 1));
      fold_store<128>(u, _mm512_shuffle_epi8(sv, ix.even[j]), _mm512_shuffle_epi8(sv, ix.odd[j]),
                      P.lo(row, b, j));
    }
  }
}

// Rows [0, rn) of a panel from their blocks; rows rn .. 8 * octets - 1 zero (codes, d and bmin).
void decode_panel(QType t, const uint8_t* w, size_t row_bytes, int rn, int octets, int64_t nsb, const ScaleIdx& ix,
                  const Panel& P) {
  for (int r = 0; r < 8 * octets; ++r) {
    const uint8_t* src = w + size_t(r) * row_bytes;
    if (r >= rn) {
      for (int64_t b = 0; b < nsb; ++b)
        for (int ks = 0; ks < 4; ++ks) {
          std::memset(P.lo(r, b, ks), 0, 64);
          std::memset(P.lo(r, b, ks) + 8 * 64, 0, 64);
        }
      std::fill(P.d + r * nsb, P.d + (r + 1) * nsb, 0.0f);
      std::fill(P.bmin + r * nsb * 8, P.bmin + (r + 1) * nsb * 8, 0.0f);
      continue;
    }
    switch (t) {
      case QType::Q4_K: decode_q45k<false>(src, nsb, ix, P, r); break;
      case QType::Q5_K: decode_q45k<true>(src, nsb, ix, P, r); break;
      case QType::Q6_K: decode_q6k(src, nsb, ix, P, r); break;
      default: decode_iq4xs(src, nsb, ix, P, r); break;
    }
  }
}

// Prefetch rows [r0, r1) of the blocks (contiguous) into L2.
inline void prefetch_rows(const uint8_t* w, size_t row_bytes, int r0, int r1) {
  const uint8_t* p = w + size_t(r0) * row_bytes;
  const size_t n = size_t(std::max(0, r1 - r0)) * row_bytes;
  for (size_t i = 0; i < n; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T1);
}

// kNO octets (A tiles) x kNJ 16-token groups (B tiles) of one panel over every super-block: acc [16 rows][32 tokens]
// f32 (row 8 o + r, token 16 j + lane). tok: the first group's packing; cbuf: 2 x 4 C tiles of scratch (64-byte
// aligned). Software-pipelined: super-block sb's C tiles go to cbuf[sb % 2], and the f32 step of sb - 1 comes after
// sb's tile instructions in program order, so the vector unit works on it while the tile unit runs sb.
template <class Tiles, int kNO, int kNJ, bool kMins>
void run_block(const Panel& P, int64_t nsb, const uint8_t* tok, const TokenLayout& L, int32_t* cbuf, float* acc) {
  const size_t gb = L.group();
  for (int i = 0; i < 16 * 32; i += 16) _mm512_store_ps(acc + i, _mm512_setzero_ps());
  // acc += float(C[r] + 128 C[r + 8]) * (d * dx) for super-block sb, its C tiles in c4.
  auto combine = [&](int64_t sb, const int32_t* c4) {
    for (int o = 0; o < kNO; ++o)
      for (int j = 0; j < kNJ; ++j) {
        const int32_t* c = c4 + (2 * o + j) * 256;
        const __m512 dx = _mm512_load_ps(reinterpret_cast<const float*>(tok + j * gb + L.n_xt) + sb * 16);
        for (int r = 0; r < 8; ++r) {
          const __m512i s = _mm512_add_epi32(_mm512_load_si512(c + 16 * r),
                                             _mm512_slli_epi32(_mm512_load_si512(c + 16 * (r + 8)), 7));
          const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(P.d[(8 * o + r) * nsb + sb]), dx);
          float* a = acc + (8 * o + r) * 32 + 16 * j;
          _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, _mm512_load_ps(a)));
        }
      }
  };
  for (int64_t sb = 0; sb < nsb; ++sb) {
    int32_t* c4 = cbuf + (sb % 2) * 1024;
    Tiles::template zero<0>();
    if (kNJ > 1) Tiles::template zero<1>();
    if (kNO > 1) Tiles::template zero<2>();
    if (kNO > 1 && kNJ > 1) Tiles::template zero<3>();
    for (int ks = 0; ks < 4; ++ks) {
      const size_t koff = size_t(sb * 4 + ks) * kTileBytes;
      Tiles::template load<4>(P.lo(0, sb, ks), 64);
      Tiles::template load<6>(tok + koff, 64);
      if (kNO > 1) Tiles::template load<5>(P.lo(8, sb, ks), 64);
      if (kNJ > 1) Tiles::template load<7>(tok + gb + koff, 64);
      Tiles::template dpbssd<0, 4, 6>();
      if (kNJ > 1) Tiles::template dpbssd<1, 4, 7>();
      if (kNO > 1) Tiles::template dpbssd<2, 5, 6>();
      if (kNO > 1 && kNJ > 1) Tiles::template dpbssd<3, 5, 7>();
    }
    Tiles::template store<0>(c4, 64);
    if (kNJ > 1) Tiles::template store<1>(c4 + 256, 64);
    if (kNO > 1) Tiles::template store<2>(c4 + 512, 64);
    if (kNO > 1 && kNJ > 1) Tiles::template store<3>(c4 + 768, 64);
    if (sb > 0) combine(sb - 1, cbuf + ((sb - 1) % 2) * 1024);
  }
  combine(nsb - 1, cbuf + ((nsb - 1) % 2) * 1024);
  if (!kMins) return;
  // Mins: acc -= sum_g (dmin m_g) * (dx sum_g q), 8 rows at a time in registers (8 independent FMA chains).
  const int64_t ng = nsb * 8;
  for (int o = 0; o < kNO; ++o)
    for (int j = 0; j < kNJ; ++j) {
      const float* sbv = reinterpret_cast<const float*>(tok + j * gb + L.n_xt + L.n_dx);
      const float* bm = P.bmin + 8 * o * ng;
      __m512 v[8];
      for (int r = 0; r < 8; ++r) v[r] = _mm512_load_ps(acc + (8 * o + r) * 32 + 16 * j);
      for (int64_t g = 0; g < ng; ++g) {
        const __m512 x = _mm512_load_ps(sbv + g * 16);
        for (int r = 0; r < 8; ++r) v[r] = _mm512_fnmadd_ps(_mm512_set1_ps(bm[r * ng + g]), x, v[r]);
      }
      for (int r = 0; r < 8; ++r) _mm512_store_ps(acc + (8 * o + r) * 32 + 16 * j, v[r]);
    }
}

template <class Tiles, bool kMins>
void run_any(int no, int nj, const Panel& P, int64_t nsb, const uint8_t* tok, const TokenLayout& L, int32_t* cbuf,
             float* acc) {
  if (no == 2 && nj == 2) return run_block<Tiles, 2, 2, kMins>(P, nsb, tok, L, cbuf, acc);
  if (no == 2) return run_block<Tiles, 2, 1, kMins>(P, nsb, tok, L, cbuf, acc);
  if (nj == 2) return run_block<Tiles, 1, 2, kMins>(P, nsb, tok, L, cbuf, acc);
  run_block<Tiles, 1, 1, kMins>(P, nsb, tok, L, cbuf, acc);
}

template <class Tiles>
void gemm_fold(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tok, int nt,
               float* out) {
  const int64_t nsb = K / 256;  // these types' rows are whole super-blocks
  const TokenLayout L(K, packing_group(t));
  const bool mins = t == QType::Q4_K || t == QType::Q5_K;
  const ScaleIdx ix(t == QType::Q6_K);
  // Scratch: panel codes, d, bmin, 4 C tiles, the accumulators.
  const size_t n_codes = size_t(2 * nsb * 4) * kTileBytes, n_d = align64(size_t(kPanelRows * nsb) * 4),
               n_b = align64(size_t(kPanelRows * nsb * 8) * 4), n_c = 8 * kTileBytes, n_acc = 16 * 32 * 4;
  uint8_t* s = gemm_scratch(n_codes + n_d + n_b + n_c + n_acc);
  const Panel P{reinterpret_cast<int8_t*>(s), reinterpret_cast<float*>(s + n_codes),
                reinterpret_cast<float*>(s + n_codes + n_d), nsb};
  int32_t* cbuf = reinterpret_cast<int32_t*>(s + n_codes + n_d + n_b);
  float* acc = reinterpret_cast<float*>(s + n_codes + n_d + n_b + n_c);
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) cfg.tile(i, 16, 64);
  Tiles::config(cfg);
  const int ngroups = (nt + 15) / 16;
  prefetch_rows(w, row_bytes, 0, std::min(R, kPanelRows));
  for (int r0 = 0; r0 < R; r0 += kPanelRows) {
    const int rn = std::min(kPanelRows, R - r0), no = rn > 8 ? 2 : 1;
    decode_panel(t, w + size_t(r0) * row_bytes, row_bytes, rn, no, nsb, ix, P);
    prefetch_rows(w, row_bytes, r0 + kPanelRows, std::min(R, r0 + 2 * kPanelRows));
    for (int g0 = 0; g0 < ngroups; g0 += 2) {
      const int nj = std::min(2, ngroups - g0);
      if (mins)
        run_any<Tiles, true>(no, nj, P, nsb, tok + size_t(g0) * L.group(), L, cbuf, acc);
      else
        run_any<Tiles, false>(no, nj, P, nsb, tok + size_t(g0) * L.group(), L, cbuf, acc);
      const int t0 = 16 * g0, tn = std::min(32, nt - t0);
      const __mmask16 m0 = __mmask16(tn >= 16 ? 0xFFFF : (1u << tn) - 1);
      const __mmask16 m1 = __mmask16(tn >= 32 ? 0xFFFF : tn > 16 ? (1u << (tn - 16)) - 1 : 0);
      for (int r = 0; r < rn; ++r) {
        float* o = out + size_t(r0 + r) * nt + t0;
        _mm512_mask_storeu_ps(o, m0, _mm512_load_ps(acc + r * 32));
        if (m1) _mm512_mask_storeu_ps(o + 16, m1, _mm512_load_ps(acc + r * 32 + 16));
      }
    }
  }
  Tiles::release();
}

// ---- Q8_0 and Q4_0: an f16 scale d per 32 values, nothing to fold into integers, so each 32-value block is one
// TDPBSSD of K = 32 (A: 16 rows x 32 int8 codes, q or nibble - 8; B: the packing's 8 xt rows of the block) and its C
// tile goes through memory into f32 partial sums in registers, part += float(C) * d, and per 256 values acc += part *
// dx: the VNNI GEMM's arithmetic (quant_gemm_avx512.cpp micro, with the integer offset folded into signed codes).
// Pipelined like run_block, deeper (kLag).

// Rows [0, rn) of a 16-row panel: codes [nb][16][32] int8 (zero past rn), d [nb][16] f32 (zero past rn).
void decode_blocks(QType t, const uint8_t* w, size_t row_bytes, int rn, int64_t nb, int8_t* codes, float* d) {
  const __m128i lo4 = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  for (int r = 0; r < 16; ++r) {
    const uint8_t* src = w + size_t(r) * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      int8_t* dst = codes + (b * 16 + r) * 32;
      if (r >= rn) {
        std::memset(dst, 0, 32);
        d[b * 16 + r] = 0.0f;
      } else if (t == QType::Q8_0) {
        const uint8_t* blk = src + 34 * b;
        d[b * 16 + r] = f16_at(blk);
        _mm256_store_si256(reinterpret_cast<__m256i*>(dst),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)));
      } else {  // Q4_0: low nibbles are values 0..15, high nibbles 16..31; value = (nibble - 8) * d
        const uint8_t* blk = src + 18 * b;
        d[b * 16 + r] = f16_at(blk);
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
        _mm_store_si128(reinterpret_cast<__m128i*>(dst), _mm_sub_epi8(_mm_and_si128(v, lo4), eight));
        _mm_store_si128(reinterpret_cast<__m128i*>(dst + 16),
                        _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), lo4), eight));
      }
    }
  }
}

// One 16-row panel x one 16-token group: acc [16 rows][16 tokens] f32. The f32 step of block b comes kLag - 1 blocks
// after its tile instructions (C tiles and cbuf slots in rotation), so the tile stores have landed when it reads them.
constexpr int kLag = 4;
template <class Tiles>
void run_blocks(const int8_t* codes, const float* d, int64_t nb, const uint8_t* tok, const TokenLayout& L,
                int32_t* cbuf, float* acc) {
  const float* dx = reinterpret_cast<const float*>(tok + L.n_xt);
  __m512 part[16];
  for (int r = 0; r < 16; ++r) {
    part[r] = _mm512_setzero_ps();
    _mm512_store_ps(acc + 16 * r, _mm512_setzero_ps());
  }
  // part += float(C) * d for block b (its C tile in c); at the end of a 256-value run, acc += part * dx.
  auto combine = [&](int64_t b, const int32_t* c) __attribute__((always_inline)) {  // inlined: part stays in zmm
    for (int r = 0; r < 16; ++r)
      part[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * r)), _mm512_set1_ps(d[b * 16 + r]),
                                part[r]);
    if (b % 8 == 7 || b == nb - 1) {
      const __m512 dxs = _mm512_load_ps(dx + (b / 8) * 16);
      for (int r = 0; r < 16; ++r) {
        _mm512_store_ps(acc + 16 * r, _mm512_fmadd_ps(part[r], dxs, _mm512_load_ps(acc + 16 * r)));
        part[r] = _mm512_setzero_ps();
      }
    }
  };
  for (int64_t b = 0; b < nb; ++b) {
    int32_t* c = cbuf + (b % kLag) * 256;
    // C tiles in rotation (tmm0 .. tmm3), A and B alternating (tmm4 / tmm5, tmm6 / tmm7): a block's loads need not
    // wait for the previous block's TDPBSSD to have read its operands.
    const int8_t* a = codes + b * 512;
    const uint8_t* x = tok + b * 512;
    switch (b % kLag) {
      case 0:
        Tiles::template load<4>(a, 32), Tiles::template load<6>(x, 64), Tiles::template zero<0>();
        Tiles::template dpbssd<0, 4, 6>(), Tiles::template store<0>(c, 64);
        break;
      case 1:
        Tiles::template load<5>(a, 32), Tiles::template load<7>(x, 64), Tiles::template zero<1>();
        Tiles::template dpbssd<1, 5, 7>(), Tiles::template store<1>(c, 64);
        break;
      case 2:
        Tiles::template load<4>(a, 32), Tiles::template load<6>(x, 64), Tiles::template zero<2>();
        Tiles::template dpbssd<2, 4, 6>(), Tiles::template store<2>(c, 64);
        break;
      default:
        Tiles::template load<5>(a, 32), Tiles::template load<7>(x, 64), Tiles::template zero<3>();
        Tiles::template dpbssd<3, 5, 7>(), Tiles::template store<3>(c, 64);
        break;
    }
    if (b >= kLag - 1) combine(b - (kLag - 1), cbuf + ((b - (kLag - 1)) % kLag) * 256);
  }
  for (int64_t b = std::max<int64_t>(0, nb - (kLag - 1)); b < nb; ++b) combine(b, cbuf + (b % kLag) * 256);
}

template <class Tiles>
void gemm_blocks(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tok, int nt,
                 float* out) {
  const int64_t nb = K / 32, Kq = padded_k256(K);
  const TokenLayout L(Kq, packing_group(t));
  const size_t n_codes = size_t(nb) * 512, n_d = align64(size_t(nb) * 16 * 4), n_c = kLag * kTileBytes;
  uint8_t* s = gemm_scratch(n_codes + n_d + n_c + 16 * 16 * 4);
  int8_t* codes = reinterpret_cast<int8_t*>(s);
  float* d = reinterpret_cast<float*>(s + n_codes);
  int32_t* cbuf = reinterpret_cast<int32_t*>(s + n_codes + n_d);
  float* acc = reinterpret_cast<float*>(s + n_codes + n_d + n_c);
  TileConfig cfg;
  for (int i = 0; i < kLag; ++i) cfg.tile(i, 16, 64);  // C
  cfg.tile(4, 16, 32).tile(5, 16, 32).tile(6, 8, 64).tile(7, 8, 64);  // A (K = 32), B (8 rows of 4 values)
  Tiles::config(cfg);
  const int ngroups = (nt + 15) / 16;
  prefetch_rows(w, row_bytes, 0, std::min(R, 16));
  for (int r0 = 0; r0 < R; r0 += 16) {
    const int rn = std::min(16, R - r0);
    decode_blocks(t, w + size_t(r0) * row_bytes, row_bytes, rn, nb, codes, d);
    prefetch_rows(w, row_bytes, r0 + 16, std::min(R, r0 + 32));
    for (int g = 0; g < ngroups; ++g) {
      run_blocks<Tiles>(codes, d, nb, tok + size_t(g) * L.group(), L, cbuf, acc);
      const int t0 = 16 * g, tn = std::min(16, nt - t0);
      const __mmask16 m = __mmask16(tn >= 16 ? 0xFFFF : (1u << tn) - 1);
      for (int r = 0; r < rn; ++r) _mm512_mask_storeu_ps(out + size_t(r0 + r) * nt + t0, m, _mm512_load_ps(acc + 16 * r));
    }
  }
  Tiles::release();
}

}  // namespace

void gemm_amx_packed(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tokens, int nt,
                     float* out, bool emulate) {
  const bool blocks = t == QType::Q8_0 || t == QType::Q4_0;
  if (emulate)
    blocks ? gemm_blocks<EmuTiles>(t, w, row_bytes, R, K, tokens, nt, out)
           : gemm_fold<EmuTiles>(t, w, row_bytes, R, K, tokens, nt, out);
  else
    blocks ? gemm_blocks<HwTiles>(t, w, row_bytes, R, K, tokens, nt, out)
           : gemm_fold<HwTiles>(t, w, row_bytes, R, K, tokens, nt, out);
}

}  // namespace quant
}  // namespace tessera

TESSERA_ISA_END
