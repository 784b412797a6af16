// Causal grouped-query attention over a q8_0 KV cache (tessera/attention_q8.h), AVX-512 VNNI: both products on int8
// by vpdpbusd (64 byte products per instruction, four times the f32 FMA's rate), so a decode step reads the half-size
// cache at memory speed instead of being bound by widening it.
// - Scores: each scaled query row is quantized per block of 32 dims to int8 with an f32 scale (llama.cpp quantizes q
//   the same way to q8_0 against a q8_0 cache). vpdpbusd wants one operand unsigned: the keys' sign bit is flipped in
//   registers (k + 128), and 128 * sum(q block) is taken off the integer dot. Per block: int32 -> f32, times the
//   query's scale and the 16 keys' f16 scales, summed over the blocks. Keys come as stored, 16 per register.
// - Values: the probability of key j times the key's value scale for block b (w = p_j * dv_j,b >= 0) is quantized per
//   (row, block of 32 keys, block of 32 dims) to uint8 with the step (max_j p_j) * (max_j dv_j,b) / 255, and vpdpbusd
//   sums 4 keys at a time against the values stored as (dim, 4 positions). The softmax denominator sums the unrounded
//   probabilities. The rounding of w adds at most half a step per key and block: for the block's heaviest key, at
//   most 1/510 of its weight times the largest value scale, the size of the q8_0 values' own step (amax/254).
// The driver (tasks of one KV head x a block of query rows x a range of keys, key splits with a merge at decode,
// online softmax) follows attention_flash.inc's, whose helpers it shares.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "isa_target.h"
#include "tessera/attention.h"
#include "tessera/attention_q8.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_VNNI)

namespace tessera {
namespace {

#include "attention_flash.inc"

// Key blocks ahead whose K, V and scales are prefetched (into L2), spread over the block's steps. Zen 4, decode at 8k
// from memory, 2 threads: 2, 4, 8 and 16 blocks all gave 0.53-0.66 ms a layer (a busy machine; no distance stood out).
constexpr int64_t kQ8PrefetchBlocks = 4;

struct Q8Scratch {
  std::vector<int8_t> q8;      // [rows, hd] the quantized query rows
  std::vector<float> qd;       // [rows, nb] their scales
  std::vector<int32_t> qcorr;  // [rows, nb] 128 * sum of each block of q8
  std::vector<float> s;        // [rows, 32] scores, then probabilities (key order)
  std::vector<uint8_t> wq;     // [rows, nb, 32] p * value scale as uint8
  std::vector<float> wd;       // [rows, nb] their scales
  std::vector<float> acc, m, l, alpha;
  std::vector<float> mx, c;    // [rows] the block's largest score and exp(mx - m) (softmax_and_weights' phases)
  std::vector<int64_t> visible;
};

inline int32_t load4(const void* p) {
  int32_t x;
  std::memcpy(&x, p, 4);
  return x;
}

inline __m512 f16x16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// s[r][0..32) = q_r . key for RB rows and the 32 keys of one tile (keys >= nk hold anything; the softmax masks them).
// pf: the K tile of a block ahead (hd * 32 bytes), two lines a step, or null.
template <int RB>
void q8_scores(const int8_t* Q, const float* qd, const int32_t* corr, int64_t hd, const int8_t* tile,
               const uint16_t* ks, float* s, const char* pf) {
  const int64_t nb = hd / kQ8Block;
  const __m512i flip = _mm512_set1_epi8(int8_t(0x80));
  __m512 s0[RB], s1[RB];
  for (int r = 0; r < RB; ++r) s0[r] = s1[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i a0[RB], a1[RB];
    for (int r = 0; r < RB; ++r) a0[r] = a1[r] = _mm512_setzero_si512();
    for (int gi = 0; gi < 8; ++gi) {
      const int8_t* src = tile + (b * 8 + gi) * 128;  // 4 dims x 32 keys
      const __m512i k0 = _mm512_xor_si512(_mm512_loadu_si512(src), flip);
      const __m512i k1 = _mm512_xor_si512(_mm512_loadu_si512(src + 64), flip);
      if (pf) {
        _mm_prefetch(pf + (b * 8 + gi) * 128, _MM_HINT_T1);
        _mm_prefetch(pf + (b * 8 + gi) * 128 + 64, _MM_HINT_T1);
      }
      for (int r = 0; r < RB; ++r) {
        const __m512i qb = _mm512_set1_epi32(load4(Q + r * hd + b * kQ8Block + gi * 4));
        a0[r] = _mm512_dpbusd_epi32(a0[r], k0, qb);
        a1[r] = _mm512_dpbusd_epi32(a1[r], k1, qb);
      }
    }
    const __m512 dk0 = f16x16(ks + b * kQ8Block), dk1 = f16x16(ks + b * kQ8Block + 16);
    for (int r = 0; r < RB; ++r) {
      const __m512i c = _mm512_set1_epi32(corr[r * nb + b]);
      const __m512 f = _mm512_set1_ps(qd[r * nb + b]);
      s0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a0[r], c)), _mm512_mul_ps(dk0, f), s0[r]);
      s1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a1[r], c)), _mm512_mul_ps(dk1, f), s1[r]);
    }
  }
  for (int r = 0; r < RB; ++r) {
    _mm512_storeu_ps(s + r * kKeys, s0[r]);
    _mm512_storeu_ps(s + r * kKeys + 16, s1[r]);
  }
}

// acc[r][0..hd) = alpha[r] * acc + sum_j wq[r][b][j] * wd[r][b] * v[j] over the tile's 32 keys (weights of keys past
// the row's visible ones are 0). v: the tile, [8 groups of 4 keys][hd][4]. pf: the V tile of a block ahead, or null.
template <int RB>
void q8_values(const uint8_t* wq, const float* wd, const float* alpha, int64_t hd, const int8_t* v, float* acc,
               const char* pf) {
  const int64_t nb = hd / kQ8Block;
  for (int64_t b = 0; b < nb; ++b) {
    __m512i a0[RB], a1[RB];
    for (int r = 0; r < RB; ++r) a0[r] = a1[r] = _mm512_setzero_si512();
    for (int gi = 0; gi < 8; ++gi) {
      const int8_t* src = v + (gi * hd + b * kQ8Block) * 4;  // 32 dims x 4 keys
      const __m512i v0 = _mm512_loadu_si512(src), v1 = _mm512_loadu_si512(src + 64);
      if (pf) {
        _mm_prefetch(pf + (gi * hd + b * kQ8Block) * 4, _MM_HINT_T1);
        _mm_prefetch(pf + (gi * hd + b * kQ8Block) * 4 + 64, _MM_HINT_T1);
      }
      for (int r = 0; r < RB; ++r) {
        const __m512i w = _mm512_set1_epi32(load4(wq + (r * nb + b) * kKeys + gi * 4));
        a0[r] = _mm512_dpbusd_epi32(a0[r], w, v0);
        a1[r] = _mm512_dpbusd_epi32(a1[r], w, v1);
      }
    }
    for (int r = 0; r < RB; ++r) {
      const __m512 f = _mm512_set1_ps(wd[r * nb + b]), al = _mm512_set1_ps(alpha[r]);
      float* A = acc + r * hd + b * kQ8Block;
      _mm512_storeu_ps(A, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0[r]), f, _mm512_mul_ps(_mm512_loadu_ps(A), al)));
      _mm512_storeu_ps(A + 16,
                       _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[r]), f, _mm512_mul_ps(_mm512_loadu_ps(A + 16), al)));
    }
  }
}

// Rows of queries t0..t1 of KV head h, scaled and quantized per block of 32 dims (row (t - t0) * g + j: token t,
// query head h * g + j).
void load_queries(const AttentionQ8Args& a, int64_t h, int64_t t0, int64_t t1, int64_t g, Q8Scratch& w) {
  const int64_t hd = a.hd, nb = hd / kQ8Block;
  float x[kQ8Block];
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t j = 0; j < g; ++j) {
      const int64_t r = (t - t0) * g + j;
      const float* src = a.q + ((h * g + j) * a.T + t) * hd;
      for (int64_t b = 0; b < nb; ++b) {
        float amax = 0.0f;
        for (int i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(x[i] = src[b * kQ8Block + i] * a.scale));
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < kQ8Block; ++i) {
          const int8_t qi = int8_t(std::clamp(std::nearbyint(x[i] * id), -127.0f, 127.0f));
          w.q8[size_t(r * hd + b * kQ8Block + i)] = qi;
          sum += qi;
        }
        w.qd[size_t(r * nb + b)] = d;
        w.qcorr[size_t(r * nb + b)] = 128 * sum;
      }
    }
}

// Online softmax over one block (scores in key order, keys >= visible[r] ignored), then each row's weights
// w_j,b = p_j * dv_j,b quantized to uint8 per block b of 32 dims, with the step (max_j p_j) * (max_j dv_j,b) / 255:
// the value scales' maxima and dv / max are taken once per key block for all rows, so a row pays one max of its p.
// vs: the tile's value scales [nb][32]; nk: keys of the tile that exist (the others may hold any bits, even NaN).
void softmax_and_weights(Q8Scratch& w, int64_t rows, int64_t nb, const uint16_t* vs, int nk) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i sixteen = _mm512_set1_epi32(16);
  const __mmask16 in0 = _mm512_cmplt_epi32_mask(lanes, _mm512_set1_epi32(nk));
  const __mmask16 in1 = _mm512_cmplt_epi32_mask(_mm512_add_epi32(lanes, sixteen), _mm512_set1_epi32(nk));
  __m512 dvn[2 * 16];  // per b: dv_j,b * 255 / max_j dv_j,b (keys 0-15, 16-31); nb <= 16
  float dvs[16];       // per b: max_j dv_j,b / 255
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 d0 = _mm512_maskz_mov_ps(in0, f16x16(vs + b * kKeys));
    const __m512 d1 = _mm512_maskz_mov_ps(in1, f16x16(vs + b * kKeys + 16));
    const float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(d0), _mm512_abs_ps(d1)));
    const __m512 f = _mm512_set1_ps(mx > 0.0f ? 255.0f / mx : 0.0f);
    dvn[2 * b] = _mm512_mul_ps(d0, f);
    dvn[2 * b + 1] = _mm512_mul_ps(d1, f);
    dvs[b] = mx / 255.0f;
  }
  // In phases over the rows, each a loop whose iterations are independent, so that the out-of-order core overlaps
  // the rows' long dependency chains (reductions, exp): one row after another measured ~150 cycles a row.
  // (1) each row's block maximum (-inf for a row that sees none of these keys), the scores masked in place;
  float* mx = w.mx.data();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = w.s.data() + r * kKeys;
    const __m512i seen = _mm512_set1_epi32(int(std::min<int64_t>(w.visible[size_t(r)], kKeys)));
    const __m512 x0 = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(lanes, seen), ninf, _mm512_loadu_ps(row));
    const __m512 x1 = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(_mm512_add_epi32(lanes, sixteen), seen), ninf,
                                           _mm512_loadu_ps(row + 16));
    _mm512_storeu_ps(row, x0);
    _mm512_storeu_ps(row + 16, x1);
    mx[r] = _mm512_reduce_max_ps(_mm512_max_ps(x0, x1));
  }
  // (2) 16 rows at a time: m_new = max(m, mx), alpha = exp(m - m_new) rescales the accumulator, c = exp(mx - m_new)
  // is the block's largest probability (every row's probabilities are c * exp(x - mx)); a row that sees no key keeps
  // alpha 1 and gets c 0.
  float* cs = w.c.data();
  for (int64_t r = 0; r < rows; r += 16) {
    const __mmask16 in = rows - r >= 16 ? __mmask16(0xffff) : __mmask16((1u << (rows - r)) - 1u);
    const __m512 vmx = _mm512_mask_loadu_ps(ninf, in, mx + r), vm = _mm512_mask_loadu_ps(ninf, in, w.m.data() + r);
    const __mmask16 sees = _mm512_cmp_ps_mask(vmx, ninf, _CMP_NEQ_OQ);
    const __m512 mn = _mm512_max_ps(vm, vmx);
    const __m512 alpha = _mm512_mask_blend_ps(sees, _mm512_set1_ps(1.0f), exp_nonpositive(_mm512_sub_ps(vm, mn)));
    const __m512 c = _mm512_maskz_mov_ps(sees, exp_nonpositive(_mm512_sub_ps(vmx, mn)));
    _mm512_mask_storeu_ps(w.alpha.data() + r, in, alpha);
    _mm512_mask_storeu_ps(cs + r, in, c);
    _mm512_mask_storeu_ps(w.m.data() + r, in, _mm512_mask_blend_ps(sees, vm, mn));
  }
  // (3) e = exp(x - mx) (largest exactly 1), l += c * sum(e), and the weights c * e_j * dv_j,b as uint8 e_j * dvn_b
  // with the step c * dvs_b.
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w.s.data() + r * kKeys;
    uint8_t* wq = w.wq.data() + r * nb * kKeys;
    float* wd = w.wd.data() + r * nb;
    const float c = cs[r];
    if (!(c > 0.0f)) {  // sees none of these keys (or all of them weigh < e^-87 of the largest): weights 0
      w.l[size_t(r)] *= w.alpha[size_t(r)];
      std::memset(wq, 0, size_t(nb * kKeys));
      std::fill(wd, wd + nb, 0.0f);
      continue;
    }
    const __m512 top = _mm512_set1_ps(mx[r]);
    const __m512 e0 = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row), top));  // masked keys: exp(-inf) = 0
    const __m512 e1 = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + 16), top));
    w.l[size_t(r)] = w.l[size_t(r)] * w.alpha[size_t(r)] + c * _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
    for (int64_t b = 0; b < nb; ++b) {  // e * dvn in [0, 255]: rounded to nearest, saturated (rounding can add ulps)
      const __m512i u0 = _mm512_cvtps_epu32(_mm512_mul_ps(e0, dvn[2 * b]));
      const __m512i u1 = _mm512_cvtps_epu32(_mm512_mul_ps(e1, dvn[2 * b + 1]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(wq + b * kKeys), _mm512_cvtusepi32_epi8(u0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(wq + b * kKeys + 16), _mm512_cvtusepi32_epi8(u1));
      wd[b] = c * dvs[b];
    }
  }
}

void q8_flash_attention(const AttentionQ8Args& a, ThreadPool& pool) {
  const int64_t g = a.nh / a.nkv, hd = a.hd, nb = hd / kQ8Block, tiles = a.C / kQ8Block;
  const int64_t tokens_per_task = std::max<int64_t>(1, kRowsPerTask / g);
  const int64_t blocks = (a.T + tokens_per_task - 1) / tokens_per_task, units = blocks * a.nkv;
  // Key ranges: whole key blocks, at least kMinSplitBlocks each, until there are kTasksPerThread tasks per thread.
  const int64_t key_blocks = (a.start + a.T + kKeys - 1) / kKeys;
  const int64_t wanted = (int64_t(kTasksPerThread) * pool.size() + units - 1) / units;
  int64_t splits = std::max<int64_t>(1, std::min(wanted, key_blocks / kMinSplitBlocks));
  const int64_t blocks_per_split = (key_blocks + splits - 1) / splits;
  splits = (key_blocks + blocks_per_split - 1) / blocks_per_split;
  const int64_t max_rows = std::min(a.T, tokens_per_task) * g, slot = max_rows * (hd + 2);  // partial: m, l, acc
  thread_local std::vector<float> partials;  // [units, splits, slot], only when the keys are split
  if (splits > 1) partials.resize(size_t(units * splits * slot));
  float* const parts = partials.data();

  pool.parallel_for(units * splits, [&](int64_t task, int) {
    thread_local Q8Scratch w;
    const int64_t unit = task / splits, split = task % splits;
    const int64_t qb = blocks - 1 - unit / a.nkv, h = unit % a.nkv;  // the longest (last) query blocks first
    const int64_t t0 = qb * tokens_per_task, t1 = std::min(a.T, t0 + tokens_per_task), rows = (t1 - t0) * g;
    w.q8.resize(size_t(rows * hd));
    w.qd.resize(size_t(rows * nb));
    w.qcorr.resize(size_t(rows * nb));
    w.s.resize(size_t(rows * kKeys));
    w.wq.resize(size_t(rows * nb * kKeys));
    w.wd.resize(size_t(rows * nb));
    w.acc.assign(size_t(rows * hd), 0.0f);
    w.m.assign(size_t(rows), -INFINITY);
    w.l.assign(size_t(rows), 0.0f);
    w.alpha.resize(size_t(rows));
    w.mx.resize(size_t(rows));
    w.c.resize(size_t(rows));
    w.visible.resize(size_t(rows));
    load_queries(a, h, t0, t1, g, w);
    const int64_t kend = std::min(a.start + t1, (split + 1) * blocks_per_split * kKeys);  // causal end of the range
    for (int64_t s0 = split * blocks_per_split * kKeys; s0 < kend; s0 += kKeys) {
      const int nk = int(std::min<int64_t>(kKeys, kend - s0));
      const int64_t tile = h * tiles + s0 / kKeys;
      const int8_t* kt = a.k + tile * hd * kKeys;  // [hd/4][32][4]
      const int8_t* vt = a.v + tile * hd * kKeys;  // [8][hd][4]
      const uint16_t* kst = a.ks + tile * nb * kKeys;
      const uint16_t* vst = a.vs + tile * nb * kKeys;
      const bool fetch = s0 + kQ8PrefetchBlocks * kKeys < kend;  // fetched a few lines a step while this block computes
      const char* pfk = fetch ? reinterpret_cast<const char*>(kt + kQ8PrefetchBlocks * hd * kKeys) : nullptr;
      const char* pfv = fetch ? reinterpret_cast<const char*>(vt + kQ8PrefetchBlocks * hd * kKeys) : nullptr;
      if (fetch)
        for (int64_t i = 0; i < nb * kKeys * 2; i += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(kst + kQ8PrefetchBlocks * nb * kKeys) + i, _MM_HINT_T1);
          _mm_prefetch(reinterpret_cast<const char*>(vst + kQ8PrefetchBlocks * nb * kKeys) + i, _MM_HINT_T1);
        }
      for_row_groups<4>(rows, [&](auto R, int64_t r) {
        q8_scores<R>(w.q8.data() + r * hd, w.qd.data() + r * nb, w.qcorr.data() + r * nb, hd, kt, kst,
                     w.s.data() + r * kKeys, r == 0 ? pfk : nullptr);
      });
      for (int64_t r = 0; r < rows; ++r)
        w.visible[size_t(r)] = std::min<int64_t>(a.start + t0 + r / g + 1 - s0, nk);
      softmax_and_weights(w, rows, nb, vst, nk);
      for_row_groups<8>(rows, [&](auto R, int64_t r) {
        q8_values<R>(w.wq.data() + r * nb * kKeys, w.wd.data() + r * nb, w.alpha.data() + r, hd, vt,
                     w.acc.data() + r * hd, r == 0 ? pfv : nullptr);
      });
    }
    if (splits > 1) {  // leave the partial for the merge
      float* p = parts + task * slot;
      std::copy(w.m.begin(), w.m.end(), p);
      std::copy(w.l.begin(), w.l.end(), p + rows);
      std::copy(w.acc.begin(), w.acc.end(), p + 2 * rows);
      return;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0f / w.l[size_t(r)];
      float* out = a.out + ((t0 + r / g) * a.nh + h * g + r % g) * hd;
      for (int64_t i = 0; i < hd; ++i) out[i] = w.acc[size_t(r * hd + i)] * inv;
    }
  });
  if (splits == 1) return;

  // Merge: out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s with M the largest m_s (a range the row does not
  // reach has m = -inf, l = 0, acc = 0 and weighs 0; every row sees key 0, so M is finite).
  pool.parallel_for(units, [&](int64_t unit, int) {
    thread_local std::vector<float> scale;
    const int64_t qb = blocks - 1 - unit / a.nkv, h = unit % a.nkv;
    const int64_t t0 = qb * tokens_per_task, t1 = std::min(a.T, t0 + tokens_per_task), rows = (t1 - t0) * g;
    const float* p = parts + unit * splits * slot;
    scale.resize(size_t(splits));
    for (int64_t r = 0; r < rows; ++r) {
      float M = -INFINITY;
      for (int64_t s = 0; s < splits; ++s) M = std::max(M, p[s * slot + r]);
      float l = 0.0f;
      for (int64_t s = 0; s < splits; ++s) {
        scale[size_t(s)] = std::exp(p[s * slot + r] - M);
        l += scale[size_t(s)] * p[s * slot + rows + r];
      }
      float* out = a.out + ((t0 + r / g) * a.nh + h * g + r % g) * hd;
      for (int64_t i = 0; i < hd; i += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t s = 0; s < splits; ++s)
          acc = _mm512_fmadd_ps(_mm512_set1_ps(scale[size_t(s)]), _mm512_loadu_ps(p + s * slot + 2 * rows + r * hd + i), acc);
        _mm512_storeu_ps(out + i, _mm512_mul_ps(acc, _mm512_set1_ps(1.0f / l)));
      }
    }
  });
}

}  // namespace

void attention_isa::attention_q8_avx512_vnni(const AttentionQ8Args& a, ThreadPool& pool) { q8_flash_attention(a, pool); }

}  // namespace tessera

TESSERA_ISA_END
