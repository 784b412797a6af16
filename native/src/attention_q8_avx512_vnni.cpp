// Causal grouped-query attention over a q8_0 KV cache (tessera/attention_q8.h), AVX-512 VNNI: both products on int8
// by vpdpbusd (64 byte products per instruction, four times the f32 FMA's rate), so a decode step reads the half-size
// cache at memory speed instead of being bound by widening it.
// - Scores: each scaled query row is quantized per block of 32 dims to int8 with an f32 scale (llama.cpp quantizes q
//   the same way to q8_0 against a q8_0 cache). vpdpbusd wants one operand unsigned: the keys' sign bit is flipped in
//   registers (k + 128), and the integer dot starts at -128 * sum(q block). Per block: int32 -> f32, times the
//   query's scale and the 16 keys' f16 scales, summed over the blocks. Keys come as stored, 16 per register.
// - Values: the probability of key j times the key's value scale for block b (w = p_j * dv_j,b >= 0) is quantized per
//   (row, block of 32 keys, block of 32 dims) to uint8 with the step (max_j p_j) * (max_j dv_j,b) / 255, and vpdpbusd
//   sums 4 keys at a time against the values stored as (dim, 4 positions). The softmax denominator sums the unrounded
//   probabilities. The rounding of w adds at most half a step per key and block: for the block's heaviest key, at
//   most 1/510 of its weight times the largest value scale, the size of the q8_0 values' own step (amax/254).
// The driver (tasks of one KV head x a block of query rows x a range of keys, key splits with a merge at decode,
// online softmax over chunks of 4 key blocks, kQ8ChunkBlocks) is attention_q8_driver.inc's, shared with the AVX2
// kernel; this file gives its steps (Q8Vnni: the rows' horizontal maxima as reduction trees, the denominators as 16
// partial sums) and takes attention_flash.inc's helpers and its 16-lane merge.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "isa_target.h"
#include "attention_tasks.h"
#include "tessera/attention.h"
#include "tessera/attention_q8.h"
#include "thread_scratch.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_VNNI)

namespace tessera {
namespace {

#include "attention_flash.inc"
#include "attention_q8_driver.inc"  // the driver, shared with attention_q8_avx2.cpp; its steps: Q8Vnni

static_assert(kQ8ChunkBlocks == 4, "the block maxima reduce 4 rows x 4 blocks per vector");

struct Q8VnniScratch : Q8Scratch {  // attention_q8_driver.inc's, and
  std::vector<int32_t> qcorr;       // [rows, nb] -128 * sum of each block of q8: the integer dots' start value
};

inline __m512 f16x16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// One row's uint8 weights for one key block: the dim blocks in pairs of 64 bytes, as two packs (packus_epi32 then
// packus_epi16) leave them: in 128-bit lane L of pair p, dim block 2p's keys 4L..4L+3 and 16+4L..16+4L+3, then dim
// block 2p+1's. wq_offset: the 4 bytes of keys 4gi..4gi+3 for dim block b (one vpdpbusd operand).
inline int64_t wq_bytes(int64_t nb) { return (nb + 1) / 2 * 64; }
inline int64_t wq_offset(int64_t b, int gi) { return (b / 2) * 64 + 16 * (gi % 4) + 4 * (gi / 4) + 8 * (b % 2); }

// s[r][0..32) = q_r . key for RB rows (row stride ss) and the 32 keys of one tile (keys >= nk hold anything; the
// softmax masks them). pfk: the K tile of a block ahead (hd * 32 bytes), two lines a step, or null.
template <int RB>
void q8_scores(const int8_t* Q, const float* qd, const int32_t* ncorr, int64_t hd, const int8_t* tile,
               const uint16_t* ks, float* s, int64_t ss, const char* pfk) {
  const int64_t nb = hd / kQ8Block;
  const __m512i flip = _mm512_set1_epi8(int8_t(0x80));
  __m512 s0[RB], s1[RB];
  for (int r = 0; r < RB; ++r) s0[r] = s1[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i a0[RB], a1[RB];
    for (int r = 0; r < RB; ++r) a0[r] = a1[r] = _mm512_set1_epi32(ncorr[r * nb + b]);  // the flip's 128 * sum(q)
    for (int gi = 0; gi < 8; ++gi) {
      const int8_t* src = tile + (b * 8 + gi) * 128;  // 4 dims x 32 keys
      const __m512i k0 = _mm512_xor_si512(_mm512_loadu_si512(src), flip);
      const __m512i k1 = _mm512_xor_si512(_mm512_loadu_si512(src + 64), flip);
      if (pfk) {
        _mm_prefetch(pfk + (b * 8 + gi) * 128, _MM_HINT_T1);
        _mm_prefetch(pfk + (b * 8 + gi) * 128 + 64, _MM_HINT_T1);
      }
      for (int r = 0; r < RB; ++r) {
        const __m512i qb = _mm512_set1_epi32(load4(Q + r * hd + b * kQ8Block + gi * 4));
        a0[r] = _mm512_dpbusd_epi32(a0[r], k0, qb);
        a1[r] = _mm512_dpbusd_epi32(a1[r], k1, qb);
      }
    }
    const __m512 dk0 = f16x16(ks + b * kQ8Block), dk1 = f16x16(ks + b * kQ8Block + 16);
    for (int r = 0; r < RB; ++r) {
      const __m512 f = _mm512_set1_ps(qd[r * nb + b]);
      s0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0[r]), _mm512_mul_ps(dk0, f), s0[r]);
      s1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[r]), _mm512_mul_ps(dk1, f), s1[r]);
    }
  }
  for (int r = 0; r < RB; ++r) {
    _mm512_storeu_ps(s + r * ss, s0[r]);
    _mm512_storeu_ps(s + r * ss + 16, s1[r]);
  }
}

// acc[r][0..hd) = alpha[r] * acc + sum over the chunk's nblk blocks and their 32 keys of wq * wd * v, for RB rows
// (row strides: wq kQ8ChunkBlocks * wqb bytes, wd kQ8ChunkBlocks * nb, acc hd). The accumulators of one dim block
// stay in registers across the blocks. v: the chunk's first V tile (tiles consecutive, each [8 groups of 4 keys][hd][4]).
// pf: V bytes ahead to prefetch (the tiles kQ8PrefetchBlocks ahead, up to pf_bytes of them), two lines a step in
// address order (one stream for the hardware's prefetcher too), or null.
template <int RB>
void q8_values(const uint8_t* wq, const float* wd, const float* alpha, int64_t nb, int64_t nblk, int64_t wqb,
               int64_t hd, const int8_t* v, float* acc, const char* pf, int64_t pf_bytes) {
  for (int64_t b = 0; b < nb; ++b) {
    __m512 f0[RB], f1[RB];
    for (int r = 0; r < RB; ++r) {
      const __m512 al = _mm512_set1_ps(alpha[r]);
      const float* A = acc + r * hd + b * kQ8Block;
      f0[r] = _mm512_mul_ps(_mm512_loadu_ps(A), al);
      f1[r] = _mm512_mul_ps(_mm512_loadu_ps(A + 16), al);
    }
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int8_t* vt = v + blk * hd * kKeys;
      const uint8_t* wb = wq + blk * wqb;
      __m512i a0[RB], a1[RB];
      for (int r = 0; r < RB; ++r) a0[r] = a1[r] = _mm512_setzero_si512();
      for (int gi = 0; gi < 8; ++gi) {
        const int8_t* src = vt + (gi * hd + b * kQ8Block) * 4;  // 32 dims x 4 keys
        const __m512i v0 = _mm512_loadu_si512(src), v1 = _mm512_loadu_si512(src + 64);
        if (pf) {
          const int64_t at = ((b * nblk + blk) * 8 + gi) * 128;
          if (at < pf_bytes) {
            _mm_prefetch(pf + at, _MM_HINT_T1);
            _mm_prefetch(pf + at + 64, _MM_HINT_T1);
          }
        }
        const int64_t off = wq_offset(b, gi);
        for (int r = 0; r < RB; ++r) {
          const __m512i w = _mm512_set1_epi32(load4(wb + r * kQ8ChunkBlocks * wqb + off));
          a0[r] = _mm512_dpbusd_epi32(a0[r], w, v0);
          a1[r] = _mm512_dpbusd_epi32(a1[r], w, v1);
        }
      }
      for (int r = 0; r < RB; ++r) {
        const __m512 f = _mm512_set1_ps(wd[(r * kQ8ChunkBlocks + blk) * nb + b]);
        f0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0[r]), f, f0[r]);
        f1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[r]), f, f1[r]);
      }
    }
    for (int r = 0; r < RB; ++r) {
      float* A = acc + r * hd + b * kQ8Block;
      _mm512_storeu_ps(A, f0[r]);
      _mm512_storeu_ps(A + 16, f1[r]);
    }
  }
}

// The 16 horizontal reductions (max or add) of v[0..16) as one vector, lane i holding v[i]'s: a tree of shuffles
// (46 instructions for the 16 where one reduction alone takes 8).
template <class Op>
inline __m512 reduce16(const __m512* v, Op op) {
  __m512 w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i)  // 256-bit halves: vector 2i's partials in lanes 0-7, 2i+1's in 8-15
    w[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 4; ++i)  // 128-bit lane j: vector 4i + j's partials
    x[i] = op(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
              _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; ++i)  // lane j: floats 0-1 vector 8i + j's, 2-3 vector 8i + 4 + j's
    y[i] = op(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x[2 * i]), _mm512_castps_pd(x[2 * i + 1]))),
              _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x[2 * i]), _mm512_castps_pd(x[2 * i + 1]))));
  // lane 4j + k: vector 4k + j's
  const __m512 z = op(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

// Online softmax over one chunk of nblk key blocks (scores in w.s, keys >= visible[r] ignored; nk keys of the chunk
// exist, the others may hold any bits, even NaN), then each row's weights w_j,b = p_j * dv_j,b quantized to uint8 per
// key block and block b of 32 dims, with the step (max_j p_j) * (max_j dv_j,b) / 255: the value scales' maxima and
// dv / max are taken once per key block for all rows, so a row pays one max of its p per block. vs: the value scales
// of the chunk's first tile (tiles consecutive, [nb][32] each).
void softmax_and_weights(Q8Scratch& w, int64_t rows, int64_t nb, int64_t nblk, const uint16_t* vs, int64_t nk) {
  constexpr int64_t CB = kQ8ChunkBlocks;
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i sixteen = _mm512_set1_epi32(16);
  // (1) each block's maximum, 4 rows x 4 blocks per reduction tree (-inf for a block the row sees none of), the scores
  // of keys a row does not see set to -inf in place (only in a block it sees in part).
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    __m512 v[16];
    for (int i = 0; i < 16; ++i) {
      const int64_t r = r0 + i / 4, blk = i % 4;
      if (r >= rows || blk >= nblk) {
        v[i] = ninf;
        continue;
      }
      float* x = w.s.data() + r * kQ8ChunkKeys + blk * kKeys;
      const int64_t seen = w.visible[size_t(r)] - blk * kKeys;
      __m512 x0, x1;
      if (seen >= kKeys) {
        x0 = _mm512_loadu_ps(x);
        x1 = _mm512_loadu_ps(x + 16);
      } else {
        const __m512i sn = _mm512_set1_epi32(int(std::max<int64_t>(seen, 0)));
        x0 = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(lanes, sn), ninf, _mm512_loadu_ps(x));
        x1 = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(_mm512_add_epi32(lanes, sixteen), sn), ninf,
                                  _mm512_loadu_ps(x + 16));
        _mm512_storeu_ps(x, x0);
        _mm512_storeu_ps(x + 16, x1);
      }
      v[i] = _mm512_max_ps(x0, x1);
    }
    _mm512_storeu_ps(w.mxb.data() + r0 * CB, reduce16(v, [](__m512 p, __m512 q) { return _mm512_max_ps(p, q); }));
  }
  // (2) per row: the running max, alpha and mref (attention_q8_driver.inc)
  update_row_max(w, rows, nblk);
  // (3) c = exp(mxb - m), the block's largest probability (every probability of it is c * exp(x - mxb)); 0 for a block
  // the row does not see (-inf - m, or -inf - -inf = NaN: exp_nonpositive gives 0 for both).
  for (int64_t e = 0; e < rows * CB; e += 16) {
    const __mmask16 in = rows * CB - e >= 16 ? __mmask16(0xffff) : __mmask16((1u << (rows * CB - e)) - 1u);
    const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(w.mxb.data() + e), _mm512_maskz_loadu_ps(in, w.mref.data() + e));
    _mm512_mask_storeu_ps(w.c.data() + e, in, exp_nonpositive(x));
  }
  // (4) per block, for all rows: dv_j,b * 255 / max_j dv_j,b (dvn) and max_j dv_j,b / 255 (dvs), keys that exist.
  __m512 dvn[CB][2 * 16];  // nb <= 16
  float dvs[CB][16];
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const __m512i nkb = _mm512_set1_epi32(int(std::min<int64_t>(kKeys, nk - blk * kKeys)));
    const __mmask16 in0 = _mm512_cmplt_epi32_mask(lanes, nkb);
    const __mmask16 in1 = _mm512_cmplt_epi32_mask(_mm512_add_epi32(lanes, sixteen), nkb);
    const uint16_t* vb = vs + blk * nb * kKeys;
    for (int64_t b = 0; b < nb; ++b) {
      const __m512 d0 = _mm512_maskz_mov_ps(in0, f16x16(vb + b * kKeys));
      const __m512 d1 = _mm512_maskz_mov_ps(in1, f16x16(vb + b * kKeys + 16));
      const float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(d0), _mm512_abs_ps(d1)));
      const __m512 f = _mm512_set1_ps(mx > 0.0f ? 255.0f / mx : 0.0f);
      dvn[blk][2 * b] = _mm512_mul_ps(d0, f);
      dvn[blk][2 * b + 1] = _mm512_mul_ps(d1, f);
      dvs[blk][b] = mx / 255.0f;
    }
  }
  // (5) per row and block: e = exp(x - mxb) (largest exactly 1), l += c * sum(e) (16 partial sums), and the weights
  // c * e_j * dv_j,b as uint8 e_j * dvn_b (rounded to nearest, saturated: rounding can add ulps) with the step
  // c * dvs_b. A block with c = 0 (not seen, or all its keys weigh < e^-87 of the largest) gets the step 0: its
  // bytes (whatever they hold) weigh nothing.
  const int64_t wqb = wq_bytes(nb);
  for (int64_t r = 0; r < rows; ++r) {
    __m512 L = _mm512_mul_ps(_mm512_loadu_ps(w.lsum.data() + r * 16), _mm512_set1_ps(w.alpha[size_t(r)]));
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const float c = w.c[size_t(r * CB + blk)];
      float* wd = w.wd.data() + (r * CB + blk) * nb;
      if (!(c > 0.0f)) {
        std::fill(wd, wd + nb, 0.0f);
        continue;
      }
      const float* x = w.s.data() + r * kQ8ChunkKeys + blk * kKeys;
      const __m512 top = _mm512_set1_ps(w.mxb[size_t(r * CB + blk)]);
      const __m512 e0 = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(x), top));  // masked keys: exp(-inf) = 0
      const __m512 e1 = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(x + 16), top));
      L = _mm512_fmadd_ps(_mm512_set1_ps(c), _mm512_add_ps(e0, e1), L);
      uint8_t* wq = w.wq.data() + (r * CB + blk) * wqb;
      for (int64_t b = 0; b < nb; b += 2) {
        const __m512i u0 = _mm512_packus_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(e0, dvn[blk][2 * b])),
                                               _mm512_cvtps_epi32(_mm512_mul_ps(e1, dvn[blk][2 * b + 1])));
        const __m512i u1 = b + 1 < nb ? _mm512_packus_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(e0, dvn[blk][2 * b + 2])),
                                                            _mm512_cvtps_epi32(_mm512_mul_ps(e1, dvn[blk][2 * b + 3])))
                                      : _mm512_setzero_si512();
        _mm512_storeu_si512(wq + (b / 2) * 64, _mm512_packus_epi16(u0, u1));
      }
      for (int64_t b = 0; b < nb; ++b) wd[b] = c * dvs[blk][b];
    }
    _mm512_storeu_ps(w.lsum.data() + r * 16, L);
  }
}

// The steps of attention_q8_driver.inc's q8_flash_attention at 16 lanes.
struct Q8Vnni {
  using Scratch = Q8VnniScratch;
  static constexpr int kLanes = 16;    // the denominators' partial sums (lsum)
  static constexpr int kRowGroup = 4;  // rows per register group of q8_scores / q8_values
  static int64_t wq_bytes(int64_t nb) { return tessera::wq_bytes(nb); }
  static void prepare(Q8VnniScratch& w, int64_t rows, int64_t, int64_t nb) {
    constexpr int64_t CB = kQ8ChunkBlocks;
    w.qcorr.resize(size_t(rows * nb));
    w.mxb.resize(size_t((rows + 3) / 4 * 4 * CB));  // whole reduce16 trees of 4 rows
    w.mref.resize(size_t(rows * CB));
    w.c.resize(size_t(rows * CB));
  }
  static void query_terms(Q8VnniScratch& w, int64_t rows, int64_t hd) {  // the dots' start: -128 * sum(q block)
    for (int64_t e = 0; e < rows * hd; e += kQ8Block) {
      int32_t sum = 0;
      for (int i = 0; i < kQ8Block; ++i) sum += w.q8[size_t(e + i)];
      w.qcorr[size_t(e / kQ8Block)] = -128 * sum;
    }
  }
  template <int R>
  static void scores(const Q8VnniScratch& w, int64_t r, int64_t hd, const int8_t* tile, const uint16_t* ks, float* s,
                     const char* pfk) {
    const int64_t nb = hd / kQ8Block;
    q8_scores<R>(w.q8.data() + r * hd, w.qd.data() + r * nb, w.qcorr.data() + r * nb, hd, tile, ks, s, kQ8ChunkKeys,
                 pfk);
  }
  static constexpr auto softmax_and_weights = &tessera::softmax_and_weights;
  template <int R>
  static void values(Q8Scratch& w, int64_t r, int64_t nb, int64_t nblk, int64_t hd, const int8_t* v, const char* pf,
                     int64_t pf_bytes) {
    const int64_t wqb = wq_bytes(nb);
    q8_values<R>(w.wq.data() + r * kQ8ChunkBlocks * wqb, w.wd.data() + r * kQ8ChunkBlocks * nb, w.alpha.data() + r, nb,
                 nblk, wqb, hd, v, w.acc.data() + r * hd, pf, pf_bytes);
  }
  static float lane_sum(const float* l) { return _mm512_reduce_add_ps(_mm512_loadu_ps(l)); }
  static void store_row(const float* acc, float inv, float* out, int64_t hd) {
    const __m512 f = _mm512_set1_ps(inv);
    for (int64_t i = 0; i < hd; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(acc + i), f));
  }
  static void merge(const AttentionTasks& tasks, const float* parts, int64_t nh, int64_t hd, float* out,
                    ThreadPool& pool) {
    merge_key_ranges16<Q8Vnni>(tasks, parts, nh, hd, out, pool);  // attention_flash.inc
  }
};

}  // namespace

void attention_isa::attention_q8_avx512_vnni(const AttentionQ8Args& a, ThreadPool& pool) {
  q8_flash_attention<Q8Vnni>(a, pool);
}

}  // namespace tessera

TESSERA_ISA_END
