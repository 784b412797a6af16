// Dense GEMM for prefill on CPUs without avx512_bf16 (AVX2 + FMA + F16C): out[T, N] = x[T, K] . W[N, K]^T with W the
// stored bf16 or f16 matrix (row-major, read in place, never copied whole), each weight widened exactly to f32 and x
// kept in f32: exact products, f32 FMA sums. Until it, such a CPU ran a prefill's q/k/v/o projections through the
// mat-vec (dense_avx2.cpp: 4 rows x 2 tokens a tile, each weight widened again for every 2 tokens): half of a BF16
// file's prefill there, at ~67 GFLOP/s on two cores (docs/BENCHMARKS.md, session 21).
//
// Blocking (per pool task = one block of kRows = 64 output rows):
//   for each K block of kKc values: the block's 8 x 8 rows are widened and transposed into 8 f32 panels (panel b row k
//   = rows 8b .. 8b + 7 at k, 32 bytes) in a thread-local 64 KB buffer (L2), then every group of kMr = 6 tokens runs a
//   6 x 16 register tile (12 ymm accumulators) over each pair of panels: per k two panel loads, six broadcasts of x,
//   twelve FMAs. Each weight is read from memory once per call whatever T is; x is re-read once per row block.
// Summation order: out[t, n] sums its K values in order, one FMA each, the K blocks chained through out (the first
// block starts from zero). It depends only on row n and token t, never on T or on which tokens share a tile.
// Letters: T tokens, K inputs, N outputs.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dense_gemm_blocks.h"
#include "tessera/bf16.h"
#include "tessera/dense.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX2)
#include "avx2_transpose.h"  // after BEGIN: compiled for this file's ISA

namespace tessera {
namespace {
namespace dense_gemm_f32 {

constexpr int kPanels = 8;            // panels of 8 rows per task
constexpr int kRows = 8 * kPanels;    // rows per task
constexpr int kMr = 6;                // tokens per register tile
constexpr int64_t kKc = 256;          // K values per block: 8 panels x 256 x 32 B = 64 KB (L2)

// 8 consecutive weights of one row, widened exactly to f32.
inline __m256 widen8(WeightType type, const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (type == WeightType::F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float widen1(WeightType type, uint16_t v) { return type == WeightType::F16 ? _cvtsh_ss(v) : bf16_to_f32(v); }

// Rows n0 .. n0 + 7 (those at or past N: zero), K values k0 .. k0 + kc - 1 -> panel P [kc][8] f32.
void pack_panel(const DenseArgs& a, int64_t n0, int64_t k0, int64_t kc, float* P) {
  const uint16_t* rows[8];
  const int valid = int(std::min<int64_t>(8, a.N - n0));
  for (int r = 0; r < 8; ++r) rows[r] = r < valid ? a.w + (n0 + r) * a.K + k0 : nullptr;
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    __m256i v[8];  // f32 bits
    for (int r = 0; r < 8; ++r)
      v[r] = rows[r] ? _mm256_castps_si256(widen8(a.type, rows[r] + k)) : _mm256_setzero_si256();
    transpose8x32(v);
    for (int j = 0; j < 8; ++j) _mm256_store_si256(reinterpret_cast<__m256i*>(P + (k + j) * 8), v[j]);
  }
  for (; k < kc; ++k)
    for (int r = 0; r < 8; ++r) P[k * 8 + r] = rows[r] ? widen1(a.type, rows[r][k]) : 0.0f;
}

// C[m * ldc + 8 b + i] (+)= sum_k x[m * K + k] * panel b row k lane i, for MR tokens and panels b = 0, 1.
template <int MR>
void tile(const float* P0, const float* P1, int64_t kc, const float* x, int64_t K, float* C, int64_t ldc,
          bool acc_in) {
  __m256 acc[MR][2];
  for (int m = 0; m < MR; ++m)
    for (int b = 0; b < 2; ++b) acc[m][b] = acc_in ? _mm256_loadu_ps(C + m * ldc + 8 * b) : _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 w0 = _mm256_load_ps(P0 + k * 8), w1 = _mm256_load_ps(P1 + k * 8);
    for (int m = 0; m < MR; ++m) {
      const __m256 xv = _mm256_broadcast_ss(x + m * K + k);
      acc[m][0] = _mm256_fmadd_ps(w0, xv, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(w1, xv, acc[m][1]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int b = 0; b < 2; ++b) _mm256_storeu_ps(C + m * ldc + 8 * b, acc[m][b]);
}

void tile_any(int mr, const float* P0, const float* P1, int64_t kc, const float* x, int64_t K, float* C, int64_t ldc,
              bool acc_in) {
  switch (mr) {
    case 6: tile<6>(P0, P1, kc, x, K, C, ldc, acc_in); break;
    case 5: tile<5>(P0, P1, kc, x, K, C, ldc, acc_in); break;
    case 4: tile<4>(P0, P1, kc, x, K, C, ldc, acc_in); break;
    case 3: tile<3>(P0, P1, kc, x, K, C, ldc, acc_in); break;
    case 2: tile<2>(P0, P1, kc, x, K, C, ldc, acc_in); break;
    default: tile<1>(P0, P1, kc, x, K, C, ldc, acc_in); break;
  }
}

using dense_gemm_blocks::aligned_scratch;

void gemm(const DenseArgs& a, ThreadPool& pool) {
  const int64_t T = a.T, K = a.K, N = a.N;
  const int64_t blocks = (N + kRows - 1) / kRows;
  auto block = [&](int64_t blk) {
    thread_local std::vector<uint8_t> pbuf, cbuf;
    const int64_t n0 = blk * kRows, rows = std::min<int64_t>(kRows, N - n0);
    const int np = int((rows + 15) / 16) * 2;  // panels the tiles read, in pairs (a pair writes 16 columns)
    const bool whole = rows == int64_t(np) * 8;  // the tiles' columns all exist in out: write there directly
    float* C = whole ? a.out + n0 : reinterpret_cast<float*>(aligned_scratch(cbuf, size_t(T) * kRows * 4));
    const int64_t ldc = whole ? N : kRows;
    const int64_t kc_max = std::min(kKc, K);
    float* P = reinterpret_cast<float*>(aligned_scratch(pbuf, size_t(kPanels) * kc_max * 8 * 4));
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t kc = std::min(kKc, K - k0);
      for (int b = 0; b < np; ++b) pack_panel(a, n0 + 8 * b, k0, kc, P + size_t(b) * kc_max * 8);
      for (int64_t t0 = 0; t0 < T; t0 += kMr) {
        const int mr = int(std::min<int64_t>(kMr, T - t0));
        for (int b = 0; b < np; b += 2)
          tile_any(mr, P + size_t(b) * kc_max * 8, P + size_t(b + 1) * kc_max * 8, kc, a.x + t0 * K + k0, K,
                   C + t0 * ldc + 8 * b, ldc, k0 > 0);
      }
    }
    if (!whole) dense_gemm_blocks::copy_out(C, kRows, T, a.out, N, n0, rows);
  };
  dense_gemm_blocks::run(pool, blocks, block);
}

}  // namespace dense_gemm_f32
}  // namespace

void dense_isa::gemm_f32_avx2(const DenseArgs& a, ThreadPool& pool) { dense_gemm_f32::gemm(a, pool); }

}  // namespace tessera

TESSERA_ISA_END
