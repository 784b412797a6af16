// Dense bf16 GEMM for prefill: out[T, N] = bf16(x)[T, K] . W[N, K]^T with W the stored bf16 matrix (row-major, read in
// place, never copied whole) and x rounded once to bf16 (round to nearest even, vcvtne2ps2bf16); products are exact
// and sums accumulate in f32 inside vdpbf16ps (which flushes bf16 denormals to zero). AVX512-BF16 code between the ISA
// markers (isa_target.h); dense.cpp calls it only when CPUID reports avx512_bf16.
//
// Blocking (per pool task = one block of kRows = 64 output rows):
//   for each K block of kKc pairs: the block's 4 x 16 rows are transposed into 4 "pair panels" (moe_panels.h's layout:
//   panel row p = the 16 rows' bf16 pairs (2p, 2p+1), 64 bytes) in a thread-local 64 KB buffer (L2), then every group
//   of kMr tokens runs the register tile over it: kMr tokens x 4 panels = 24 zmm accumulators, per pair 4 panel loads +
//   kMr broadcasts for 4 * kMr vdpbf16ps. Each weight is read from memory once per call whatever T is; the activations
//   (T x K bf16) are re-read from L2/L3 once per row block.
// On AMX CPUs (DenseTiles::Amx) the same packed panels are the B operands of TDPBF16PS: a panel's 16 rows of pairs
// are one B tile as stored, and 16 bf16 activation rows (16 pairs each) one A tile; each whole 64-row block runs its
// tokens 32 at a time as two pairs of panels x two token tiles (four C tiles, accumulated in the output across the K
// blocks), the tokens past the last multiple of 32 and the partial blocks on the vector tile above. Both products
// are exact and sum in f32; TDPBF16PS sums a tile's pairs in its own order and flushes denormals (DAZ/FTZ), so the
// two paths agree to rounding, and the tiles equal the emulator (AmxEmulated) bit for bit.
// Letters: T tokens, K inputs, N outputs, kp0 = ceil(K / 2) pairs (kp: the padded row stride of the activations).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_tile.h"
#include "amx_tile_emu.h"
#include "dense_gemm_blocks.h"
#include "tessera/dense.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX512_BF16)

namespace tessera {
namespace {

#include "amx_tiles_local.inc"  // HwTiles (inline asm) and EmuTiles, file-local

namespace dense_gemm {

constexpr int kNb = 4;              // panels of 16 rows per register tile
constexpr int kRows = 16 * kNb;     // rows per task
constexpr int kMr = 6;              // tokens per register tile
constexpr int64_t kKc = 256;        // pairs per K block: 4 panels x 256 x 64 B = 64 KB packed (L2)
// Padding of the bf16 activation rows (pairs) and of each packed panel (64-byte lines), so the 6 activation rows and
// the 4 panels a tile reads are not all 4 KB apart (same L1 set). A sweep of K block 64/128/256/512 pairs, with and
// without the padding, on q/o/k_proj at T=128/512 (2 threads, 2026-12-03) stayed within the noise of a shared
// machine (190-360 GFLOP/s either way): 256 is kept as the middle, the padding as the safe default.
constexpr int64_t kPadPairs = 16;
constexpr size_t kPadPanel = 64;
// The tile path's panel budget per task (L2): all of K for a 64-row block up to K = 4096 (512 KB).
constexpr size_t kAmxPanels = size_t(1) << 19;

// C[m * ldc + b * 16 + i] (+)= sum_p A[m * lda + p] . panel b row p, lane i (bf16 pairs in 32-bit words).
template <int MR, int NB>
inline void tile(const uint8_t* P, size_t panel_bytes, int64_t kc, const uint32_t* A, int64_t lda, float* C,
                 int64_t ldc, bool acc_in) {
  __m512 acc[MR][NB];
  for (int m = 0; m < MR; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = acc_in ? _mm512_loadu_ps(C + m * ldc + b * 16) : _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    __m512bh w[NB];
    for (int b = 0; b < NB; ++b) w[b] = (__m512bh)_mm512_load_si512(P + size_t(b) * panel_bytes + size_t(p) * 64);
    for (int m = 0; m < MR; ++m) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int(A[m * lda + p]));
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], w[b], a);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(C + m * ldc + b * 16, acc[m][b]);
}

template <int NB>
inline void tile_mr(int mr, const uint8_t* P, size_t pb, int64_t kc, const uint32_t* A, int64_t lda, float* C,
                    int64_t ldc, bool acc) {
  switch (mr) {
    case 1: return tile<1, NB>(P, pb, kc, A, lda, C, ldc, acc);
    case 2: return tile<2, NB>(P, pb, kc, A, lda, C, ldc, acc);
    case 3: return tile<3, NB>(P, pb, kc, A, lda, C, ldc, acc);
    case 4: return tile<4, NB>(P, pb, kc, A, lda, C, ldc, acc);
    case 5: return tile<5, NB>(P, pb, kc, A, lda, C, ldc, acc);
    default: return tile<6, NB>(P, pb, kc, A, lda, C, ldc, acc);
  }
}

inline void tile_any(int mr, int nb, const uint8_t* P, size_t pb, int64_t kc, const uint32_t* A, int64_t lda,
                     float* C, int64_t ldc, bool acc) {
  switch (nb) {
    case 1: return tile_mr<1>(mr, P, pb, kc, A, lda, C, ldc, acc);
    case 2: return tile_mr<2>(mr, P, pb, kc, A, lda, C, ldc, acc);
    case 3: return tile_mr<3>(mr, P, pb, kc, A, lda, C, ldc, acc);
    default: return tile_mr<4>(mr, P, pb, kc, A, lda, C, ldc, acc);
  }
}

// C[t][16 b + i] (+)= sum_p A[t * lda + p] . panel b row p, lane i for 32 tokens t and the 32 rows of panels P0, P1
// (b = 0, 1), over kc pairs (the panels padded to a multiple of 16 pair rows with zeros, A's rows readable and finite
// up to that multiple). Tiles: 0-1 A (tokens 0-15, 16-31), 2-3 B (P0, P1), 4-7 C.
template <class Tiles>
inline void amx_block(const uint8_t* P0, const uint8_t* P1, int64_t kc, const uint32_t* A, int64_t lda, float* C,
                      int64_t ldc, bool acc) {
  if (acc) {
    Tiles::template load<4>(C, ldc * 4);
    Tiles::template load<5>(C + 16, ldc * 4);
    Tiles::template load<6>(C + 16 * ldc, ldc * 4);
    Tiles::template load<7>(C + 16 * ldc + 16, ldc * 4);
  } else {
    Tiles::template zero<4>();
    Tiles::template zero<5>();
    Tiles::template zero<6>();
    Tiles::template zero<7>();
  }
  for (int64_t q = 0; q < kc; q += 16) {
    Tiles::template load<0>(A + q, lda * 4);
    Tiles::template load<2>(P0 + q * 64, 64);
    Tiles::template dpbf16ps<4, 0, 2>();
    Tiles::template load<1>(A + 16 * lda + q, lda * 4);
    Tiles::template dpbf16ps<6, 1, 2>();
    Tiles::template load<3>(P1 + q * 64, 64);
    Tiles::template dpbf16ps<5, 0, 3>();
    Tiles::template dpbf16ps<7, 1, 3>();
  }
  Tiles::template store<4>(C, ldc * 4);
  Tiles::template store<5>(C + 16, ldc * 4);
  Tiles::template store<6>(C + 16 * ldc, ldc * 4);
  Tiles::template store<7>(C + 16 * ldc + 16, ldc * 4);
}

// 16 rows x 16 pairs of 32-bit words, transposed in registers: r[i] = row i's pairs -> r[j] = pair j's 16 rows.
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int q = 0; q < 4; ++q) {  // rows 4q..4q+3: u[4q + j] lane L = column 4L + j of those rows
    const __m512i lo0 = t[4 * q], hi0 = t[4 * q + 1], lo1 = t[4 * q + 2], hi1 = t[4 * q + 3];
    u[4 * q + 0] = _mm512_unpacklo_epi64(lo0, lo1);
    u[4 * q + 1] = _mm512_unpackhi_epi64(lo0, lo1);
    u[4 * q + 2] = _mm512_unpacklo_epi64(hi0, hi1);
    u[4 * q + 3] = _mm512_unpackhi_epi64(hi0, hi1);
  }
  for (int j = 0; j < 4; ++j) {  // column 4L + j = lane L of u[j], u[4 + j], u[8 + j], u[12 + j]
    const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88), v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
    r[j] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
    r[4 + j] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
  }
}

// Panel of rows [n0, n0 + 16) x pairs [p0, p0 + kc) into dst (kc rounded up to 16 rows of 64 bytes). Elements past K
// and rows past N are zero (masked loads: nothing outside the matrix is read).
inline void pack_panel(const uint16_t* w, int64_t N, int64_t K, int64_t n0, int64_t p0, int64_t kc, uint8_t* dst) {
  for (int64_t q = 0; q < kc; q += 16) {
    const int64_t k0 = 2 * (p0 + q);  // first element of this 16-pair column block
    const int64_t left = K - k0;
    const __mmask32 mask = left >= 32 ? __mmask32(0xffffffffu) : left <= 0 ? 0 : __mmask32((1u << left) - 1);
    __m512i r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = n0 + i < N ? _mm512_maskz_loadu_epi16(mask, w + (n0 + i) * K + k0) : _mm512_setzero_si512();
    transpose16(r);
    for (int j = 0; j < 16; ++j) _mm512_store_si512(dst + (q + j) * 64, r[j]);
  }
}

// x[t] (K f32) -> ceil(K / 2) bf16 pairs (round to nearest even; the odd K's last pair padded with +0).
inline void convert_row(const float* x, int64_t K, uint32_t* dst) {
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k));
    _mm512_storeu_si512(d + k, (__m512i)v);
  }
  for (; k < K; k += 16) {
    const int64_t n = std::min<int64_t>(16, K - k);
    const __mmask16 m = __mmask16((1u << n) - 1);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + k));
    _mm256_mask_storeu_epi16(d + k, m, (__m256i)v);
  }
  if (K % 2) d[K] = 0;
}

using dense_gemm_blocks::aligned_scratch;

template <class Tiles>
void gemm(const DenseArgs& a, ThreadPool& pool, bool tiles) {
  const int64_t T = a.T, N = a.N, K = a.K, kp0 = (K + 1) / 2, kp = kp0 + kPadPairs;
  thread_local std::vector<uint8_t> xbuf;
  uint32_t* xb = reinterpret_cast<uint32_t*>(aligned_scratch(xbuf, size_t(T * kp) * 4));  // [T, kp] pairs, padded
  // A row's pairs past kp0 are zero: a tile reads 16 pairs at a time up to the next multiple of 16 (< kp), against
  // the panels' zero rows (0 x a leftover NaN would be NaN)
  auto convert = [&](int64_t t) {
    convert_row(a.x + t * K, K, xb + t * kp);
    std::fill(xb + t * kp + kp0, xb + (t + 1) * kp, 0u);
  };
  if (T * K < (int64_t(1) << 16) || pool.size() == 1) {
    for (int64_t t = 0; t < T; ++t) convert(t);
  } else {
    const int64_t per = 16, tasks = (T + per - 1) / per;
    pool.parallel_for(tasks, [&](int64_t task, int) {
      for (int64_t t = task * per; t < std::min(T, (task + 1) * per); ++t) convert(t);
    });
  }
  const int64_t blocks = (N + kRows - 1) / kRows;
  auto block = [&](int64_t blk) {
    thread_local std::vector<uint8_t> pbuf, cbuf;
    const int64_t n0 = blk * kRows, rows = std::min<int64_t>(kRows, N - n0);
    const int nb = int((rows + 15) / 16);
    const bool whole = rows == int64_t(nb) * 16;  // the tile writes nb * 16 columns: direct to out only if they exist
    float* C = whole ? a.out + n0 : reinterpret_cast<float*>(aligned_scratch(cbuf, size_t(T) * kRows * 4));
    const int64_t ldc = whole ? N : kRows;
    // tokens [0, t_amx) on the tiles: whole blocks of four panels only (a tile writes 16 columns), 32 tokens at a time
    const int64_t t_amx = tiles && whole && nb == kNb ? T / 32 * 32 : 0;
    // On the tiles the block's panels take all of K at once where they fit kAmxPanels (K <= 4096 at 64 rows): each
    // output is then written once instead of loaded and stored again per K block (at T = 2048 the C traffic of the
    // 256-pair blocks cost ~25 % of q_proj's time).
    const int64_t kp16 = (kp0 + 15) / 16 * 16;
    const int64_t kblk = t_amx > 0 && size_t(kNb * kp16 * 64) <= kAmxPanels ? kp16 : kKc;
    const int64_t kc_max = std::min(kblk, kp16);
    const size_t panel_bytes = size_t((kc_max + 15) / 16 * 16) * 64 + kPadPanel;
    uint8_t* P = aligned_scratch(pbuf, kNb * panel_bytes);
    if (t_amx > 0) Tiles::config(amx::TileConfig::full());
    for (int64_t p0 = 0; p0 < kp0; p0 += kblk) {
      const int64_t kc = std::min(kblk, kp0 - p0);
      for (int b = 0; b < nb; ++b) pack_panel(a.w, N, K, n0 + 16 * b, p0, kc, P + size_t(b) * panel_bytes);
      for (int64_t t0 = 0; t0 < t_amx; t0 += 32)
        for (int b = 0; b < kNb; b += 2)
          amx_block<Tiles>(P + size_t(b) * panel_bytes, P + size_t(b + 1) * panel_bytes, kc, xb + t0 * kp + p0, kp,
                           C + t0 * ldc + 16 * b, ldc, p0 > 0);
      for (int64_t t0 = t_amx; t0 < T; t0 += kMr) {
        const int mr = int(std::min<int64_t>(kMr, T - t0));
        tile_any(mr, nb, P, panel_bytes, kc, xb + t0 * kp + p0, kp, C + t0 * ldc, ldc, p0 > 0);
      }
    }
    if (t_amx > 0) Tiles::release();
    if (!whole) dense_gemm_blocks::copy_out(C, kRows, T, a.out, N, n0, rows);
  };
  dense_gemm_blocks::run(pool, blocks, block);
}

}  // namespace dense_gemm
}  // namespace

void dense_isa::gemm_bf16_avx512(const DenseArgs& a, ThreadPool& pool, DenseTiles tiles) {
  if (tiles == DenseTiles::AmxEmulated) dense_gemm::gemm<EmuTiles>(a, pool, true);
  else dense_gemm::gemm<HwTiles>(a, pool, tiles == DenseTiles::Amx);
}

}  // namespace tessera

TESSERA_ISA_END
