// The AMX backends' kernels, written once against the tile interface (amx_tile.h) and instantiated twice: with
// TileHw in moe_amx_hw.cpp (AMX flags) and with TileEmu in moe_amx_emu.cpp (portable). Include from those only.
//
// Letters: T tokens, k experts per token, E experts, H hidden, I intermediate, R routed rows (token, slot) grouped by
// expert, M rows of one expert, Kp/Np padded sizes (amx_layout.h).
//
// forward: rows grouped by expert; per expert with M rows, gate/up/down run on AMX tiles when M >= the tile threshold
// and on the vector kernels (amx_vec.h, same packing) otherwise. Every output element is computed by one task in a
// fixed order, so results do not depend on the thread count; the int8 pipeline is bit-identical on either path (pieces
// of kInt8Bf16MinRows rows or more take bf16 tiles over their dequantized weights instead: see there). int8:
// activations carry two digits (amx_pack.h quantize_row_i8): the vector path loads each weight row once for both
// (decode reads the same bytes, as AVX512Int8's kernel does), the tiles run both digit tiles against each B tile. bf16:
// tiles take bf16 activations (TDPBF16PS), vectors keep them f32 (fp32 FMA on the widened bf16 weights).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "amx_layout.h"
#include "amx_pack.h"
#include "amx_tile.h"
#include "amx_vec.h"
#include "tessera/backend.h"
#include "tessera/tuning.h"

namespace tessera::amx {

// Pieces of experts with at least this many rows use tiles; TESSERA_AMX_TILE_MIN_ROWS (or a stored calibration) sets
// one value for both formats, tests force either path with _native.set_amx_tile_min_rows. Defaults measured on an AMX
// Xeon, 2 cores, Qwen3-30B-A3B layer (docs/BENCHMARKS.md, issue 16 items 1-2, sweep of 1..32 at T = 1..512):
// bf16: tiles win from 1 row (the f32 vector path is 1.4x slower at T = 32, 2.1x at T = 128 with 16); 2 keeps decode
// (one row per expert) on f32 activations at <= 4 % of the time of 1 at any T. int8: the two-digit vector path is as
// fast or faster below ~16 rows (1 row: decode 1.9 vs 1.45 ms); from 16 the two are within noise.
constexpr int64_t kTileMinRowsBF16 = 2, kTileMinRowsInt8 = 16;
// n-blocks (16 outputs each) per task. 8 rather than 4: each task re-reads its piece's activation rows, so wider slabs
// halve that traffic (AMX Xeon, 2 cores, Qwen3-30B-A3B layer: T=4096 bf16 974 -> 1060-1130 GFLOP/s, int8 574 -> 600+,
// int8 T=512 413 -> 447-467; 12 and 16 within noise of 8; int8 decode 1.32 ms vs 1.38 ms). Decode keeps 48 gate/up and
// 128 down tasks at k = 8.
constexpr int64_t kSlabBlocks = 8;

// Int8 pieces with at least this many rows run on bf16 tiles: each slab's int8 weights dequantized to bf16 per task
// (vec.dequant_bf16, into this thread's L2), the rows' activations rounded to bf16, then TileGemm::bf16 (one tile
// product per 32 values and no per-group epilogue, where the two-digit int8 tiles take two per 64 and an epilogue per
// 64-value group that the tiles cannot hide). Costs the weights' dequantization once per piece and slab, and a bf16
// rounding of weights and activations (2^-9 each: layer error 1.04 % -> 1.12 % when every piece takes it). Measured on
// the AMX Xeon (2 cores, Qwen3-30B-A3B layer, bench-moe AMXInt8, GOP/s, docs/BENCHMARKS.md session 20, with the
// dequantization on VCVTNE2PS2BF16): T=512 (~32 rows a piece) 32: 418-419, 64: 431-445, 128: 402-442; T=1024 (~64)
// 32: 534, 64: 545-550, 128: 479-503; T=2048 (~128) 32: 810-816, 64: 813-837, 128: 658. (Session 17, before that
// dequantization: 128 best, 64 lost at T=1024.)
// TESSERA_AMX_INT8_BF16_MIN_ROWS overrides (0: never); tests force either path with _native.set_amx_int8_bf16_min_rows.
constexpr int64_t kInt8Bf16MinRows = 64;

inline int64_t int8_bf16_min_rows() {
  const int64_t v = tuning().amx_int8_bf16_min_rows.load(std::memory_order_relaxed);
  return v < 0 ? kInt8Bf16MinRows : (v == 0 ? INT64_MAX : v);
}

inline int64_t tile_min_rows(WeightFormat fmt) {
  const int64_t v = tuning().amx_tile_min_rows.load(std::memory_order_relaxed);
  return v > 0 ? v : fmt == WeightFormat::Int8 ? kTileMinRowsInt8 : kTileMinRowsBF16;
}

// Tiles 0,1: A rows m0..m0+15 and m0+16..m0+31; 2,3: B n-blocks nb, nb+1; 4..7: C = (A0|A1) x (B0|B1).
inline TileConfig gemm_tile_config(int ra0, int ra1) {
  TileConfig c;
  c.tile(0, ra0, 64).tile(2, 16, 64).tile(3, 16, 64).tile(4, ra0, 64).tile(5, ra0, 64);
  if (ra1 > 0) c.tile(1, ra1, 64).tile(6, ra1, 64).tile(7, ra1, 64);
  return c;
}

template <class Tiles>
struct TileGemm {
  // Same contract as VecKernels::gemm_i8 (amx_vec.h): A rows hold the hi digits at [0, Kp) and the lo digits at
  // [Kp, 2 Kp). Per 16 token rows, tile 0 holds their hi digits and tile 1 their lo digits (same rows, stride lda),
  // so C tiles 4/5 are hi x B0/B1 and 6/7 lo x B0/B1, combined per group by the shared epilogue.
  // The group epilogue runs through vec (vectorized where the CPU allows; it rounds like every other path).
  static void i8(const VecKernels& vec, const MatLayout& L, const uint8_t* W, const int8_t* A, int64_t lda,
                 const float* ascale, const int32_t* corr, int64_t M, int64_t nb0, int64_t nb1, float* C,
                 int64_t ldc) {
    const int64_t kpg = L.kblocks_per_group();
    alignas(64) int32_t cbuf[4][16 * 16];
    alignas(64) float facc[16][32];
    int cur = -1;
    for (int64_t m0 = 0; m0 < M; m0 += 16) {
      const int ra = static_cast<int>(std::min<int64_t>(16, M - m0));
      if (ra != cur) {  // edge rows: reconfigure (LDTILECFG zeroes the tiles; nothing is live)
        Tiles::config(gemm_tile_config(ra, ra));
        cur = ra;
      }
      const int8_t* hi = A + m0 * lda;
      const int8_t* lo = hi + L.Kp;
      for (int64_t nb = nb0; nb < nb1; nb += 2) {
        const bool two = nb + 1 < nb1;
        for (int r = 0; r < ra; ++r) std::fill(facc[r], facc[r] + 32, 0.0f);
        for (int64_t g = 0; g < L.ngroups; ++g) {
          Tiles::template zero<4>();
          Tiles::template zero<5>();
          Tiles::template zero<6>();
          Tiles::template zero<7>();
          for (int64_t kb = g * kpg; kb < (g + 1) * kpg; ++kb) {
            Tiles::template load<0>(hi + kb * kTileKInt8, lda);
            Tiles::template load<1>(lo + kb * kTileKInt8, lda);
            Tiles::template load<2>(L.tile(W, nb, kb), 64);
            if (two) Tiles::template load<3>(L.tile(W, nb + 1, kb), 64);
            Tiles::template dpbsud<4, 0, 2>();  // A signed digits, B the +128 weight bytes
            Tiles::template dpbsud<6, 1, 2>();
            if (two) {
              Tiles::template dpbsud<5, 0, 3>();
              Tiles::template dpbsud<7, 1, 3>();
            }
          }
          Tiles::template store<4>(cbuf[0], 64);
          Tiles::template store<6>(cbuf[2], 64);
          if (two) {
            Tiles::template store<5>(cbuf[1], 64);
            Tiles::template store<7>(cbuf[3], 64);
          }
          for (int j = 0; j < (two ? 2 : 1); ++j)
            vec.i8_epilogue(cbuf[j], cbuf[2 + j], L.scales(W, nb + j) + g * kTileN, ascale + m0 * L.ngroups + g,
                            corr + m0 * L.ngroups + g, L.ngroups, ra, &facc[0][16 * j], 32);
        }
        const int64_t ncols = std::min<int64_t>((two ? 32 : 16), L.N - nb * kTileN);
        for (int r = 0; r < ra; ++r) std::memcpy(C + (m0 + r) * ldc + nb * kTileN, facc[r], ncols * 4);
      }
    }
    Tiles::release();
  }

  // Same contract as VecKernels::gemm_bf16, but TDPBF16PS rounding (pairs summed per tile, then accumulated).
  // Blocks of 32 rows x 2 n-blocks (C tiles 4-7) over the whole K. Loop order by M: up to kNOuterMaxRows rows, n-pair
  // outer (each pair's weights, 2 x K/32 KB, come from memory once and serve every row block from L2; the rows' bf16
  // activations, <= 1 MB at K = 2048, stay in L2 across the pairs); above, row blocks outer, as the rows no longer fit.
  // C tiles are stored straight into C where an n-block is whole (a bounce buffer and a copy only at N's edge).
  // One slab, one thread, AMX Xeon (docs/BENCHMARKS.md, session 17): at M = 256 gate 0.65 -> 0.80 TFLOP/s, down
  // (K = 768) 0.53 -> 0.82; row blocks outer stay ahead from M = 512.
  static constexpr int64_t kNOuterMaxRows = 256;
  static void bf16(const MatLayout& L, const uint8_t* W, const uint16_t* A, int64_t lda, int64_t M, int64_t nb0,
                   int64_t nb1, float* C, int64_t ldc) {
    const int64_t stride = lda * 2;
    int cur0 = -1, cur1 = -1;
    // C[m0 .. m0 + 32, nb, nb + 1] (the rows and n-blocks that exist).
    auto block = [&](int64_t m0, int64_t nb) {
      const int ra0 = static_cast<int>(std::min<int64_t>(16, M - m0));
      const int ra1 = static_cast<int>(std::clamp<int64_t>(M - m0 - 16, 0, 16));
      if (ra0 != cur0 || ra1 != cur1) {  // LDTILECFG zeroes the tiles; nothing is live between blocks
        Tiles::config(gemm_tile_config(ra0, ra1));
        cur0 = ra0;
        cur1 = ra1;
      }
      const bool two = nb + 1 < nb1;
      const uint16_t* a0 = A + m0 * lda;
      const uint16_t* a1 = a0 + 16 * lda;
      Tiles::template zero<4>();
      Tiles::template zero<5>();
      if (ra1) {
        Tiles::template zero<6>();
        Tiles::template zero<7>();
      }
      for (int64_t kb = 0; kb < L.kblocks; ++kb) {
        Tiles::template load<0>(a0 + kb * kTileKBF16, stride);
        Tiles::template load<2>(L.tile(W, nb, kb), 64);
        Tiles::template dpbf16ps<4, 0, 2>();
        if (ra1) {
          Tiles::template load<1>(a1 + kb * kTileKBF16, stride);
          Tiles::template dpbf16ps<6, 1, 2>();
        }
        if (two) {
          Tiles::template load<3>(L.tile(W, nb + 1, kb), 64);
          Tiles::template dpbf16ps<5, 0, 3>();
          if (ra1) Tiles::template dpbf16ps<7, 1, 3>();
        }
      }
      store_c<4>(L, C, ldc, m0, nb, ra0);
      if (two) store_c<5>(L, C, ldc, m0, nb + 1, ra0);
      if (ra1) {
        store_c<6>(L, C, ldc, m0 + 16, nb, ra1);
        if (two) store_c<7>(L, C, ldc, m0 + 16, nb + 1, ra1);
      }
    };
    if (M <= kNOuterMaxRows) {
      for (int64_t nb = nb0; nb < nb1; nb += 2)
        for (int64_t m0 = 0; m0 < M; m0 += 32) block(m0, nb);
    } else {
      for (int64_t m0 = 0; m0 < M; m0 += 32)
        for (int64_t nb = nb0; nb < nb1; nb += 2) block(m0, nb);
    }
    Tiles::release();
  }

  // C[M, slab] for an int8 matrix on bf16 tiles: the slab's n-blocks dequantized (vec.dequant_bf16) into buf (the
  // caller's, (nb1 - nb0) * Kp / 32 KB), then bf16() on them with A's bf16 rows (lda elements).
  static void i8_bf16(const VecKernels& vec, const MatLayout& L, const uint8_t* W, const uint16_t* A, int64_t lda,
                      int64_t M, int64_t nb0, int64_t nb1, float* C, int64_t ldc, uint16_t* buf) {
    const MatLayout B = MatLayout::make(WeightFormat::BF16, L.N - nb0 * kTileN, L.Kp, 0);  // the slab from nb0 on
    for (int64_t nb = nb0; nb < nb1; ++nb) vec.dequant_bf16(L, W, nb, buf + (nb - nb0) * B.kblocks * 512);
    bf16(B, reinterpret_cast<const uint8_t*>(buf), A, lda, M, 0, nb1 - nb0, C + nb0 * kTileN, ldc);
  }

 private:
  // C tile t (rows rows from m0, n-block nb) into C: straight where the n-block is whole, else through a bounce
  // buffer that keeps the columns past N unwritten.
  template <int t>
  static void store_c(const MatLayout& L, float* C, int64_t ldc, int64_t m0, int64_t nb, int rows) {
    const int64_t n0 = nb * kTileN, ncols = std::min<int64_t>(kTileN, L.N - n0);
    if (ncols == kTileN) {
      Tiles::template store<t>(C + m0 * ldc + n0, ldc * 4);
      return;
    }
    alignas(64) float cbuf[16 * 16];
    Tiles::template store<t>(cbuf, 64);
    for (int r = 0; r < rows; ++r) std::memcpy(C + (m0 + r) * ldc + n0, &cbuf[r * 16], ncols * 4);
  }
};

// 64-byte aligned scratch carved from one growing buffer per calling thread (forward is not reentrant per thread).
// Grown with a quarter to spare and left uninitialized: calls whose need differs by a few rows (the last group's size
// follows the routing) would otherwise free, re-fault and zero ~100 MB each time (~25 ms at T = 4096).
class Scratch {
 public:
  void reset(size_t bytes) {
    if (cap_ < bytes) {
      cap_ = bytes + bytes / 4;
      buf_.reset(new uint8_t[cap_ + 64]);
    }
    base_ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf_.get()) + 63) & ~uintptr_t(63));
    used_ = 0;
  }
  template <class T>
  T* take(size_t n) {
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += round_up(n * sizeof(T), 64);
    return p;
  }
  static size_t need(size_t n, size_t elem) { return round_up(n * elem, 64); }

 private:
  std::unique_ptr<uint8_t[]> buf_;
  size_t cap_ = 0;
  uint8_t* base_ = nullptr;
  size_t used_ = 0;
};

// Routed rows per group of experts (see moe_forward): bounds the per-group scratch (about 25 KB a row on a
// Qwen3-30B-A3B layer: ~50 MB at 2048 rows) while every expert's weights are still read once per call.
constexpr int64_t kGroupRows = 2048;

inline double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One layer forward (BackendOps::forward contract in tessera/backend.h).
// All T tokens are routed at once: rows (t, j) grouped by expert, in token order within an expert. Each token's
// activations are converted once (int8 digits or bf16) and copied to its rows. The experts' rows are then cut into
// pieces of at most kGroupRows rows (one piece per expert unless it has more) and consecutive pieces into groups of at
// most kGroupRows rows; a group runs gate/up, silu, down and adds its rows into out. So every expert's weights are
// streamed from memory once per call (per piece: once for any expert with <= kGroupRows rows), however long the
// prompt, while the scratch stays bounded: one group's rows plus one converted row per token (at most half of x).
// The groups, pieces and every sum's order depend only on the routing: results do not depend on the thread count,
// and with T * k <= kGroupRows (one group) each output is summed in slot order as before.
template <class Tiles, WeightFormat Fmt>
void moe_forward(const char* backend, const uint8_t* blob, int64_t T, int64_t k, const int64_t* ids,
                 const float* weights, const float* x, float* out, ThreadPool& pool) {
  const LayerLayout L = read_layer(blob, backend, Fmt);
  const MatLayout& GU = L.gate_up;  // [I, H]
  const MatLayout& D = L.down;      // [H, I]
  const int64_t E = L.E, H = L.H, I = L.I;
  const VecKernels& vec = vec_best();
  const int64_t min_rows = tile_min_rows(Fmt);
  constexpr bool kInt8 = Fmt == WeightFormat::Int8;
  const int64_t bf16_rows = kInt8 ? int8_bf16_min_rows() : INT64_MAX;  // int8 pieces on bf16 tiles
  const bool prof = tuning().profile;
  const double t_start = prof ? now_us() : 0.0;

  // Routing: rows (t, j) grouped by expert, in token order within an expert.
  std::vector<int64_t> offs(E + 1, 0), row_of(T * k, -1);
  for (int64_t i = 0; i < T * k; ++i)
    if (ids[i] >= 0) ++offs[ids[i] + 1];
  for (int64_t e = 0; e < E; ++e) offs[e + 1] += offs[e];
  const int64_t R = offs[E];
  std::vector<int64_t> fill(offs.begin(), offs.end() - 1), row_tok(R);
  for (int64_t i = 0; i < T * k; ++i)
    if (ids[i] >= 0) {
      row_of[i] = fill[ids[i]]++;
      row_tok[row_of[i]] = i / k;
    }
  // Pieces (expert, rows [r0, r1)) and groups of consecutive pieces [gstart[g], gstart[g + 1]): contiguous row ranges.
  struct Piece {
    int64_t e, r0, r1;
  };
  std::vector<Piece> pieces;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = offs[e]; r < offs[e + 1]; r += kGroupRows)
      pieces.push_back({e, r, std::min(offs[e + 1], r + kGroupRows)});
  std::vector<size_t> gstart{0};
  int64_t grows = 0, max_rows = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int64_t n = pieces[i].r1 - pieces[i].r0;
    if (grows + n > kGroupRows) {
      gstart.push_back(i);
      grows = 0;
    }
    grows += n;
    max_rows = std::max(max_rows, grows);
  }
  if (!pieces.empty()) gstart.push_back(pieces.size());
  // Which rows run on tiles (pieces with at least min_rows rows) and, int8 only, on bf16 tiles (at least bf16_rows);
  // any_i8: an int8 piece below bf16_rows (int8 tiles or vectors), which reads the tokens' int8 digits.
  std::vector<char> row_tiles(R), row_bf16(R);
  bool any_tiles = false, any_bf16 = false, any_i8 = false;
  for (const Piece& p : pieces) {
    const bool t = p.r1 - p.r0 >= min_rows, b = p.r1 - p.r0 >= bf16_rows;
    std::fill(row_tiles.begin() + p.r0, row_tiles.begin() + p.r1, t);
    std::fill(row_bf16.begin() + p.r0, row_bf16.begin() + p.r1, b);
    any_tiles |= t;
    any_bf16 |= b;
    any_i8 |= !b;
  }

  // Scratch: per token X [T, row] (int8: hi digits then lo digits, 2 Kp bytes, with scales and corrections; bf16: Kp
  // bf16 for the rows on tiles; rows on vectors read x as f32). Per group of G rows: A [G, Kp(H)], gate/up/h [G, I],
  // h converted [G, Kp(I)], Y [G, H]. int8 rows take 2 bytes per element (hi digits, then lo digits: stride 2*Kp);
  // bf16 rows 4: an expert on tiles reads its rows as bf16 (stride 2*Kp elements), one on vectors as f32 (stride Kp).
  const size_t ab = kInt8 ? 2 : 4;
  // Row stride in bytes, 64 more than the row: a multiple of 4 KB (int8 H = 2048) would put the 16 rows of a tile
  // load in one L1 set.
  auto rowb = [&](const MatLayout& ML) -> int64_t { return ML.Kp * ab + 64; };
  // Tokens converted once: int8 digits where an int8 piece reads them, bf16 for the tiles (bf16 format); int8 format:
  // also rounded to bf16 where a piece runs on bf16 tiles (a long prompt's pieces all do: no digits then).
  const int64_t TX = (kInt8 ? any_i8 : any_tiles) ? T : 0;
  const int64_t TB = kInt8 && any_bf16 ? T : 0;
  const int64_t G = max_rows;
  thread_local Scratch scratch;
  scratch.reset(Scratch::need(TX * GU.Kp, 2) + 2 * Scratch::need(TX * GU.ngroups, 4) + Scratch::need(TB * GU.Kp, 2) +
                Scratch::need(G * rowb(GU), 1) +
                2 * Scratch::need(G * GU.ngroups, 4) + 2 * Scratch::need(G * I, 4) + Scratch::need(G * rowb(D), 1) +
                2 * Scratch::need(G * D.ngroups, 4) + Scratch::need(G * H, 4));
  uint8_t* X = scratch.take<uint8_t>(TX * GU.Kp * 2);
  float* xs = scratch.take<float>(TX * GU.ngroups);
  int32_t* xcorr = scratch.take<int32_t>(TX * GU.ngroups);
  uint16_t* Xb = scratch.take<uint16_t>(TB * GU.Kp);
  uint8_t* A = scratch.take<uint8_t>(G * rowb(GU));
  float* as = scratch.take<float>(G * GU.ngroups);
  int32_t* acorr = scratch.take<int32_t>(G * GU.ngroups);
  float* Hb = scratch.take<float>(G * I);  // gate, then silu(gate) * up
  float* Ub = scratch.take<float>(G * I);
  uint8_t* Hq = scratch.take<uint8_t>(G * rowb(D));
  float* hs = scratch.take<float>(G * D.ngroups);
  int32_t* hcorr = scratch.take<int32_t>(G * D.ngroups);
  float* Y = scratch.take<float>(G * H);

  constexpr int64_t kRowChunk = 16;
  auto chunks = [&](int64_t n, auto&& fn) {  // fn(i) for i < n, in parallel chunks of kRowChunk
    pool.parallel_for((n + kRowChunk - 1) / kRowChunk, [&](int64_t c, int) {
      for (int64_t i = c * kRowChunk; i < std::min(n, (c + 1) * kRowChunk); ++i) fn(i);
    });
  };
  // C[M, slab] for one piece's rows on tiles or vectors.
  auto gemm = [&](const MatLayout& ML, const uint8_t* W, const uint8_t* Ain, const float* sc, const int32_t* cr,
                  int64_t M, int64_t nb0, int64_t nb1, float* C, int64_t ldc) {
    if constexpr (kInt8) {
      const int8_t* a = reinterpret_cast<const int8_t*>(Ain);
      if (M >= bf16_rows) {  // the slab's weights as bf16 in this thread's buffer (L2), reused by every row block
        thread_local std::vector<uint16_t> buf;
        const size_t need = size_t((nb1 - nb0) * (ML.Kp / kTileKBF16)) * 512;
        if (buf.size() < need) buf.resize(need);
        TileGemm<Tiles>::i8_bf16(vec, ML, W, reinterpret_cast<const uint16_t*>(Ain), rowb(ML) / 2, M, nb0, nb1, C, ldc,
                                 buf.data());
      } else if (M >= min_rows)
        TileGemm<Tiles>::i8(vec, ML, W, a, rowb(ML), sc, cr, M, nb0, nb1, C, ldc);
      else
        vec.gemm_i8(ML, W, a, rowb(ML), sc, cr, M, nb0, nb1, C, ldc);
    } else if (M >= min_rows) {
      TileGemm<Tiles>::bf16(ML, W, reinterpret_cast<const uint16_t*>(Ain), rowb(ML) / 2, M, nb0, nb1, C, ldc);
    } else {
      vec.gemm_bf16(ML, W, reinterpret_cast<const float*>(Ain), rowb(ML) / 4, M, nb0, nb1, C, ldc);
    }
  };

  // 1. each token's activations once: int8 digits with scales and corrections, or bf16 for the rows on tiles.
  chunks(std::max(TX, TB), [&](int64_t t) {
    if constexpr (kInt8) {
      if (TX)
        vec.quantize_i8(GU, x + t * H, reinterpret_cast<int8_t*>(X) + t * 2 * GU.Kp, xs + t * GU.ngroups,
                        xcorr + t * GU.ngroups);
      if (TB) vec.convert_bf16(GU, x + t * H, Xb + t * GU.Kp);
    } else
      vec.convert_bf16(GU, x + t * H, reinterpret_cast<uint16_t*>(X) + t * GU.Kp);
  });
  double t_conv = 0, t_gu = 0, t_h = 0, t_down = 0, t_comb = 0, t_mark = prof ? now_us() : 0.0;
  t_conv = t_mark - t_start;
  auto lap = [&](double& acc) {
    if (!prof) return;
    const double now = now_us();
    acc += now - t_mark;
    t_mark = now;
  };
  if (pieces.empty()) chunks(T, [&](int64_t t) { std::fill(out + t * H, out + (t + 1) * H, 0.0f); });

  for (size_t grp = 0; grp + 1 < gstart.size(); ++grp) {
    const Piece* p0 = pieces.data() + gstart[grp];
    const int64_t np = static_cast<int64_t>(gstart[grp + 1] - gstart[grp]);
    const int64_t g0 = p0[0].r0, g1 = p0[np - 1].r1, GRn = g1 - g0;  // the group's rows [g0, g1)
    // Tasks (piece, slab of n-blocks) over a matrix with nblocks; fn(piece, nb0, nb1).
    auto for_piece_slabs = [&](int64_t nblocks, auto&& fn) {
      const int64_t slabs = (nblocks + kSlabBlocks - 1) / kSlabBlocks;
      pool.parallel_for(np * slabs, [&](int64_t task, int) {
        const int64_t s = task % slabs;
        fn(p0[task / slabs], s * kSlabBlocks, std::min(nblocks, (s + 1) * kSlabBlocks));
      });
    };
    // 2. the group's rows of converted activations (f32 for bf16 rows on vectors).
    chunks(GRn, [&](int64_t i) {
      const int64_t r = g0 + i, t = row_tok[r];
      if constexpr (kInt8) {
        if (row_bf16[r]) {
          std::memcpy(A + i * rowb(GU), Xb + t * GU.Kp, GU.Kp * 2);
          return;
        }
        std::memcpy(A + i * rowb(GU), X + t * 2 * GU.Kp, 2 * GU.Kp);
        std::memcpy(as + i * GU.ngroups, xs + t * GU.ngroups, GU.ngroups * 4);
        std::memcpy(acorr + i * GU.ngroups, xcorr + t * GU.ngroups, GU.ngroups * 4);
      } else if (row_tiles[r]) {
        std::memcpy(A + i * rowb(GU), reinterpret_cast<uint16_t*>(X) + t * GU.Kp,
                    GU.Kp * 2);
      } else {
        pad_row_f32(GU, x + t * H, reinterpret_cast<float*>(A + i * rowb(GU)));
      }
    });
    lap(t_conv);
    // 3. gate and up, then h = silu(gate) * up on the same slab.
    for_piece_slabs(GU.nblocks, [&](const Piece& p, int64_t nb0, int64_t nb1) {
      const int64_t l0 = p.r0 - g0, M = p.r1 - p.r0;
      const uint8_t* a = A + l0 * rowb(GU);
      const float* sc = as + l0 * GU.ngroups;
      const int32_t* cr = acorr + l0 * GU.ngroups;
      gemm(GU, L.gate(blob, p.e), a, sc, cr, M, nb0, nb1, Hb + l0 * I, I);
      gemm(GU, L.up(blob, p.e), a, sc, cr, M, nb0, nb1, Ub + l0 * I, I);
      const int64_t c0 = nb0 * kTileN, c1 = std::min(I, nb1 * kTileN);
      for (int64_t r = l0; r < l0 + M; ++r) vec.silu_mul(Hb + r * I + c0, Ub + r * I + c0, c1 - c0);
    });
    lap(t_gu);
    // 4. h rows converted for the down projection.
    chunks(GRn, [&](int64_t i) {
      const float* v = Hb + i * I;
      if constexpr (kInt8) {
        if (row_bf16[g0 + i])
          vec.convert_bf16(D, v, reinterpret_cast<uint16_t*>(Hq + i * rowb(D)));
        else
          vec.quantize_i8(D, v, reinterpret_cast<int8_t*>(Hq + i * rowb(D)), hs + i * D.ngroups, hcorr + i * D.ngroups);
      } else if (row_tiles[g0 + i])
        vec.convert_bf16(D, v, reinterpret_cast<uint16_t*>(Hq + i * rowb(D)));
      else
        pad_row_f32(D, v, reinterpret_cast<float*>(Hq + i * rowb(D)));
    });
    lap(t_h);
    // 5. down: Y [G, H].
    for_piece_slabs(D.nblocks, [&](const Piece& p, int64_t nb0, int64_t nb1) {
      const int64_t l0 = p.r0 - g0;
      gemm(D, L.down_mat(blob, p.e), Hq + l0 * rowb(D), hs + l0 * D.ngroups, hcorr + l0 * D.ngroups, p.r1 - p.r0,
           nb0, nb1, Y + l0 * H, H);
    });
    lap(t_down);
    // 6. out[t] (+)= sum_j weights[t, j] * Y[row(t, j)] over the token's rows in this group, in slot order; the first
    // group writes every token (zero where it has no rows here).
    chunks(T, [&](int64_t t) {
      float* o = out + t * H;
      if (grp == 0) std::fill(o, o + H, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = row_of[t * k + j];
        if (r < g0 || r >= g1) continue;
        const float w = weights[t * k + j];
        const float* y = Y + (r - g0) * H;
        for (int64_t h = 0; h < H; ++h) o[h] += w * y[h];
      }
    });
    lap(t_comb);
  }
  if (prof)
    std::fprintf(stderr,
                 "tessera %s T=%lld R=%lld groups=%lld: convert %.0f us, gate/up %.0f us, h %.0f us, down %.0f us, "
                 "combine %.0f us\n",
                 backend, (long long)T, (long long)R, (long long)(gstart.size() - 1), t_conv, t_gu, t_h, t_down,
                 t_comb);
}

}  // namespace tessera::amx
