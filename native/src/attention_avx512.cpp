// Causal grouped-query attention, AVX-512F (+BW for masked 16-bit loads), f32 products: the kernel for AVX-512 CPUs
// without avx512_bf16 (attention_avx512_bf16.cpp takes those with it). The driver (tasks, key splits, online softmax,
// merge) is attention_flash.inc's; this file gives its block products. Keys are stored as tiles of 32 positions
// ([nkv, C/32, hd, 32]), so one block of keys is one contiguous 2*32*hd bytes; values as [nkv, C, hd].
// Both products are outer products (a broadcast query or probability times 16 widened positions or dims), so no
// horizontal sums; the bf16 pairs widen as (even, odd) lanes, scores and probabilities stay in that lane order, and
// the accumulator is put back in order when a row is stored. K tile and V rows of a block ahead are prefetched a line a
// step (decode from memory).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "isa_target.h"
#include "attention_tasks.h"
#include "tessera/attention.h"
#include "thread_scratch.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512)

namespace tessera {
namespace {

#include "attention_flash.inc"

// 32 bf16 as 16 pairs -> f32: element 2i in even's lane i, element 2i+1 in odd's lane i.
inline void widen_pairs(__m512i r, __m512& even, __m512& odd) {
  even = _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(int(0xffff0000u))));
}

// (even, odd) lanes back to order: first = elements 0..15, second = 16..31.
inline void interleave(__m512 even, __m512 odd, __m512& first, __m512& second) {
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  first = _mm512_permutex2var_ps(even, lo, odd);
  second = _mm512_permutex2var_ps(even, hi, odd);
}

// s[r][0..32) = Q[r] . K[key] for RB rows and the nk (<= 32) keys of one tile ([hd][32] bf16), as (even, odd) lanes:
// s[r][i] is key 2i, s[r][16 + i] key 2i + 1; keys >= nk are read as 0. pf: a K tile to bring into the cache
// meanwhile (a line a step), or null.
template <int RB>
void block_scores(const float* Q, int64_t hd, const uint16_t* tile, int nk, float* s, const char* pf) {
  __m512 a0[RB], a1[RB];
  for (int r = 0; r < RB; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
  const __mmask32 keys = nk >= kKeys ? __mmask32(0xffffffffu) : __mmask32((1u << nk) - 1u);
  for (int64_t d = 0; d < hd; ++d) {
    __m512 even, odd;
    widen_pairs(_mm512_maskz_loadu_epi16(keys, tile + d * kKeys), even, odd);
    if (pf) _mm_prefetch(pf + d * 64, _MM_HINT_T1);
    for (int r = 0; r < RB; ++r) {
      const __m512 q = _mm512_set1_ps(Q[r * hd + d]);
      a0[r] = _mm512_fmadd_ps(q, even, a0[r]);
      a1[r] = _mm512_fmadd_ps(q, odd, a1[r]);
    }
  }
  for (int r = 0; r < RB; ++r) {  // stored as they are: permuting here made GCC keep the accumulators in memory
    _mm512_storeu_ps(s + r * kKeys, a0[r]);
    _mm512_storeu_ps(s + r * kKeys + 16, a1[r]);
  }
}

// acc[r][dims of NC chunks of 32] = alpha[r] * acc + sum_j p[r][j] * V[j], over the nk keys of the block; p in
// (even, odd) lanes as block_scores leaves them. acc keeps each 32-dim chunk as (even, odd) lanes. pf: the same
// NC * 64 bytes of each of the 32 value rows of a block ahead, to bring into the cache meanwhile, or null.
template <int RB, int NC>
void block_values(const float* p, const uint16_t* v, int64_t hd, int nk, const float* alpha, float* acc,
                  const char* pf) {
  __m512 A[RB][2 * NC];
  for (int r = 0; r < RB; ++r) {
    const __m512 al = _mm512_set1_ps(alpha[r]);
    for (int c = 0; c < 2 * NC; ++c) A[r][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * hd + c * 16), al);
  }
  for (int j = 0; j < nk; ++j) {
    __m512 E[NC], O[NC];
    for (int c = 0; c < NC; ++c) widen_pairs(_mm512_loadu_si512(v + j * hd + c * 32), E[c], O[c]);
    if (pf)
      for (int c = 0; c < NC; ++c) _mm_prefetch(pf + j * hd * 2 + c * 64, _MM_HINT_T1);
    const int lane = ((j & 1) << 4) + (j >> 1);  // key j's place in the (even, odd) lanes
    for (int r = 0; r < RB; ++r) {
      const __m512 w = _mm512_set1_ps(p[r * kKeys + lane]);
      for (int c = 0; c < NC; ++c) {
        A[r][2 * c] = _mm512_fmadd_ps(w, E[c], A[r][2 * c]);
        A[r][2 * c + 1] = _mm512_fmadd_ps(w, O[c], A[r][2 * c + 1]);
      }
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < 2 * NC; ++c) _mm512_storeu_ps(acc + r * hd + c * 16, A[r][c]);
}

template <int RB>
void values_rows(const float* p, const uint16_t* v, int64_t hd, int nk, const float* alpha, float* acc,
                 const char* pf) {
  int64_t c0 = 0;
  for (; c0 + 64 <= hd; c0 += 64)
    block_values<RB, 2>(p, v + c0, hd, nk, alpha, acc + c0, pf ? pf + c0 * 2 : nullptr);
  if (c0 < hd) block_values<RB, 1>(p, v + c0, hd, nk, alpha, acc + c0, pf ? pf + c0 * 2 : nullptr);
}

// pf (a block ahead's K tile, or null) is prefetched by the first group of rows only.
void scores_rows(const float* Q, int64_t hd, const uint16_t* tile, int nk, float* s, int64_t rows, const char* pf) {
  for_row_groups<8>(rows, [&](auto R, int64_t r) {
    block_scores<R>(Q + r * hd, hd, tile, nk, s + r * kKeys, r == 0 ? pf : nullptr);
  });
}

// pf (a block ahead's V rows, or null) is prefetched by the first group of rows only.
void values_all(const float* p, const uint16_t* v, int64_t hd, int nk, const float* alpha, float* acc, int64_t rows,
                const char* pf) {
  for_row_groups<4>(rows, [&](auto R, int64_t r) {
    values_rows<R>(p + r * kKeys, v, hd, nk, alpha + r, acc + r * hd, r == 0 ? pf : nullptr);
  });
}

// The f32 block products for attention_flash.inc: queries scaled in f32, probabilities used as computed.
struct F32Kernel {
  static __m512i key_lanes(int half) {  // scores in (even, odd) lanes: lane i of half h is key 2i + h
    return _mm512_add_epi32(_mm512_set1_epi32(half), _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22,
                                                                       24, 26, 28, 30));
  }
  static void load_queries(const AttentionArgs& a, int64_t h, int64_t t0, int64_t t1, int64_t g, Scratch& w) {
    const int64_t hd = a.hd;
    w.q.resize(size_t((t1 - t0) * g * hd));
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t j = 0; j < g; ++j) {
        const float* src = query_row(a, h * g + j, t);
        float* dst = w.q.data() + ((t - t0) * g + j) * hd;
        for (int64_t i = 0; i < hd; ++i) dst[i] = src[i] * a.scale;
      }
  }
  static void scores(Scratch& w, int64_t rows, int64_t hd, const uint16_t* tile, int nk) {
    scores_rows(w.q.data(), hd, tile, nk, w.s.data(), rows, w.prefetch_k);
  }
  static void round_probs(__m512 p0, __m512 p1, Scratch& w, int64_t r) {
    _mm512_storeu_ps(w.s.data() + r * kKeys, p0);
    _mm512_storeu_ps(w.s.data() + r * kKeys + 16, p1);
  }
  static void values(Scratch& w, int64_t rows, int64_t hd, const uint16_t* v, int nk) {
    values_all(w.s.data(), v, hd, nk, w.alpha.data(), w.acc.data(), rows, w.prefetch_v);
  }
  static void store_row(const float* acc, float inv, float* out, int64_t hd) {  // acc: (even, odd) per 32 dims
    const __m512 f = _mm512_set1_ps(inv);
    for (int64_t c = 0; c < hd; c += 32) {
      __m512 first, second;
      interleave(_mm512_loadu_ps(acc + c), _mm512_loadu_ps(acc + c + 16), first, second);
      _mm512_storeu_ps(out + c, _mm512_mul_ps(first, f));
      _mm512_storeu_ps(out + c + 16, _mm512_mul_ps(second, f));
    }
  }
};

}  // namespace

void attention_isa::attention_avx512(const AttentionArgs& a, ThreadPool& pool) { flash_attention<F32Kernel>(a, pool); }

}  // namespace tessera

TESSERA_ISA_END
