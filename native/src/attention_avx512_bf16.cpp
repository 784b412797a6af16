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
  static constexpr int64_t kRowPad = 1;
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

// Prefetches the part `step` of `steps` of the `bytes` at p (whole lines) into L2, or nothing when p is null: a block
// ahead's K tile or V rows spread over the steps of this block's products.
inline void prefetch_part(const char* p, int64_t bytes, int64_t step, int64_t steps) {
  if (!p) return;
  const int64_t lines = bytes / 64, l0 = lines * step / steps, l1 = lines * (step + 1) / steps;
  for (int64_t l = l0; l < l1; ++l) _mm_prefetch(p + l * 64, _MM_HINT_T1);
}

// Both block products on AMX tiles (TDPBF16PS: 16 rows x 16 pairs x 16 columns, f32 accumulate) for CPUs with AMX-BF16;
// every other step (queries rounded to bf16 once, online softmax, probabilities rounded to bf16, store) is
// Bf16Kernel's, and so are the operands' layouts, which are already what the tiles read:
// - Scores: A = 16 query rows x 32 dims (qb, row stride hd); B = pack_keys' pairs: row p of kp's half (lo / hi keys)
//   is dims (2p, 2p + 1) of 16 keys in unpack order, so B_lo(c) = kp + c * 32, B_hi(c) = + 32, rows 128 bytes apart,
//   and C = s[r][0..16) / [16..32) in the same unpack order as Bf16Kernel's.
// - Values: A = 16 rows of pb (16 pairs of keys, pair_key's order); B = pack_values' pairs (row q: keys pair_key(q),
//   +1 for 16 dims of a chunk in unpack order, rows 2 hd elements apart); C = acc's 16 x 16 floats of a chunk half,
//   loaded, accumulated and stored back (acc keeps Bf16Kernel's unpack order, so store_row is shared).
// Each product is exact (bf16 x bf16 in f32) and the sums f32, as vdpbf16ps gives; the order of the additions differs
// (TDPBF16PS sums a tile's 16 pairs, with DAZ/FTZ), within the tolerance tests/engine/test_attention.py holds it to.
// Tiles: 0 A, 2-3 B, 4-5 C; rows are padded to whole tiles (kRowPad), the pad rows' results never read.
template <class Tiles>
struct AmxKernel : Bf16Kernel {
  static constexpr int64_t kRowPad = 16;
  static void configure() {
    amx::TileConfig c;
    c.tile(0, 16, 64).tile(2, 16, 64).tile(3, 16, 64).tile(4, 16, 64).tile(5, 16, 64);
    Tiles::config(c);
  }
  static void load_queries(const AttentionArgs& a, int64_t h, int64_t t0, int64_t t1, int64_t g, Scratch& w) {
    Bf16Kernel::load_queries(a, h, t0, t1, g, w);
    const size_t rows = size_t((t1 - t0) * g), padded = (rows + 15) / 16 * 16;
    w.qb.resize(padded * size_t(a.hd));
    std::fill(w.qb.begin() + rows * size_t(a.hd), w.qb.end(), uint16_t(0));  // pad rows: finite
  }
  static void scores(Scratch& w, int64_t rows, int64_t hd, const uint16_t* tile, int nk) {
    w.kp.resize(size_t(hd * kKeys));
    pack_keys(tile, hd, nk, w.kp.data());
    const uint16_t* Q = w.qb.data();
    const uint16_t* kp = w.kp.data();
    float* s = w.s.data();
    const int64_t steps = (rows + 15) / 16;
    configure();
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
      Tiles::template zero<4>();
      Tiles::template zero<5>();
      for (int64_t c = 0; c < hd; c += 32) {
        Tiles::template load<0>(Q + r0 * hd + c, hd * 2);
        Tiles::template load<2>(kp + c * kKeys, 128);
        Tiles::template load<3>(kp + c * kKeys + 32, 128);
        Tiles::template dpbf16ps<4, 0, 2>();
        Tiles::template dpbf16ps<5, 0, 3>();
      }
      Tiles::template store<4>(s + r0 * kKeys, kKeys * 4);
      Tiles::template store<5>(s + r0 * kKeys + 16, kKeys * 4);
      prefetch_part(w.prefetch_k, hd * 64, r0 / 16, steps);
    }
    Tiles::release();
  }
  static void values(Scratch& w, int64_t rows, int64_t hd, const uint16_t* v, int nk) {
    w.vp.resize(size_t(hd * kKeys));
    if (nk < kKeys) std::fill(w.vp.begin(), w.vp.end(), uint16_t(0));  // pairs past nk: 0, never garbage x 0
    pack_values(v, hd, nk, w.vp.data());
    float* acc = w.acc.data();
    for (int64_t r = 0; r < rows; ++r) {  // acc = alpha * acc (most blocks past the first leave every alpha at 1)
      const float al = w.alpha[size_t(r)];
      if (al == 1.0f) continue;
      const __m512 f = _mm512_set1_ps(al);
      for (int64_t i = 0; i < hd; i += 16)
        _mm512_storeu_ps(acc + r * hd + i, _mm512_mul_ps(_mm512_loadu_ps(acc + r * hd + i), f));
    }
    const uint16_t* p = w.pb.data();
    const uint16_t* vp = w.vp.data();
    const int64_t steps = (rows + 15) / 16;
    configure();
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
      Tiles::template load<0>(p + r0 * kKeys, kKeys * 2);
      for (int64_t c = 0; c < hd; c += 32) {
        float* a0 = acc + r0 * hd + c;
        Tiles::template load<4>(a0, hd * 4);
        Tiles::template load<5>(a0 + 16, hd * 4);
        Tiles::template load<2>(vp + 2 * c, hd * 4);
        Tiles::template load<3>(vp + 2 * c + 32, hd * 4);
        Tiles::template dpbf16ps<4, 0, 2>();
        Tiles::template dpbf16ps<5, 0, 3>();
        Tiles::template store<4>(a0, hd * 4);
        Tiles::template store<5>(a0 + 16, hd * 4);
      }
      prefetch_part(w.prefetch_v, hd * 64, r0 / 16, steps);
    }
    Tiles::release();
  }
};

}  // namespace

void attention_isa::attention_avx512_bf16(const AttentionArgs& a, ThreadPool& pool) {
  flash_attention<Bf16Kernel>(a, pool);
}

void attention_isa::attention_amx_bf16(const AttentionArgs& a, ThreadPool& pool, bool emulated) {
  if (emulated) flash_attention<AmxKernel<EmuTiles>>(a, pool);
  else flash_attention<AmxKernel<HwTiles>>(a, pool);
}

}  // namespace tessera

TESSERA_ISA_END
