// Causal grouped-query attention over a q8_0 KV cache (tessera/attention_q8.h), AVX2 + FMA + F16C: the kernel of CPUs
// without AVX-512 VNNI (Zen 2/3, Haswell..Alder Lake), so that their decode reads the half-size cache in one native
// call as the VNNI ones do (attention_q8_avx512_vnni.cpp: the same algorithm at 16 lanes, read it first). 8 lanes;
// AVX2 has no vpdpbusd, so both int8 products are vpmaddubsw (u8 x s8 -> int16 pair sums) then vpmaddwd by ones
// (-> int32), with operands chosen so that no int16 pair sum can saturate:
// - Scores: each scaled query row is quantized per block of 32 dims to int8 in [-127, 127] with an f32 scale (as the
//   VNNI kernel does). The key bytes go in as |k| (unsigned, <= 128) against sign(q, k) (= q * sgn(k), in
//   [-127, 127]): |k| * sign(q, k) = k * q exactly, also for a key byte of -128 (whose |k| is 128 as uint8), and a
//   pair sum is at most 2 * 128 * 127 = 32512 < 32767. (engine.kv_q8.quantize_q8_0 and quantize_q8_block clamp to
//   [-127, 127]; keys past the last written position may hold anything and are masked, but even they cannot
//   saturate.) Per block of 32 dims: int32 -> f32, times the query's scale and the keys' f16 scales.
// - Values: the probability of key j times the key's value scale for block b (w = p_j * dv_j,b >= 0) is quantized
//   per (row, block of 32 keys, block of 32 dims) to 0..127 (not the VNNI kernel's 0..255: u8 255 x s8 127 twice
//   overflows vpmaddubsw's int16) with the step (max_j p_j) * (max_j dv_j,b) / 127, against the values as stored
//   (dim, 4 positions): a pair sum is at most 2 * 127 * 128 = 32512, for any value byte. Error: the rounding of w
//   adds at most half a step per key and block, (max_j p_j) * (max_j dv_j,b) / 254; times a value |v8| <= 127 that
//   is at most half of one q8_0 value step (dv_max / 2) weighted by the block's largest probability, the size of the
//   rounding the q8_0 cache already put into that value (twice the VNNI kernel's 1/510 of the weight). The roundings
//   are independent across keys, so they add like the cache's own (tests/engine/test_kv_q8.py int8_ok holds both
//   kernels to 6 sigma of their uniform rounding per element and 1.2 sigma in RMS, sigma from each kernel's step).
//   An exact 0..255 scheme needs the values widened to int16 for vpmaddwd: twice the instructions per value byte.
// The driver (tasks of one KV head x a block of query rows x a range of keys from attention_tasks.h, flash-decoding
// key splits with a merge, online softmax, chunks of kQ8ChunkBlocks key blocks, prefetch of K, V and the scales
// kQ8PrefetchBlocks blocks ahead) is attention_q8_driver.inc's, shared with the VNNI kernel; this file gives its steps
// (Q8Avx2) and takes attention_avx2.inc's merge_key_ranges8. Register blocking: 4 rows x 8 keys (scores) or 8 dims
// (values) per pass, so accumulators, operands and the constants fit the 16 ymm registers.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "isa_target.h"
#include "attention_tasks.h"
#include "tessera/attention_q8.h"
#include "thread_scratch.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX2)

namespace tessera {
namespace {

#include "attention_avx2.inc"  // the task split, reductions, exp, row groups and merge shared with attention_avx2.cpp
#include "attention_q8_driver.inc"  // the driver, shared with attention_q8_avx512_vnni.cpp; its steps: Q8Avx2

static_assert(kQ8ChunkBlocks == 4, "the block maxima reduce 2 rows x 4 blocks per vector");

// The 8 horizontal reductions (max or add) of v[0..8) as one vector, lane i holding v[i]'s: a tree of shuffles.
template <class Op>
inline __m256 reduce8(const __m256* v, Op op) {
  __m256 a[4], b[2];
  for (int i = 0; i < 4; ++i)  // 128-bit halves: v[2i]'s partials in lanes 0-3, v[2i+1]'s in 4-7
    a[i] = op(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20), _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
  for (int i = 0; i < 2; ++i)  // low half: v[4i]'s in lanes 0-1, v[4i+2]'s in 2-3; high half: v[4i+1]'s, v[4i+3]'s
    b[i] = op(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
              _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // lanes: v0 v2 v4 v6 | v1 v3 v5 v7
  const __m256 c = op(_mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

struct Max8 {  // reduce8's operation (a functor: a lambda's function-pointer conversion trips GCC's -Wpsabi)
  __m256 operator()(__m256 p, __m256 q) const { return _mm256_max_ps(p, q); }
};

inline __m256 f16x8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// s[r][0..32) = q_r . key for RB rows (row stride ss) and the 32 keys of one tile (keys >= nk hold anything; the
// softmax masks them), 8 keys per pass. pfk: the K tile of a block ahead (hd * 32 bytes), a line every other step.
template <int RB>
void q8_scores(const int8_t* Q, const float* qd, int64_t hd, const int8_t* tile, const uint16_t* ks, float* s,
               int64_t ss, const char* pfk) {
  const int64_t nb = hd / kQ8Block;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int quarter = 0; quarter < 4; ++quarter) {  // keys 8 * quarter .. 8 * quarter + 7
    __m256 f[RB];
    for (int r = 0; r < RB; ++r) f[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m256i a[RB];
      for (int r = 0; r < RB; ++r) a[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int gi = 0; gi < 8; ++gi) {
        const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + (b * 8 + gi) * 128 + quarter * 32));
        const __m256i ka = _mm256_abs_epi8(k);  // |k| as uint8 (128 for -128)
        if (pfk && (gi & 1) == 0) _mm_prefetch(pfk + ((quarter * nb + b) * 4 + gi / 2) * 64, _MM_HINT_T1);
        for (int r = 0; r < RB; ++r) {
          const __m256i qb = _mm256_set1_epi32(load4(Q + r * hd + b * kQ8Block + gi * 4));
          const __m256i pairs = _mm256_maddubs_epi16(ka, _mm256_sign_epi8(qb, k));  // |pair| <= 2 * 128 * 127
          a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(pairs, ones));
        }
      }
      const __m256 dk = f16x8(ks + b * kQ8Block + quarter * 8);
      for (int r = 0; r < RB; ++r)
        f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r]), _mm256_mul_ps(dk, _mm256_set1_ps(qd[r * nb + b])), f[r]);
    }
    for (int r = 0; r < RB; ++r) _mm256_storeu_ps(s + r * ss + quarter * 8, f[r]);
  }
}

// acc[r][0..hd) = alpha[r] * acc + sum over the chunk's nblk blocks and their 32 keys of wq * wd * v, for RB rows
// (row strides: wq kQ8ChunkBlocks * nb * 32 bytes, wd kQ8ChunkBlocks * nb, acc hd), 8 dims per pass: the
// accumulators of 8 dims stay in registers across the blocks. v: the chunk's first V tile (tiles consecutive, each
// [8 groups of 4 keys][hd][4]). pf: V bytes ahead to prefetch (the tiles kQ8PrefetchBlocks ahead, up to pf_bytes of
// them), a line every other step in address order, or null.
template <int RB>
void q8_values(const uint8_t* wq, const float* wd, const float* alpha, int64_t nb, int64_t nblk, int64_t hd,
               const int8_t* v, float* acc, const char* pf, int64_t pf_bytes) {
  const int64_t wqb = nb * kKeys, wstride = kQ8ChunkBlocks * wqb;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b)
    for (int quarter = 0; quarter < 4; ++quarter) {  // dims b * 32 + 8 * quarter .. + 7
      const int64_t d0 = b * kQ8Block + quarter * 8;
      __m256 f[RB];
      for (int r = 0; r < RB; ++r) f[r] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * hd + d0), _mm256_set1_ps(alpha[r]));
      for (int64_t blk = 0; blk < nblk; ++blk) {
        const int8_t* vt = v + blk * hd * kKeys;
        const uint8_t* wb = wq + blk * wqb + b * kKeys;
        __m256i a[RB];
        for (int r = 0; r < RB; ++r) a[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int gi = 0; gi < 8; ++gi) {
          const __m256i vv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vt + (gi * hd + d0) * 4));  // 8 dims x 4 keys
          if (pf && (gi & 1) == 0) {
            const int64_t at = ((((b * 4 + quarter) * nblk + blk) * 8 + gi) / 2) * 64;
            if (at < pf_bytes) _mm_prefetch(pf + at, _MM_HINT_T1);
          }
          for (int r = 0; r < RB; ++r) {
            const __m256i w = _mm256_set1_epi32(load4(wb + r * wstride + 4 * gi));  // keys 4gi..4gi+3, each <= 127
            a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(_mm256_maddubs_epi16(w, vv), ones));
          }
        }
        for (int r = 0; r < RB; ++r)
          f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r]), _mm256_set1_ps(wd[(r * kQ8ChunkBlocks + blk) * nb + b]), f[r]);
      }
      for (int r = 0; r < RB; ++r) _mm256_storeu_ps(acc + r * hd + d0, f[r]);
    }
}

// Online softmax over one chunk of nblk key blocks (scores in w.s, keys >= visible[r] ignored; nk keys of the chunk
// exist, the others may hold any bits, even NaN), then each row's weights w_j,b = p_j * dv_j,b quantized to 0..127 per
// key block and block b of 32 dims, with the step (max_j p_j) * (max_j dv_j,b) / 127 (the VNNI kernel's steps at half
// the levels). vs: the value scales of the chunk's first tile (tiles consecutive, [nb][32] each).
void softmax_and_weights(Q8Scratch& w, int64_t rows, int64_t nb, int64_t nblk, const uint16_t* vs, int64_t nk) {
  constexpr int64_t CB = kQ8ChunkBlocks;
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  // (1) each block's maximum, 2 rows x 4 blocks per reduction tree (-inf for a block the row sees none of), the scores
  // of keys a row does not see set to -inf in place (only in a block it sees in part).
  for (int64_t r0 = 0; r0 < rows; r0 += 2) {
    __m256 v[8];
    for (int i = 0; i < 8; ++i) {
      const int64_t r = r0 + i / 4, blk = i % 4;
      if (r >= rows || blk >= nblk) {
        v[i] = ninf;
        continue;
      }
      float* x = w.s.data() + r * kQ8ChunkKeys + blk * kKeys;
      const int64_t seen = w.visible[size_t(r)] - blk * kKeys;
      __m256 mx = ninf;
      for (int c = 0; c < 4; ++c) {
        __m256 xc = _mm256_loadu_ps(x + 8 * c);
        if (seen < kKeys) {
          const __m256i sn = _mm256_set1_epi32(int(std::max<int64_t>(seen, 0)) - 8 * c);
          xc = _mm256_blendv_ps(ninf, xc, _mm256_castsi256_ps(_mm256_cmpgt_epi32(sn, lanes)));
          _mm256_storeu_ps(x + 8 * c, xc);
        }
        mx = _mm256_max_ps(mx, xc);
      }
      v[i] = mx;
    }
    _mm256_storeu_ps(w.mxb.data() + r0 * CB, reduce8(v, Max8{}));
  }
  // (2) per row: the running max, alpha and mref (attention_q8_driver.inc)
  update_row_max(w, rows, nblk);
  // (3) c = exp(mxb - m), the block's largest probability; 0 for a block the row does not see (-inf - m, or
  // -inf - -inf = NaN: exp_nonpositive8 gives 0 for both). Rows rounded up to 2: whole vectors.
  for (int64_t e = 0; e < (rows + 1) / 2 * 2 * CB; e += 8)
    _mm256_storeu_ps(w.c.data() + e, exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(w.mxb.data() + e),
                                                                     _mm256_loadu_ps(w.mref.data() + e))));
  // (4) per block, for all rows: dv_j,b * 127 / max_j dv_j,b (dvn) and max_j dv_j,b / 127 (dvs), keys that exist
  // (the scales of the others may be any bits: zeroed).
  __m256 dvn[CB][4 * 16];  // nb <= 16
  float dvs[CB][16];
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const int nkb = int(std::min<int64_t>(kKeys, nk - blk * kKeys));
    __m256 in[4];
    for (int c = 0; c < 4; ++c)
      in[c] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nkb - 8 * c), lanes));
    const uint16_t* vb = vs + blk * nb * kKeys;
    for (int64_t b = 0; b < nb; ++b) {
      __m256 d[4], mx = _mm256_setzero_ps();
      for (int c = 0; c < 4; ++c) {
        d[c] = _mm256_and_ps(in[c], f16x8(vb + b * kKeys + 8 * c));
        mx = _mm256_max_ps(mx, _mm256_and_ps(d[c], absmask));
      }
      const float m = hmax8(mx);
      const __m256 f = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
      for (int c = 0; c < 4; ++c) dvn[blk][4 * b + c] = _mm256_mul_ps(d[c], f);
      dvs[blk][b] = m / 127.0f;
    }
  }
  // (5) per row and block: e = exp(x - mxb) (largest exactly 1), l += c * sum(e) (8 partial sums), and the weights
  // c * e_j * dv_j,b as e_j * dvn_b rounded to nearest and saturated to [0, 127] (rounding can add ulps past 127; a
  // negative scale gives 0, as the VNNI kernel's unsigned saturation does) with the step c * dvs_b. A block with
  // c = 0 (not seen, or all its keys weigh < e^-87 of the largest) gets the step 0: its bytes weigh nothing.
  const int64_t wqb = nb * kKeys;
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // the packs' dwords back to key order
  const __m256i zero = _mm256_setzero_si256();
  for (int64_t r = 0; r < rows; ++r) {
    __m256 L = _mm256_mul_ps(_mm256_loadu_ps(w.lsum.data() + r * 8), _mm256_set1_ps(w.alpha[size_t(r)]));
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const float c = w.c[size_t(r * CB + blk)];
      float* wd = w.wd.data() + (r * CB + blk) * nb;
      if (!(c > 0.0f)) {
        std::fill(wd, wd + nb, 0.0f);
        continue;
      }
      const float* x = w.s.data() + r * kQ8ChunkKeys + blk * kKeys;
      const __m256 top = _mm256_set1_ps(w.mxb[size_t(r * CB + blk)]);
      __m256 e[4];
      for (int k = 0; k < 4; ++k) e[k] = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(x + 8 * k), top));  // masked: 0
      L = _mm256_fmadd_ps(_mm256_set1_ps(c), _mm256_add_ps(_mm256_add_ps(e[0], e[1]), _mm256_add_ps(e[2], e[3])), L);
      uint8_t* wq = w.wq.data() + (r * CB + blk) * wqb;
      for (int64_t b = 0; b < nb; ++b) {
        const __m256i u01 = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(e[0], dvn[blk][4 * b])),
                                               _mm256_cvtps_epi32(_mm256_mul_ps(e[1], dvn[blk][4 * b + 1])));
        const __m256i u23 = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(e[2], dvn[blk][4 * b + 2])),
                                               _mm256_cvtps_epi32(_mm256_mul_ps(e[3], dvn[blk][4 * b + 3])));
        const __m256i u = _mm256_max_epi8(_mm256_permutevar8x32_epi32(_mm256_packs_epi16(u01, u23), order), zero);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(wq + b * kKeys), u);
      }
      for (int64_t b = 0; b < nb; ++b) wd[b] = c * dvs[blk][b];
    }
    _mm256_storeu_ps(w.lsum.data() + r * 8, L);
  }
}

// The steps of attention_q8_driver.inc's q8_flash_attention at 8 lanes.
struct Q8Avx2 {
  using Scratch = Q8Scratch;
  static constexpr int kLanes = 8;     // the denominators' partial sums (lsum)
  static constexpr int kRowGroup = 4;  // rows per register group of q8_scores / q8_values
  static int64_t wq_bytes(int64_t nb) { return nb * kKeys; }
  static void prepare(Q8Scratch& w, int64_t rows, int64_t, int64_t) {
    constexpr int64_t CB = kQ8ChunkBlocks;
    const int64_t padded = (rows + 1) / 2 * 2;  // whole reduce8 trees and vectors of 2 rows
    w.mxb.resize(size_t(padded * CB));
    w.mref.assign(size_t(padded * CB), 0.0f);
    w.c.resize(size_t(padded * CB));
  }
  static void query_terms(Q8Scratch&, int64_t, int64_t) {}  // no bias: |k| x sign(q, k) is the signed product
  template <int R>
  static void scores(const Q8Scratch& w, int64_t r, int64_t hd, const int8_t* tile, const uint16_t* ks, float* s,
                     const char* pfk) {
    q8_scores<R>(w.q8.data() + r * hd, w.qd.data() + r * (hd / kQ8Block), hd, tile, ks, s, kQ8ChunkKeys, pfk);
  }
  static constexpr auto softmax_and_weights = &tessera::softmax_and_weights;
  template <int R>
  static void values(Q8Scratch& w, int64_t r, int64_t nb, int64_t nblk, int64_t hd, const int8_t* v, const char* pf,
                     int64_t pf_bytes) {
    q8_values<R>(w.wq.data() + r * kQ8ChunkBlocks * wq_bytes(nb), w.wd.data() + r * kQ8ChunkBlocks * nb,
                 w.alpha.data() + r, nb, nblk, hd, v, w.acc.data() + r * hd, pf, pf_bytes);
  }
  static float lane_sum(const float* l) { return hsum8(_mm256_loadu_ps(l)); }
  static void store_row(const float* acc, float inv, float* out, int64_t hd) {
    const __m256 f = _mm256_set1_ps(inv);
    for (int64_t i = 0; i < hd; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), f));
  }
  static void merge(const AttentionTasks& tasks, const float* parts, int64_t nh, int64_t hd, float* out,
                    ThreadPool& pool) {
    merge_key_ranges8(tasks, parts, nh, hd, out, pool);  // attention_avx2.inc
  }
};

}  // namespace

void attention_isa::attention_q8_avx2(const AttentionQ8Args& a, ThreadPool& pool) {
  q8_flash_attention<Q8Avx2>(a, pool);
}

}  // namespace tessera

TESSERA_ISA_END
