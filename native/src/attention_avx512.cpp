// Causal grouped-query attention, AVX-512F (+BW for masked 16-bit loads), flash style: each task takes one KV head and
// a block of query tokens (all g query heads of that KV head: up to ~128 query rows), walks the key blocks of 32
// positions with an online softmax, and reads the bf16 K/V in place (widened 32 values at a time in registers). Scores
// live in a [rows, 32] scratch: no T x S matrix anywhere. Keys are stored as tiles of 32 positions ([nkv, C/32, hd, 32]),
// so one block of keys is one contiguous 2*32*hd bytes; values as [nkv, C, hd].
// Both products are outer products (a broadcast query or probability times 16 widened positions or dims), so no
// horizontal sums; the bf16 pairs widen as (even, odd) lanes, and the results are put back in order once per block.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "isa_target.h"
#include "tessera/attention.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512)

namespace tessera {
namespace {

constexpr int kKeys = 32;          // positions per key block (one 512-bit load of bf16 per head dim)
constexpr int kRowsPerTask = 128;  // query rows (tokens x the g heads of one KV head) per task, about

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

// exp(x) for x <= 0; below -87 (and -inf) gives 0, so no denormal probability ever reaches the value products (it
// would weigh < 2^-125 of the row's largest). Cody-Waite reduction by ln 2, degree-6 Taylor polynomial: ~2 ulp.
inline __m512 exp_nonpositive(__m512 x) {
  const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(kept, _mm512_scalef_ps(p, n));
}

// s[r][0..32) = Q[r] . K[key] for RB rows and the nk (<= 32) keys of one tile ([hd][32] bf16); keys >= nk are read as 0.
template <int RB>
void block_scores(const float* Q, int64_t hd, const uint16_t* tile, int nk, float* s) {
  __m512 a0[RB], a1[RB];
  for (int r = 0; r < RB; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
  const __mmask32 keys = nk >= kKeys ? __mmask32(0xffffffffu) : __mmask32((1u << nk) - 1u);
  for (int64_t d = 0; d < hd; ++d) {
    __m512 even, odd;
    widen_pairs(_mm512_maskz_loadu_epi16(keys, tile + d * kKeys), even, odd);
    for (int r = 0; r < RB; ++r) {
      const __m512 q = _mm512_set1_ps(Q[r * hd + d]);
      a0[r] = _mm512_fmadd_ps(q, even, a0[r]);
      a1[r] = _mm512_fmadd_ps(q, odd, a1[r]);
    }
  }
  for (int r = 0; r < RB; ++r) {
    __m512 first, second;
    interleave(a0[r], a1[r], first, second);
    _mm512_storeu_ps(s + r * kKeys, first);
    _mm512_storeu_ps(s + r * kKeys + 16, second);
  }
}

// acc[r][dims of NC chunks of 32] = alpha[r] * acc + sum_j p[r][j] * V[j], over the nk keys of the block. acc keeps
// each 32-dim chunk as (even, odd) lanes.
template <int RB, int NC>
void block_values(const float* p, const uint16_t* v, int64_t hd, int nk, const float* alpha, float* acc) {
  __m512 A[RB][2 * NC];
  for (int r = 0; r < RB; ++r) {
    const __m512 al = _mm512_set1_ps(alpha[r]);
    for (int c = 0; c < 2 * NC; ++c) A[r][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * hd + c * 16), al);
  }
  for (int j = 0; j < nk; ++j) {
    __m512 E[NC], O[NC];
    for (int c = 0; c < NC; ++c) widen_pairs(_mm512_loadu_si512(v + j * hd + c * 32), E[c], O[c]);
    for (int r = 0; r < RB; ++r) {
      const __m512 w = _mm512_set1_ps(p[r * kKeys + j]);
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
void values_rows(const float* p, const uint16_t* v, int64_t hd, int nk, const float* alpha, float* acc) {
  int64_t c0 = 0;
  for (; c0 + 64 <= hd; c0 += 64) block_values<RB, 2>(p, v + c0, hd, nk, alpha, acc + c0);
  if (c0 < hd) block_values<RB, 1>(p, v + c0, hd, nk, alpha, acc + c0);
}

void scores_rows(const float* Q, int64_t hd, const uint16_t* tile, int nk, float* s, int64_t rows) {
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) block_scores<8>(Q + r * hd, hd, tile, nk, s + r * kKeys);
  switch (rows - r) {
    case 7: block_scores<7>(Q + r * hd, hd, tile, nk, s + r * kKeys); break;
    case 6: block_scores<6>(Q + r * hd, hd, tile, nk, s + r * kKeys); break;
    case 5: block_scores<5>(Q + r * hd, hd, tile, nk, s + r * kKeys); break;
    case 4: block_scores<4>(Q + r * hd, hd, tile, nk, s + r * kKeys); break;
    case 3: block_scores<3>(Q + r * hd, hd, tile, nk, s + r * kKeys); break;
    case 2: block_scores<2>(Q + r * hd, hd, tile, nk, s + r * kKeys); break;
    case 1: block_scores<1>(Q + r * hd, hd, tile, nk, s + r * kKeys); break;
    default: break;
  }
}

void values_all(const float* p, const uint16_t* v, int64_t hd, int nk, const float* alpha, float* acc, int64_t rows) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) values_rows<4>(p + r * kKeys, v, hd, nk, alpha + r, acc + r * hd);
  switch (rows - r) {
    case 3: values_rows<3>(p + r * kKeys, v, hd, nk, alpha + r, acc + r * hd); break;
    case 2: values_rows<2>(p + r * kKeys, v, hd, nk, alpha + r, acc + r * hd); break;
    case 1: values_rows<1>(p + r * kKeys, v, hd, nk, alpha + r, acc + r * hd); break;
    default: break;
  }
}

// Online softmax over one block: s[r] (scores, keys >= visible[r] ignored) becomes p[r] = exp(s - m_new), m and l
// are updated, alpha[r] = exp(m_old - m_new) rescales the row's accumulator.
void block_softmax(float* s, const int64_t* visible, int64_t rows, float* m, float* l, float* alpha) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * kKeys;
    const int64_t n = std::min<int64_t>(visible[r], kKeys);
    if (n <= 0) {  // the row sees none of these keys: p = 0, accumulator unchanged
      _mm512_storeu_ps(row, _mm512_setzero_ps());
      _mm512_storeu_ps(row + 16, _mm512_setzero_ps());
      alpha[r] = 1.0f;
      continue;
    }
    const uint32_t bits = n >= kKeys ? 0xffffffffu : (1u << n) - 1u;
    const __m512 x0 = _mm512_mask_blend_ps(__mmask16(bits), ninf, _mm512_loadu_ps(row));
    const __m512 x1 = _mm512_mask_blend_ps(__mmask16(bits >> 16), ninf, _mm512_loadu_ps(row + 16));
    const float mx = _mm512_reduce_max_ps(_mm512_max_ps(x0, x1));
    const float m_new = std::max(m[r], mx);
    const __m512 mn = _mm512_set1_ps(m_new);
    const __m512 p0 = exp_nonpositive(_mm512_sub_ps(x0, mn)), p1 = exp_nonpositive(_mm512_sub_ps(x1, mn));
    alpha[r] = std::exp(m[r] - m_new);  // m[r] = -inf before the first block: 0 (the accumulator is 0 anyway)
    l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
    m[r] = m_new;
    _mm512_storeu_ps(row, p0);
    _mm512_storeu_ps(row + 16, p1);
  }
}

struct Scratch {
  std::vector<float> q, acc, s, m, l, alpha;
  std::vector<int64_t> visible;
};

}  // namespace

void attention_isa::attention_avx512(const AttentionArgs& a, ThreadPool& pool) {
  const int64_t g = a.nh / a.nkv, hd = a.hd;
  const int64_t tokens_per_task = std::max<int64_t>(1, kRowsPerTask / g);
  const int64_t blocks = (a.T + tokens_per_task - 1) / tokens_per_task, tasks = blocks * a.nkv;
  pool.parallel_for(tasks, [&](int64_t task, int) {
    thread_local Scratch w;
    const int64_t qb = blocks - 1 - task / a.nkv, h = task % a.nkv;  // the longest (last) query blocks first
    const int64_t t0 = qb * tokens_per_task, t1 = std::min(a.T, t0 + tokens_per_task), rows = (t1 - t0) * g;
    w.q.resize(size_t(rows * hd));
    w.acc.assign(size_t(rows * hd), 0.0f);
    w.s.resize(size_t(rows * kKeys));
    w.m.assign(size_t(rows), -INFINITY);
    w.l.assign(size_t(rows), 0.0f);
    w.alpha.resize(size_t(rows));
    w.visible.resize(size_t(rows));
    for (int64_t t = t0; t < t1; ++t)  // row (t - t0) * g + j: token t, query head h * g + j
      for (int64_t j = 0; j < g; ++j) {
        const float* src = a.q + ((h * g + j) * a.T + t) * hd;
        float* dst = w.q.data() + ((t - t0) * g + j) * hd;
        for (int64_t i = 0; i < hd; ++i) dst[i] = src[i] * a.scale;
      }
    const uint16_t* kt = a.kt + h * ((a.C + kKeys - 1) / kKeys) * kKeys * hd;  // [ceil(C/32), hd, 32]
    const uint16_t* v = a.v + h * a.C * hd;    // [C, hd]
    const int64_t kend = a.start + t1;         // keys [0, kend) are seen by the block's last token
    std::vector<int64_t>& vis = w.visible;
    for (int64_t s0 = 0; s0 < kend; s0 += kKeys) {
      const int nk = int(std::min<int64_t>(kKeys, kend - s0));
      scores_rows(w.q.data(), hd, kt + s0 * hd, nk, w.s.data(), rows);
      for (int64_t r = 0; r < rows; ++r) vis[size_t(r)] = std::min<int64_t>(a.start + t0 + r / g + 1 - s0, nk);
      block_softmax(w.s.data(), vis.data(), rows, w.m.data(), w.l.data(), w.alpha.data());
      values_all(w.s.data(), v + s0 * hd, hd, nk, w.alpha.data(), w.acc.data(), rows);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = t0 + r / g, hq = h * g + r % g;
      const float* acc = w.acc.data() + r * hd;
      float* out = a.out + (t * a.nh + hq) * hd;
      const __m512 inv = _mm512_set1_ps(1.0f / w.l[size_t(r)]);
      for (int64_t c = 0; c < hd; c += 32) {
        __m512 first, second;
        interleave(_mm512_loadu_ps(acc + c), _mm512_loadu_ps(acc + c + 16), first, second);
        _mm512_storeu_ps(out + c, _mm512_mul_ps(first, inv));
        _mm512_storeu_ps(out + c + 16, _mm512_mul_ps(second, inv));
      }
    }
  });
}

}  // namespace tessera

TESSERA_ISA_END
