// Causal grouped-query attention, AVX-512 BF16: both products by vdpbf16ps (32 bf16 products per instruction, twice
// the f32 FMA's rate), for CPUs with avx512_bf16. The driver (tasks, key splits, online softmax, merge) is
// attention_flash.inc's; this file gives its block products.
// - Scores: the query rows (scaled) are rounded once to bf16 and paired along the head dim; key tile rows d and d+1
//   ([hd][32] positions) are interleaved by vpunpck{l,h}wd into (K[d][j], K[d+1][j]) pairs, so keys stay as stored.
//   Lanes come out in unpack order (keys 0-3, 8-11, ... in one vector, 4-7, 12-15, ... in the other) and are put in
//   order once per block.
// - Values: the probabilities are rounded to bf16 and paired along the keys; value rows j and j+1 are interleaved the
//   same way into (V[j][d], V[j+1][d]) pairs. The accumulator keeps dims in unpack order until store_row.
// Products are exact and sums accumulate in f32. Rounding q and p to bf16 (relative error <= 2^-8 each, as storing K
// and V in bf16 already does to every key and value) is what llama.cpp does with its f16 cache (q to f16, f16 value
// accumulation). The softmax denominator sums the rounded probabilities, so every output stays a convex combination of
// the values with each weight off by at most ~2^-7 of itself (tests/engine/test_attention.py holds the kernel to that).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <cstring>
#include <vector>

#include "amx_tile.h"
#include "amx_tile_emu.h"
#include "isa_target.h"
#include "attention_tasks.h"
#include "tessera/attention.h"
#include "thread_scratch.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_BF16)

namespace tessera {
namespace {

#include "attention_flash.inc"

// Positions of the unpack order: lane i of unpacklo covers element 8*(i/4) + i%4, of unpackhi 8*(i/4) + 4 + i%4.
// (lo, hi) back to order: first = elements 0..15, second = 16..31.
inline void unpack_order(__m512 lo, __m512 hi, __m512& first, __m512& second) {
  const __m512i a = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i b = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  first = _mm512_permutex2var_ps(lo, a, hi);
  second = _mm512_permutex2var_ps(lo, b, hi);
}

inline __m512bh bcast_pair(const uint16_t* pair) {  // the two bf16 at pair[0..2) in every 32-bit lane
  uint32_t bits;
  std::memcpy(&bits, pair, 4);
  return (__m512bh)_mm512_set1_epi32(int(bits));
}

// The unpack order: vpunpck{l,h}wd of two rows interleave, per 128-bit lane, elements 0-3 (low) or 4-7 (high) of
// each 8. Lane i of the low result holds element kUnpackLow[i], of the high one kUnpackLow[i] + 4.
alignas(64) constexpr int32_t kUnpackLow[16] = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};

// The key pairs of tile rows d, d + 1 (unpack order; keys >= nk as 0).
inline void key_pairs(const uint16_t* tile, int64_t d, __mmask32 keys, __m512bh& pl, __m512bh& ph) {
  const __m512i k0 = _mm512_maskz_loadu_epi16(keys, tile + d * kKeys);
  const __m512i k1 = _mm512_maskz_loadu_epi16(keys, tile + (d + 1) * kKeys);
  pl = (__m512bh)_mm512_unpacklo_epi16(k0, k1);
  ph = (__m512bh)_mm512_unpackhi_epi16(k0, k1);
}

// A query block of several row groups unpacks each key tile once into kp ([hd/2][64]: row pair d/2's two vectors) and
// every group reads the pairs from there (PACKED), instead of each group unpacking the tile again; one group (decode)
// unpacks as it goes.
void pack_keys(const uint16_t* tile, int64_t hd, int nk, uint16_t* kp) {
  const __mmask32 keys = nk >= kKeys ? __mmask32(0xffffffffu) : __mmask32((1u << nk) - 1u);
  for (int64_t d = 0; d < hd; d += 2) {
    __m512bh pl, ph;
    key_pairs(tile, d, keys, pl, ph);
    _mm512_storeu_si512(kp + d * kKeys, (__m512i)pl);
    _mm512_storeu_si512(kp + d * kKeys + 32, (__m512i)ph);
  }
}

// s[r][0..32) = Q[r] . K[key] for RB bf16 query rows and the nk (<= 32) keys of one tile ([hd][32] bf16), in unpack
// order (s[r][i] is key kUnpackLow[i], s[r][16 + i] key kUnpackLow[i] + 4); keys >= nk are read as 0.
// pf: a K tile to bring into the cache meanwhile (two lines a step), or null.
template <int RB, bool PACKED>
void block_scores(const uint16_t* Q, int64_t hd, const uint16_t* tile, int nk, float* s, const char* pf) {
  __m512 lo[RB], hi[RB];
  for (int r = 0; r < RB; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  const __mmask32 keys = nk >= kKeys ? __mmask32(0xffffffffu) : __mmask32((1u << nk) - 1u);
  for (int64_t d = 0; d < hd; d += 2) {
    __m512bh pl, ph;
    if constexpr (PACKED) {  // tile is pack_keys' kp
      pl = (__m512bh)_mm512_loadu_si512(tile + d * kKeys);
      ph = (__m512bh)_mm512_loadu_si512(tile + d * kKeys + 32);
    } else {
      key_pairs(tile, d, keys, pl, ph);
    }
    if (pf) {
      _mm_prefetch(pf + d * 64, _MM_HINT_T1);
      _mm_prefetch(pf + d * 64 + 64, _MM_HINT_T1);
    }
    for (int r = 0; r < RB; ++r) {
      const __m512bh q = bcast_pair(Q + r * hd + d);
      lo[r] = _mm512_dpbf16_ps(lo[r], pl, q);
      hi[r] = _mm512_dpbf16_ps(hi[r], ph, q);
    }
  }
  for (int r = 0; r < RB; ++r) {  // stored as they are: permuting here made GCC keep the accumulators in memory
    _mm512_storeu_ps(s + r * kKeys, lo[r]);
    _mm512_storeu_ps(s + r * kKeys + 16, hi[r]);
  }
}

// The key pair of probability pair q (0..15) as round_probs stores them: pairs of consecutive keys in unpack order.
constexpr int pair_key(int q) { return 8 * ((q % 8) / 2) + 2 * (q % 2) + 4 * (q / 8); }

// acc[r][one chunk of 32 dims] = alpha[r] * acc + sum_j p[r][j] * V[j] over the nk keys of the block; p [RB][16] bf16
// pairs (zero beyond the row's visible keys) as round_probs stores them, acc in unpack order.
// pf: 32 lines of V rows to bring into the cache meanwhile (two a step), or null.
// The value pairs of rows j, j + 1 in one chunk of 32 dims (unpack order; row j + 1 >= nk as 0).
inline void value_pairs(const uint16_t* v, int64_t hd, int j, int nk, __m512bh& pl, __m512bh& ph) {
  const __m512i v0 = _mm512_loadu_si512(v + j * hd);
  const __m512i v1 = j + 1 < nk ? _mm512_loadu_si512(v + (j + 1) * hd) : _mm512_setzero_si512();
  pl = (__m512bh)_mm512_unpacklo_epi16(v0, v1);
  ph = (__m512bh)_mm512_unpackhi_epi16(v0, v1);
}

template <int RB, bool PACKED>
void block_values(const uint16_t* p, const uint16_t* v, int64_t hd, int nk, const float* alpha, float* acc,
                  const char* pf) {
  __m512 lo[RB], hi[RB];
  for (int r = 0; r < RB; ++r) {
    const __m512 al = _mm512_set1_ps(alpha[r]);
    lo[r] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * hd), al);
    hi[r] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * hd + 16), al);
  }
  for (int q = 0; q < kKeys / 2; ++q) {
    const int j = pair_key(q);
    if (j >= nk) continue;  // a key past nk may hold anything (even NaN): never read
    __m512bh pl, ph;
    if constexpr (PACKED) {  // v is pack_values' vp + 2 * (the chunk's first dim)
      pl = (__m512bh)_mm512_loadu_si512(v + q * 2 * hd);
      ph = (__m512bh)_mm512_loadu_si512(v + q * 2 * hd + 32);
    } else {
      value_pairs(v, hd, j, nk, pl, ph);
    }
    if (pf) {
      _mm_prefetch(pf + q * 128, _MM_HINT_T1);
      _mm_prefetch(pf + q * 128 + 64, _MM_HINT_T1);
    }
    for (int r = 0; r < RB; ++r) {
      const __m512bh w = bcast_pair(p + r * kKeys + 2 * q);
      lo[r] = _mm512_dpbf16_ps(lo[r], pl, w);
      hi[r] = _mm512_dpbf16_ps(hi[r], ph, w);
    }
  }
  for (int r = 0; r < RB; ++r) {
    _mm512_storeu_ps(acc + r * hd, lo[r]);
    _mm512_storeu_ps(acc + r * hd + 16, hi[r]);
  }
}

// As pack_keys, for the values: vp [16 pairs][hd/32 chunks][64], pair q (keys pair_key(q), +1) of chunk c at
// vp + q * 2 * hd + 2 * c; pairs past nk are left unwritten (never read).
void pack_values(const uint16_t* v, int64_t hd, int nk, uint16_t* vp) {
  for (int q = 0; q < kKeys / 2; ++q) {
    const int j = pair_key(q);
    if (j >= nk) continue;
    for (int64_t c = 0; c < hd; c += 32) {
      __m512bh pl, ph;
      value_pairs(v + c, hd, j, nk, pl, ph);
      _mm512_storeu_si512(vp + q * 2 * hd + 2 * c, (__m512i)pl);
      _mm512_storeu_si512(vp + q * 2 * hd + 2 * c + 32, (__m512i)ph);
    }
  }
}

// The bf16 block products for attention_flash.inc.
struct Bf16Kernel {
  static __m512i key_lanes(int half) {  // scores in unpack order
    return _mm512_add_epi32(_mm512_load_si512(kUnpackLow), _mm512_set1_epi32(4 * half));
  }
  static void load_queries(const AttentionArgs& a, int64_t h, int64_t t0, int64_t t1, int64_t g, Scratch& w) {
    const int64_t hd = a.hd;
    w.qb.resize(size_t((t1 - t0) * g * hd));
    const __m512 scale = _mm512_set1_ps(a.scale);
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t j = 0; j < g; ++j) {
        const float* src = query_row(a, h * g + j, t);
        uint16_t* dst = w.qb.data() + ((t - t0) * g + j) * hd;
        for (int64_t i = 0; i < hd; i += 32) {  // round to nearest even, once
          const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_loadu_ps(src + i + 16), scale),
                                                 _mm512_mul_ps(_mm512_loadu_ps(src + i), scale));
          _mm512_storeu_si512(dst + i, (__m512i)b);
        }
      }
  }
  static void scores(Scratch& w, int64_t rows, int64_t hd, const uint16_t* tile, int nk) {
    const uint16_t* Q = w.qb.data();
    float* s = w.s.data();
    const char* pf = w.prefetch_k;  // by the first group of rows only
    if (rows <= 8) {
      for_row_groups<8>(rows, [&](auto R, int64_t r) {
        block_scores<R, false>(Q + r * hd, hd, tile, nk, s + r * kKeys, pf);
      });
      return;
    }
    w.kp.resize(size_t(hd * kKeys));
    pack_keys(tile, hd, nk, w.kp.data());
    for_row_groups<8>(rows, [&](auto R, int64_t r) {
      block_scores<R, true>(Q + r * hd, hd, w.kp.data(), nk, s + r * kKeys, r == 0 ? pf : nullptr);
    });
  }
  // p rounded to bf16 (kept in w.pb for the value products: 16 pairs of consecutive keys, pair_key's order); p0, p1
  // become the rounded values, so l sums exactly the weights the values get.
  static void round_probs(__m512& p0, __m512& p1, Scratch& w, int64_t r) {
    const __m512i b = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
    _mm512_storeu_si512(w.pb.data() + r * kKeys, b);
    p0 = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));                                    // elements 0, 2, 4, ...
    p1 = _mm512_castsi512_ps(_mm512_and_si512(b, _mm512_set1_epi32(int(0xffff0000u))));  // elements 1, 3, 5, ...
  }
  static void values(Scratch& w, int64_t rows, int64_t hd, const uint16_t* v, int nk) {
    const uint16_t* p = w.pb.data();
    const float* al = w.alpha.data();
    float* acc = w.acc.data();
    const bool packed = rows > 8;  // several row groups: the block's value pairs made once (pack_values)
    if (packed) {
      w.vp.resize(size_t(hd * kKeys));
      pack_values(v, hd, nk, w.vp.data());
    }
    for (int64_t c = 0; c < hd; c += 32) {
      const char* pf = w.prefetch_v ? w.prefetch_v + c * 64 : nullptr;  // lines [c, c + 32) of the 2 * hd, once
      for_row_groups<8>(rows, [&](auto R, int64_t r) {
        if (packed)
          block_values<R, true>(p + r * kKeys, w.vp.data() + 2 * c, hd, nk, al + r, acc + r * hd + c,
                                r == 0 ? pf : nullptr);
        else
          block_values<R, false>(p + r * kKeys, v + c, hd, nk, al + r, acc + r * hd + c, r == 0 ? pf : nullptr);
      });
    }
  }
  static void store_row(const float* acc, float inv, float* out, int64_t hd) {  // acc: unpack order per 32 dims
    const __m512 f = _mm512_set1_ps(inv);
    for (int64_t c = 0; c < hd; c += 32) {
      __m512 first, second;
      unpack_order(_mm512_loadu_ps(acc + c), _mm512_loadu_ps(acc + c + 16), first, second);
      _mm512_storeu_ps(out + c, _mm512_mul_ps(first, f));
      _mm512_storeu_ps(out + c + 16, _mm512_mul_ps(second, f));
    }
  }
};

#include "amx_tiles_local.inc"  // HwTiles (inline asm) and EmuTiles, file-local

// The AMX kernel: both products on TDPBF16PS tiles (16 rows x 16 pairs x 16 columns, f32 accumulate) for CPUs with
// AMX-BF16, with its own driver over spans of up to four 32-key tiles (128 positions). Per span, for all the task's
// rows: the scores [32 rows, 32 keys] of each pair of 16-row blocks and key tile (2x2 C tiles), then one online-softmax
// step per row for the whole span, then the value products with each pair of row blocks' accumulators loaded into C
// tiles once per span (one 32-dim chunk at a time). Against one step per 32-key block, the per-row softmax work (the
// max's reduction, alpha, the accumulator's rescale) and the accumulators' round trips through memory happen a quarter
// as often, the tiles are configured once per task, each phase's operand pairs (the span's keys, then its values: 32
// KB each at hd = 128) stay in L1, and no tile load follows right behind the softmax's vector stores.
// Operand layouts are Bf16Kernel's (already what the tiles read):
// - Scores: A = 16 query rows x 32 dims (qb, row stride hd); B = pack_keys' pairs (row p of a tile's kp: dims 2p,
//   2p + 1 of 16 keys in unpack order, lo then hi keys, rows 128 bytes apart); C = s[r][32 j .. 32 j + 32) for key
//   tile j in Bf16Kernel's unpack order.
// - Values: A = 16 rows of pb for key tile j (16 pairs of keys, pair_key's order); B = pack_values' pairs (rows 2 hd
//   elements apart); C = acc's 16 x 16 floats of a chunk half (acc in Bf16Kernel's unpack order: store_row is shared).
// Rounding and sums as Bf16Kernel's (q and p rounded to bf16, products exact, f32 sums; the denominator sums the
// rounded probabilities); the order of the additions differs (TDPBF16PS sums a tile's 16 pairs, with DAZ/FTZ), within the
// tolerance tests/engine/test_attention.py holds every bf16 kernel to. Tiles: 0-1 A, 2-3 B, 4-7 C; rows padded to 32
// (pad rows: zero queries and probabilities, results never read).
// Four tiles: eight (256 keys) put the keys' and the values' pairs (64 KB each) out of L1: 7-15 % slower (session 17).
constexpr int64_t kSpanTiles = 4;                   // key tiles per span
constexpr int64_t kSpanKeys = kSpanTiles * kKeys;   // positions per span: the row stride of s and pb

template <class Tiles>
struct AmxAttention {
  static void configure() { Tiles::config(amx::TileConfig::full()); }
  // s[r0 .. r0 + 32][32 j .. 32 j + 32): two row blocks (Q rows r0 and r0 + 16: tiles 0 and 1) against one key tile's
  // lo and hi keys (tiles 2, 3), one operand load per product.
  static void scores(const uint16_t* Q, int64_t hd, const uint16_t* kp, int64_t j, float* s) {
    const uint16_t* k = kp + j * hd * kKeys;
    Tiles::template zero<4>();
    Tiles::template zero<5>();
    Tiles::template zero<6>();
    Tiles::template zero<7>();
    for (int64_t c = 0; c < hd; c += 32) {
      Tiles::template load<0>(Q + c, hd * 2);
      Tiles::template load<2>(k + c * kKeys, 128);
      Tiles::template dpbf16ps<4, 0, 2>();
      Tiles::template load<1>(Q + 16 * hd + c, hd * 2);
      Tiles::template dpbf16ps<6, 1, 2>();
      Tiles::template load<3>(k + c * kKeys + 32, 128);
      Tiles::template dpbf16ps<5, 0, 3>();
      Tiles::template dpbf16ps<7, 1, 3>();
    }
    float* s0 = s + j * kKeys;
    Tiles::template store<4>(s0, kSpanKeys * 4);
    Tiles::template store<5>(s0 + 16, kSpanKeys * 4);
    Tiles::template store<6>(s0 + 16 * kSpanKeys, kSpanKeys * 4);
    Tiles::template store<7>(s0 + 16 * kSpanKeys + 16, kSpanKeys * 4);
  }
  // acc[r0 .. r0 + 32][chunk c] += p x V over the span's ntile key tiles: two row blocks (pb rows r0 and r0 + 16:
  // tiles 0 and 1) against the chunk's lo and hi halves (tiles 2, 3).
  static void values(const uint16_t* pb, const uint16_t* vp, int64_t hd, int64_t ntile, int64_t c, float* acc) {
    float* a0 = acc + c;
    float* a1 = a0 + 16 * hd;
    Tiles::template load<4>(a0, hd * 4);
    Tiles::template load<5>(a0 + 16, hd * 4);
    Tiles::template load<6>(a1, hd * 4);
    Tiles::template load<7>(a1 + 16, hd * 4);
    for (int64_t j = 0; j < ntile; ++j) {
      const uint16_t* v = vp + j * hd * kKeys + 2 * c;
      Tiles::template load<0>(pb + j * kKeys, kSpanKeys * 2);
      Tiles::template load<2>(v, hd * 4);
      Tiles::template dpbf16ps<4, 0, 2>();
      Tiles::template load<1>(pb + 16 * kSpanKeys + j * kKeys, kSpanKeys * 2);
      Tiles::template dpbf16ps<6, 1, 2>();
      Tiles::template load<3>(v + 32, hd * 4);
      Tiles::template dpbf16ps<5, 0, 3>();
      Tiles::template dpbf16ps<7, 1, 3>();
    }
    Tiles::template store<4>(a0, hd * 4);
    Tiles::template store<5>(a0 + 16, hd * 4);
    Tiles::template store<6>(a1, hd * 4);
    Tiles::template store<7>(a1 + 16, hd * 4);
  }
};

// One row's online-softmax step over a span of ntile key tiles (scores s in unpack order per tile, the row sees its
// first `seen` positions): p = exp(s - m_new) rounded to bf16 into pb (Bf16Kernel::round_probs' layout per tile; zero
// where unseen), lv (16 lane sums) and m updated, and the factor that rescales the row's accumulator returned.
inline float span_softmax(const float* s, int64_t ntile, int64_t seen, float& m, float* lv, uint16_t* pb) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  if (seen <= 0) {  // the row sees none of these keys: p = 0, accumulator unchanged
    for (int64_t j = 0; j < ntile; ++j) _mm512_storeu_si512(pb + j * kKeys, _mm512_setzero_si512());
    return 1.0f;
  }
  __m512 x[2 * kSpanTiles];
  __m512 mx = ninf;
  if (seen == ntile * kKeys) {  // every key of the span seen (all but the causal diagonal's spans): no mask
    for (int64_t i = 0; i < 2 * ntile; ++i) mx = _mm512_max_ps(mx, x[i] = _mm512_loadu_ps(s + 16 * i));
  } else {
    for (int64_t j = 0; j < ntile; ++j)
      for (int h = 0; h < 2; ++h) {
        const __m512i key = _mm512_add_epi32(Bf16Kernel::key_lanes(h), _mm512_set1_epi32(int(j * kKeys)));
        const __mmask16 in = _mm512_cmplt_epi32_mask(key, _mm512_set1_epi32(int(seen)));
        x[2 * j + h] = _mm512_mask_blend_ps(in, ninf, _mm512_loadu_ps(s + j * kKeys + 16 * h));
        mx = _mm512_max_ps(mx, x[2 * j + h]);
      }
  }
  const float m_new = std::max(m, _mm512_reduce_max_ps(mx));
  const __m512 mn = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < ntile; ++j) {
    const __m512 p0 = exp_nonpositive(_mm512_sub_ps(x[2 * j], mn));
    const __m512 p1 = exp_nonpositive(_mm512_sub_ps(x[2 * j + 1], mn));
    const __m512i b = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);  // as Bf16Kernel::round_probs
    _mm512_storeu_si512(pb + j * kKeys, b);
    const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));  // the rounded p0, p1 as round_probs leaves them
    const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(b, _mm512_set1_epi32(int(0xffff0000u))));
    sum = _mm512_add_ps(sum, _mm512_add_ps(even, odd));
  }
  // m = -inf before the first span: 0 (the accumulator is 0 anyway); past the first spans the max seldom moves.
  const float alpha = m_new == m ? 1.0f : std::exp(m - m_new);
  _mm512_storeu_ps(lv, _mm512_fmadd_ps(_mm512_loadu_ps(lv), _mm512_set1_ps(alpha), sum));
  m = m_new;
  return alpha;
}

// attention_flash.inc's flash_attention contract (tasks, key splits and their merge), on spans and tiles. Not inlined
// into the exported attention_amx_bf16, whose name says no ISA: its AVX-512 code stays in this ISA-named driver
// (tests/native/test_isa_isolation.py) and so do its thread_local accesses (tests/native/test_kernel_tls.py).
template <class Tiles>
__attribute__((noinline)) void amx_flash_attention(const AttentionArgs& a, ThreadPool& pool) {
  using K = AmxAttention<Tiles>;
  const int64_t g = a.nh / a.nkv, hd = a.hd;
  const AttentionTasks tasks(a.T, a.nh, a.nkv, hd, a.start, pool.size(), kRowsPerTask, kKeys, kMinSplitBlocks,
                             kTasksPerThread);  // attention_tasks.h
  const int64_t splits = tasks.splits, blocks_per_split = tasks.blocks_per_split, slot = tasks.slot;
  thread_local std::vector<float> partials;  // [units, splits, slot], only when the keys are split
  if (splits > 1) partials.resize(size_t(tasks.units * splits * slot));
  float* const parts = partials.data();

  pool.parallel_for(tasks.units * splits, [&](int64_t task, int) {
    thread_local Scratch scratch_of_thread;
    Scratch& w = opaque_ref(scratch_of_thread);  // not the thread_local's name in the loops (thread_scratch.h)
    const AttentionTasks::Task tk = tasks.of_task(task);
    const int64_t split = tk.split, h = tk.h, t0 = tk.t0, t1 = tk.t1, rows = tk.rows;
    const int64_t padded = (rows + 31) / 32 * 32;  // whole pairs of 16-row tiles
    w.acc.assign(size_t(padded * hd), 0.0f);
    w.s.resize(size_t(padded * kSpanKeys));
    w.pb.assign(size_t(padded * kSpanKeys), 0);  // pad rows stay 0
    w.kp.resize(size_t(kSpanTiles * hd * kKeys));
    w.vp.resize(size_t(kSpanTiles * hd * kKeys));
    w.m.assign(size_t(rows), -INFINITY);
    w.lv.assign(size_t(rows * 16), 0.0f);
    Bf16Kernel::load_queries(a, h, t0, t1, g, w);  // row (t - t0) * g + j: token t, query head h * g + j
    w.qb.resize(size_t(padded * hd));
    std::fill(w.qb.begin() + rows * hd, w.qb.end(), uint16_t(0));  // pad rows: finite
    const uint16_t* kt = a.kt + h * ((a.C + kKeys - 1) / kKeys) * kKeys * hd;  // [ceil(C/32), hd, 32]
    const uint16_t* v = a.v + h * a.C * hd;                                    // [C, hd]
    const int64_t kend = std::min(a.start + t1, (split + 1) * blocks_per_split * kKeys);  // causal end of the range
    const int64_t steps = padded / 16;
    K::configure();
    for (int64_t s0 = split * blocks_per_split * kKeys; s0 < kend; s0 += kSpanKeys) {
      const int64_t nsk = std::min(kSpanKeys, kend - s0), ntile = (nsk + kKeys - 1) / kKeys;
      for (int64_t j = 0; j < ntile; ++j) {  // each key tile's pairs, once per span for every row block
        const int nk = int(std::min<int64_t>(kKeys, nsk - j * kKeys));
        uint16_t* vpj = w.vp.data() + j * hd * kKeys;
        if (nk < kKeys) std::fill(vpj, vpj + hd * kKeys, uint16_t(0));  // pairs past nk: 0, never garbage x 0
        pack_keys(kt + (s0 + j * kKeys) * hd, hd, nk, w.kp.data() + j * hd * kKeys);
        pack_values(v + (s0 + j * kKeys) * hd, hd, nk, vpj);
      }
      // The next span's K tiles and V rows (ahead_keys positions, hd * 2 bytes each), prefetched a share per row block
      // (whole lines, per_block of them; no division per block).
      const int64_t ahead = s0 + kSpanKeys, ahead_keys = std::min(kSpanKeys, kend - ahead);
      const int64_t ahead_lines = std::max<int64_t>(0, ahead_keys) * hd * 2 / 64;
      const int64_t per_block = (ahead_lines + steps - 1) / steps;
      auto prefetch_share = [&](const uint16_t* base, int64_t block) {
        const char* p = reinterpret_cast<const char*>(base + ahead * hd);
        for (int64_t l = block * per_block; l < std::min(ahead_lines, (block + 1) * per_block); ++l)
          _mm_prefetch(p + l * 64, _MM_HINT_T1);
      };
      // Phases over all the task's rows, each on one operand set that fits L1 (the keys' pairs for the scores, the
      // values' pairs for the products), and no tile load right behind the vector stores of the softmax.
      for (int64_t r0 = 0; r0 < padded; r0 += 32) {  // pairs of row blocks
        prefetch_share(kt, r0 / 16);
        prefetch_share(kt, r0 / 16 + 1);
        for (int64_t j = 0; j < ntile; ++j)
          K::scores(w.qb.data() + r0 * hd, hd, w.kp.data(), j, w.s.data() + r0 * kSpanKeys);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t seen = std::clamp<int64_t>(a.start + t0 + r / g + 1 - s0, 0, nsk);
        const float alpha = span_softmax(w.s.data() + r * kSpanKeys, ntile, seen, w.m[size_t(r)], w.lv.data() + r * 16,
                                         w.pb.data() + r * kSpanKeys);
        if (alpha != 1.0f) {
          const __m512 f = _mm512_set1_ps(alpha);
          float* acc = w.acc.data() + r * hd;
          for (int64_t i = 0; i < hd; i += 16) _mm512_storeu_ps(acc + i, _mm512_mul_ps(_mm512_loadu_ps(acc + i), f));
        }
      }
      for (int64_t r0 = 0; r0 < padded; r0 += 32) {
        prefetch_share(v, r0 / 16);
        prefetch_share(v, r0 / 16 + 1);
        for (int64_t c = 0; c < hd; c += 32)
          K::values(w.pb.data() + r0 * kSpanKeys, w.vp.data(), hd, ntile, c, w.acc.data() + r0 * hd);
      }
    }
    Tiles::release();
    finish_task<Bf16Kernel>(a, tk, g, splits > 1 ? parts + task * slot : nullptr, w);
  });
  if (splits == 1) return;
  merge_key_ranges16<Bf16Kernel>(tasks, parts, a.nh, hd, a.out, pool);
}

}  // namespace

void attention_isa::attention_avx512_bf16(const AttentionArgs& a, ThreadPool& pool) {
  flash_attention<Bf16Kernel>(a, pool);
}

void attention_isa::attention_amx_bf16(const AttentionArgs& a, ThreadPool& pool, bool emulated) {
  if (emulated) amx_flash_attention<EmuTiles>(a, pool);
  else amx_flash_attention<HwTiles>(a, pool);
}

}  // namespace tessera

TESSERA_ISA_END
