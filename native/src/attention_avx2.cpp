// Causal grouped-query attention over the bf16 KV cache, AVX2 + FMA: the kernel of CPUs without AVX-512, so that their
// decode runs the whole layer in one native call (decode_layer.cpp) as the AVX-512 ones do. f32 products.
//
// A task is one KV head x a block of query tokens (the g query heads of that KV head each) x a range of keys, as in
// attention_flash.inc (whose AVX-512 helpers this file cannot use): decode splits the keys into ranges, one task each
// (flash-decoding), and a merge rescales the partials to the common max. Per key block of 32 positions:
// - the K tile ([hd][32] bf16) widened once to f32 in the task's scratch, then scores for 2 query rows at a time
//   (4 x 8 keys in registers per row, each tile row loaded once for both);
// - an online softmax per row (a vector exp), the probabilities of keys a row does not see set to 0;
// - the values for up to 8 rows at a time, 8 dims per register: each V row widened once per 8 dims and used by every
//   row of the group (V rows past the block's last key are never read: they may hold anything).
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
#include "thread_scratch.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX2)

namespace tessera {
namespace {

#include "attention_avx2.inc"

constexpr int kValueRows = 8;           // rows per register group of the value products

inline __m256 bf16x8(const uint16_t* p) {  // 8 bf16 -> f32
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

struct Scratch2 {
  std::vector<float> q;    // [rows, hd] the task's query rows, scaled
  std::vector<float> kf;   // [hd, 32] the block's keys widened to f32
  std::vector<float> p;    // [rows, 32] scores, then probabilities
  std::vector<float> acc;  // [rows, hd] unnormalised outputs
  std::vector<float> m, l, alpha;
};

// p[r][0..32) = q_r . key j for the rows [r0, r0 + R) (R = 1 or 2).
template <int R>
void scores_rows(const Scratch2& w, int64_t r0, int64_t hd, float* p) {
  __m256 s[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) s[r][c] = _mm256_setzero_ps();
  for (int64_t d = 0; d < hd; ++d) {
    const float* kr = w.kf.data() + d * kKeys;
    const __m256 k0 = _mm256_loadu_ps(kr), k1 = _mm256_loadu_ps(kr + 8), k2 = _mm256_loadu_ps(kr + 16),
                 k3 = _mm256_loadu_ps(kr + 24);
    for (int r = 0; r < R; ++r) {
      const __m256 qv = _mm256_broadcast_ss(w.q.data() + (r0 + r) * hd + d);
      s[r][0] = _mm256_fmadd_ps(qv, k0, s[r][0]);
      s[r][1] = _mm256_fmadd_ps(qv, k1, s[r][1]);
      s[r][2] = _mm256_fmadd_ps(qv, k2, s[r][2]);
      s[r][3] = _mm256_fmadd_ps(qv, k3, s[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm256_storeu_ps(p + (r0 + r) * kKeys + 8 * c, s[r][c]);
}

// acc[r] = alpha[r] * acc[r] + sum_{j < nk} p[r][j] v[j] for the rows [r0, r0 + R), R <= kValueRows.
template <int R>
void values_rows(Scratch2& w, int64_t r0, int64_t hd, const uint16_t* v, int nk) {
  for (int64_t c = 0; c < hd; c += 8) {
    __m256 a[R];
    for (int r = 0; r < R; ++r)
      a[r] = _mm256_mul_ps(_mm256_loadu_ps(w.acc.data() + (r0 + r) * hd + c), _mm256_set1_ps(w.alpha[size_t(r0 + r)]));
    for (int j = 0; j < nk; ++j) {
      const __m256 vj = bf16x8(v + j * hd + c);
      for (int r = 0; r < R; ++r) a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(w.p.data() + (r0 + r) * kKeys + j), vj, a[r]);
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(w.acc.data() + (r0 + r) * hd + c, a[r]);
  }
}

template <int R>
void values_group(Scratch2& w, int64_t r0, int64_t left, int64_t hd, const uint16_t* v, int nk) {
  if constexpr (R >= 1) {
    if (left == R) values_rows<R>(w, r0, hd, v, nk);
    else values_group<R - 1>(w, r0, left, hd, v, nk);
  }
}

// Online softmax of row r over one block: keys [0, seen) of it count (seen <= 32), the others weigh 0.
void softmax_row(Scratch2& w, int64_t r, int64_t seen) {
  float* p = w.p.data() + r * kKeys;
  if (seen <= 0) {
    std::fill(p, p + kKeys, 0.0f);
    w.alpha[size_t(r)] = 1.0f;
    return;
  }
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 x[4], mx = ninf;
  for (int c = 0; c < 4; ++c) {
    const __m256i lane = _mm256_add_epi32(_mm256_set1_epi32(8 * c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int(seen)), lane));
    x[c] = _mm256_blendv_ps(ninf, _mm256_loadu_ps(p + 8 * c), in);
    mx = _mm256_max_ps(mx, x[c]);
  }
  float& m = w.m[size_t(r)];
  const float m_new = std::max(m, hmax8(mx));
  const __m256 mn = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int c = 0; c < 4; ++c) {
    const __m256 e = exp_nonpositive8(_mm256_sub_ps(x[c], mn));
    _mm256_storeu_ps(p + 8 * c, e);
    sum = _mm256_add_ps(sum, e);
  }
  const float alpha = m_new == m ? 1.0f : std::exp(m - m_new);  // m = -inf before the first block: 0
  w.alpha[size_t(r)] = alpha;
  w.l[size_t(r)] = w.l[size_t(r)] * alpha + hsum8(sum);
  m = m_new;
}

inline const float* query_row(const AttentionArgs& a, int64_t head, int64_t t) {
  return a.q + (a.q_token_major ? t * a.nh + head : head * a.T + t) * a.hd;
}

void flash_attention_avx2(const AttentionArgs& a, ThreadPool& pool) {
  const int64_t g = a.nh / a.nkv, hd = a.hd;
  const AttentionTasks tasks(a.T, a.nh, a.nkv, hd, a.start, pool.size(), kRowsPerTask, kKeys, kMinSplitBlocks,
                             kTasksPerThread);  // attention_tasks.h
  const int64_t units = tasks.units;
  const int64_t splits = tasks.splits, blocks_per_split = tasks.blocks_per_split, slot = tasks.slot;
  thread_local std::vector<float> partials_of_thread;
  std::vector<float>& partials = opaque_ref(partials_of_thread);  // [units, splits, slot] when the keys are split
  if (splits > 1) partials.resize(size_t(units * splits * slot));
  float* const parts = partials.data();
  const int64_t tiles = (a.C + kKeys - 1) / kKeys;

  pool.parallel_for(units * splits, [&](int64_t task, int) {
    thread_local Scratch2 scratch_of_thread;
    Scratch2& w = opaque_ref(scratch_of_thread);  // not the thread_local's name in the loops (thread_scratch.h)
    const AttentionTasks::Task tk = tasks.of_task(task);
    const int64_t split = tk.split, h = tk.h, t0 = tk.t0, t1 = tk.t1, rows = tk.rows;
    w.q.resize(size_t(rows * hd));
    w.kf.resize(size_t(hd * kKeys));
    w.p.resize(size_t(rows * kKeys));
    w.acc.assign(size_t(rows * hd), 0.0f);
    w.m.assign(size_t(rows), -INFINITY);
    w.l.assign(size_t(rows), 0.0f);
    w.alpha.resize(size_t(rows));
    for (int64_t t = t0; t < t1; ++t)  // row (t - t0) * g + j: token t, query head h * g + j
      for (int64_t j = 0; j < g; ++j) {
        const float* src = query_row(a, h * g + j, t);
        float* dst = w.q.data() + ((t - t0) * g + j) * hd;
        for (int64_t i = 0; i < hd; ++i) dst[i] = src[i] * a.scale;
      }
    const uint16_t* kt = a.kt + h * tiles * kKeys * hd;  // [tiles, hd, 32]
    const uint16_t* v = a.v + h * a.C * hd;              // [C, hd]
    const int64_t kend = std::min(a.start + t1, (split + 1) * blocks_per_split * kKeys);  // causal end of the range
    for (int64_t s0 = split * blocks_per_split * kKeys; s0 < kend; s0 += kKeys) {
      const int nk = int(std::min<int64_t>(kKeys, kend - s0));
      const uint16_t* tile = kt + s0 * hd;
      for (int64_t d = 0; d < hd; ++d)  // keys >= nk may hold anything: their scores are never used
        for (int c = 0; c < kKeys; c += 8) _mm256_storeu_ps(w.kf.data() + d * kKeys + c, bf16x8(tile + d * kKeys + c));
      int64_t r = 0;
      for (; r + 2 <= rows; r += 2) scores_rows<2>(w, r, hd, w.p.data());
      if (r < rows) scores_rows<1>(w, r, hd, w.p.data());
      for (int64_t t = 0, row = 0; t < t1 - t0; ++t) {
        const int64_t seen = std::clamp<int64_t>(a.start + t0 + t + 1 - s0, 0, nk);
        for (int64_t j = 0; j < g; ++j, ++row) softmax_row(w, row, seen);
      }
      for (int64_t r0 = 0; r0 < rows; r0 += kValueRows)
        values_group<kValueRows>(w, r0, std::min<int64_t>(kValueRows, rows - r0), hd, v + s0 * hd, nk);
    }
    if (splits > 1) {  // leave the partial for the merge
      float* p = parts + task * slot;
      std::copy(w.m.begin(), w.m.end(), p);
      std::copy(w.l.begin(), w.l.end(), p + rows);
      std::copy(w.acc.begin(), w.acc.end(), p + 2 * rows);
      return;
    }
    for (int64_t row = 0; row < rows; ++row) {
      const float inv = 1.0f / w.l[size_t(row)];
      float* out = a.out + ((t0 + row / g) * a.nh + h * g + row % g) * hd;
      for (int64_t i = 0; i < hd; ++i) out[i] = w.acc[size_t(row * hd + i)] * inv;
    }
  });
  if (splits == 1) return;

  merge_key_ranges8(tasks, parts, a.nh, hd, a.out, pool);  // attention_avx2.inc
}

}  // namespace

void attention_isa::attention_avx2(const AttentionArgs& a, ThreadPool& pool) { flash_attention_avx2(a, pool); }

}  // namespace tessera

TESSERA_ISA_END
