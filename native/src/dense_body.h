// The dense mat-vec body shared by the ISA translation units (dense_avx512.cpp, dense_avx2.cpp), templated on a
// vector policy V: W f32 lanes; a weight block is B = 2W 16-bit values widened into two f32 vectors (w0, w1), matched
// by two vectors of the prepared activations (x0, x1). bf16 blocks are read as W 32-bit pairs (even element = low half
// shifted up, odd = high half masked), so x is prepared deinterleaved per block; f16 blocks convert W + W values in
// order, so x is prepared as is. x is zero-padded to whole blocks; a row tail is copied into a zero-filled block.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tessera/dense.h"

namespace tessera {
namespace {  // file-local in each ISA file (isa_target.h): no shared weak copies
namespace dense_body {

// xp[t][Kp]: x[t] in the block order the weight loader produces, zero-padded to Kp = whole blocks.
inline std::vector<float> prepare_x(const DenseArgs& a, int B, int64_t Kp) {
  std::vector<float> xp(size_t(a.T * Kp), 0.0f);
  const int W = B / 2;
  for (int64_t t = 0; t < a.T; ++t) {
    const float* x = a.x + t * a.K;
    float* dst = xp.data() + t * Kp;
    if (a.type == WeightType::BF16) {
      for (int64_t k = 0; k < a.K; ++k) {
        int64_t blk = k / B, j = k % B;
        dst[blk * B + (j % 2) * W + j / 2] = x[k];  // even elements first, then odd
      }
    } else {
      std::memcpy(dst, x, size_t(a.K) * sizeof(float));
    }
  }
  return xp;
}

#ifndef TESSERA_DENSE_PREFETCH
#define TESSERA_DENSE_PREFETCH 1024
#endif
constexpr int64_t kPrefetch = TESSERA_DENSE_PREFETCH / 2;  // elements ahead (a prefetch past the end never faults)

// R rows x NT tokens: out[t * N + r] = sum_k w[r * K + k] * x[t][k]. w points at the first row, xp at token t0,
// out at (t0, row0).
template <class V, bool BF16, int R, int NT>
inline void tile(const uint16_t* w, int64_t K, const float* xp, int64_t Kp, float* out, int64_t N) {
  using f = typename V::f;
  constexpr int W = V::W, B = 2 * W;
  f acc[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = V::zero();
  auto block = [&](const uint16_t* const* rows, int64_t off) {  // rows[r] + off: B weights; xp + off: B activations
    f x0[NT], x1[NT];
    for (int t = 0; t < NT; ++t) {
      x0[t] = V::load(xp + t * Kp + off);
      x1[t] = V::load(xp + t * Kp + off + W);
    }
    for (int r = 0; r < R; ++r) {
      f w0, w1;
      if (BF16) V::widen_bf16(rows[r], w0, w1); else V::widen_f16(rows[r], w0, w1);
      for (int t = 0; t < NT; ++t) {
        acc[r][t] = V::fma(w0, x0[t], acc[r][t]);
        acc[r][t] = V::fma(w1, x1[t], acc[r][t]);
      }
    }
  };
  const int64_t full = K / B * B;
  const uint16_t* rows[R];
  for (int64_t off = 0; off < full; off += B) {
    for (int r = 0; r < R; ++r) {
      rows[r] = w + r * K + off;
      __builtin_prefetch(rows[r] + kPrefetch, 0, 0);  // R interleaved streams: help the hardware prefetcher
    }
    block(rows, off);
  }
  if (full < K) {
    alignas(64) uint16_t tail[R][B];
    std::memset(tail, 0, sizeof(tail));
    for (int r = 0; r < R; ++r) {
      std::memcpy(tail[r], w + r * K + full, size_t(K - full) * sizeof(uint16_t));
      rows[r] = tail[r];
    }
    block(rows, full);
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) out[t * N + r] = V::hsum(acc[r][t]);
}

// One token (decode): out[row] = sum_k w[row * K + k] * x[k], a row at a time as one sequential stream, four
// independent accumulators over consecutive blocks, no software prefetch. Each thread then reads one stream, which the
// hardware prefetcher follows best: on Zen 4 (bf16 lm_head 151936 x 2048) 16.2 GB/s on one core and 30.9 on two,
// against 9.2 and 16-19 for the 4-row interleaved tile with prefetch (docs/BENCHMARKS.md, "bf16 mat-vec at decode").
template <class V, bool BF16>
inline float row_dot(const uint16_t* w, int64_t K, const float* xp) {
  using f = typename V::f;
  constexpr int W = V::W, B = 2 * W;
  f acc[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
  auto block = [&](const uint16_t* p, int64_t off, f& sum) {  // B weights at p, B activations at xp + off
    f w0, w1;
    if (BF16) V::widen_bf16(p, w0, w1); else V::widen_f16(p, w0, w1);
    sum = V::fma(w0, V::load(xp + off), sum);
    sum = V::fma(w1, V::load(xp + off + W), sum);
  };
  const int64_t full = K / B * B;
  int64_t off = 0;
  for (; off + 4 * B <= full; off += 4 * B)
    for (int j = 0; j < 4; ++j) block(w + off + j * B, off + j * B, acc[j]);
  for (; off < full; off += B) block(w + off, off, acc[0]);
  if (full < K) {
    alignas(64) uint16_t tail[B];
    std::memset(tail, 0, sizeof(tail));
    std::memcpy(tail, w + full, size_t(K - full) * sizeof(uint16_t));
    block(tail, full, acc[1]);
  }
  return V::hsum(V::add(V::add(acc[0], acc[1]), V::add(acc[2], acc[3])));
}

// Rows [r0, r1): for each block of R rows, every group of G tokens passes over it while it is in L1; one token runs
// row_dot a row at a time.
template <class V, bool BF16, int R, int G>
void rows_range(const DenseArgs& a, const float* xp, int64_t Kp, int64_t r0, int64_t r1) {
  static_assert(G >= 1 && G <= 4, "token groups of 1..4");
  if (a.T == 1) {
    for (int64_t row = r0; row < r1; ++row) a.out[row] = row_dot<V, BF16>(a.w + row * a.K, a.K, xp);
    return;
  }
  auto group = [&](auto rows_c, const uint16_t* w, int64_t row) {
    constexpr int RR = decltype(rows_c)::value;
    for (int64_t t0 = 0; t0 < a.T; t0 += G) {
      const float* x = xp + t0 * Kp;
      float* out = a.out + t0 * a.N + row;
      switch (std::min<int64_t>(G, a.T - t0)) {
        case 1: tile<V, BF16, RR, 1>(w, a.K, x, Kp, out, a.N); break;
        case 2: if constexpr (G >= 2) tile<V, BF16, RR, 2>(w, a.K, x, Kp, out, a.N); break;
        case 3: if constexpr (G >= 3) tile<V, BF16, RR, 3>(w, a.K, x, Kp, out, a.N); break;
        default: if constexpr (G >= 4) tile<V, BF16, RR, 4>(w, a.K, x, Kp, out, a.N); break;
      }
    }
  };
  int64_t row = r0;
  for (; row + R <= r1; row += R) group(std::integral_constant<int, R>{}, a.w + row * a.K, row);
  for (; row < r1; ++row) group(std::integral_constant<int, 1>{}, a.w + row * a.K, row);
}

// Splits rows over the pool in contiguous, R-aligned ranges; a small matrix runs on the caller alone.
template <class V, int R, int G>
void matvec(const DenseArgs& a, ThreadPool& pool) {
  constexpr int B = 2 * V::W;
  const int64_t Kp = (a.K + B - 1) / B * B;
  std::vector<float> xp = prepare_x(a, B, Kp);
  auto run = [&](int64_t r0, int64_t r1) {
    if (r0 >= r1) return;
    if (a.type == WeightType::BF16) rows_range<V, true, R, G>(a, xp.data(), Kp, r0, r1);
    else rows_range<V, false, R, G>(a, xp.data(), Kp, r0, r1);
  };
  const int64_t bytes = a.N * a.K * 2;
  if (pool.size() == 1 || bytes < (int64_t(256) << 10)) {
    run(0, a.N);
    return;
  }
  pool.run([&](int ith, int nth) {
    int64_t per = (a.N + nth - 1) / nth;
    per = (per + R - 1) / R * R;
    run(std::min<int64_t>(a.N, ith * per), std::min<int64_t>(a.N, (ith + 1) * per));
  });
}

// T = 1 over several matrices with one x and one K (dense.h: dense_matvec_multi): the rows of all parts as one range
// [0, sum N), split over the pool in contiguous ranges, each row by row_dot as matvec runs it at T = 1.
template <class V>
void matvec_multi(const DenseMatvecPart* parts, int n, const float* x, int64_t K, ThreadPool& pool) {
  constexpr int B = 2 * V::W;
  const int64_t Kp = (K + B - 1) / B * B;
  bool any_bf16 = false, any_f16 = false;
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) {
    (parts[i].type == WeightType::BF16 ? any_bf16 : any_f16) = true;
    rows += parts[i].N;
  }
  std::vector<float> xb, xf;  // x prepared for bf16 rows (deinterleaved per block) and for f16 rows (as is)
  if (any_bf16) xb = prepare_x(DenseArgs{WeightType::BF16, nullptr, 0, K, 1, x, nullptr}, B, Kp);
  if (any_f16) xf = prepare_x(DenseArgs{WeightType::F16, nullptr, 0, K, 1, x, nullptr}, B, Kp);
  auto run = [&](int64_t r0, int64_t r1) {  // global rows [r0, r1)
    int64_t base = 0;
    for (int i = 0; i < n && base < r1; base += parts[i].N, ++i) {
      const DenseMatvecPart& p = parts[i];
      const int64_t a = std::max<int64_t>(r0, base) - base, b = std::min<int64_t>(r1, base + p.N) - base;
      if (p.type == WeightType::BF16)
        for (int64_t row = a; row < b; ++row) p.out[row] = row_dot<V, true>(p.w + row * K, K, xb.data());
      else
        for (int64_t row = a; row < b; ++row) p.out[row] = row_dot<V, false>(p.w + row * K, K, xf.data());
    }
  };
  if (pool.size() == 1 || rows * K * 2 < (int64_t(256) << 10)) {
    run(0, rows);
    return;
  }
  pool.run([&](int ith, int nth) {
    const int64_t per = (rows + nth - 1) / nth;
    run(std::min<int64_t>(rows, ith * per), std::min<int64_t>(rows, (ith + 1) * per));
  });
}

// f32 rows (dense_matvec_f32_rows): out[r] = w[r] . x, each row summed exactly as the portable loop in dense.cpp sums
// it: 16 lanes, lane l adding w[j + l] * x[j + l] over j in steps of 16 (a rounded product, then a rounded sum: never
// a fused multiply-add), the K % 16 tail summed in order from 0, then the 16 lanes added to it in order. So the result
// is the same bits on every ISA. R rows at a time for independent chains; V::opaque keeps the compiler from fusing.
template <class V, int R>
inline void f32_block(const float* w, int64_t K, const float* x, float* out) {
  constexpr int NV = 16 / V::W;
  typename V::f acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = V::zero();
  int64_t j = 0;
  for (; j + 16 <= K; j += 16) {
    typename V::f xv[NV];
    for (int v = 0; v < NV; ++v) xv[v] = V::load(x + j + v * V::W);
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) {
        typename V::f p = V::mul(V::load(w + r * K + j + v * V::W), xv[v]);
        V::opaque(p);
        acc[r][v] = V::add(acc[r][v], p);
      }
  }
  for (int r = 0; r < R; ++r) {
    float s = 0.0f;
    for (int64_t i = j; i < K; ++i) {
      float p = w[r * K + i] * x[i];
      __asm__("" : "+x"(p));  // no fused multiply-add, as above
      s += p;
    }
    float lanes[16];
    for (int v = 0; v < NV; ++v) V::store(lanes + v * V::W, acc[r][v]);
    for (int l = 0; l < 16; ++l) s += lanes[l];
    out[r] = s;
  }
}

template <class V>
inline void f32_rows(const float* w, int64_t rows, int64_t K, const float* x, float* out) {
  int64_t n = 0;
  for (; n + 4 <= rows; n += 4) f32_block<V, 4>(w + n * K, K, x, out + n);
  for (; n < rows; ++n) f32_block<V, 1>(w + n * K, K, x, out + n);
}

}  // namespace dense_body
}  // namespace
}  // namespace tessera
