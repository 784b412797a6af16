// The AMX backends' kernels, written once against the tile interface (amx_tile.h) and instantiated twice: with
// TileHw in moe_amx_hw.cpp (AMX flags) and with TileEmu in moe_amx_emu.cpp (portable). Include from those only.
//
// Letters: T tokens, k experts per token, E experts, H hidden, I intermediate, R routed rows (token, slot) grouped by
// expert, M rows of one expert, Kp/Np padded sizes (amx_layout.h).
//
// forward: rows grouped by expert; per expert with M rows, gate/up/down run on AMX tiles when M >= the tile threshold
// and on the vector kernels (amx_vec.h, same packing) otherwise. Every output element is computed by one task in a
// fixed order, so results do not depend on the thread count; the int8 pipeline is bit-identical on either path. int8:
// activations carry two digits (amx_pack.h quantize_row_i8): the vector path loads each weight row once for both
// (decode reads the same bytes, as AVX512Int8's kernel does), the tiles run both digit tiles against each B tile. bf16:
// tiles take bf16 activations (TDPBF16PS), vectors keep them f32 (fp32 FMA on the widened bf16 weights).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "amx_layout.h"
#include "amx_pack.h"
#include "amx_tile.h"
#include "amx_vec.h"
#include "tessera/backend.h"
#include "tessera/tuning.h"

namespace tessera::amx {

// Experts with at least this many rows use tiles (default 16, tessera/tuning.h); TESSERA_AMX_TILE_MIN_ROWS overrides it
// and tests force either path with _native.set_amx_tile_min_rows.
// Not measured on AMX hardware yet (none was available): below 16 rows a tile op runs partly empty while the vector
// path, which shares each weight row among 4 token rows, is still bound by the same weight stream; KTransformers'
// rule (tiles when qlen > 4*E/k) switches at a mean of 4 rows per expert. Measure with bench-moe on AMX and adjust.
constexpr int64_t kSlabBlocks = 4;  // n-blocks (16 outputs each) per task

inline int64_t tile_min_rows() { return tuning().amx_tile_min_rows.load(std::memory_order_relaxed); }

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
  static void bf16(const MatLayout& L, const uint8_t* W, const uint16_t* A, int64_t lda, int64_t M, int64_t nb0,
                   int64_t nb1, float* C, int64_t ldc) {
    alignas(64) float cbuf[4][16 * 16];
    const int64_t stride = lda * 2;
    int cur0 = -1, cur1 = -1;
    for (int64_t m0 = 0; m0 < M; m0 += 32) {
      const int ra0 = static_cast<int>(std::min<int64_t>(16, M - m0));
      const int ra1 = static_cast<int>(std::clamp<int64_t>(M - m0 - 16, 0, 16));
      if (ra0 != cur0 || ra1 != cur1) {
        Tiles::config(gemm_tile_config(ra0, ra1));
        cur0 = ra0;
        cur1 = ra1;
      }
      const uint16_t* a0 = A + m0 * lda;
      const uint16_t* a1 = a0 + 16 * lda;
      for (int64_t nb = nb0; nb < nb1; nb += 2) {
        const bool two = nb + 1 < nb1;
        Tiles::template zero<4>();
        Tiles::template zero<5>();
        if (ra1) {
          Tiles::template zero<6>();
          Tiles::template zero<7>();
        }
        for (int64_t kb = 0; kb < L.kblocks; ++kb) {
          Tiles::template load<0>(a0 + kb * kTileKBF16, stride);
          if (ra1) Tiles::template load<1>(a1 + kb * kTileKBF16, stride);
          Tiles::template load<2>(L.tile(W, nb, kb), 64);
          if (two) Tiles::template load<3>(L.tile(W, nb + 1, kb), 64);
          Tiles::template dpbf16ps<4, 0, 2>();
          if (two) Tiles::template dpbf16ps<5, 0, 3>();
          if (ra1) {
            Tiles::template dpbf16ps<6, 1, 2>();
            if (two) Tiles::template dpbf16ps<7, 1, 3>();
          }
        }
        Tiles::template store<4>(cbuf[0], 64);
        if (two) Tiles::template store<5>(cbuf[1], 64);
        if (ra1) {
          Tiles::template store<6>(cbuf[2], 64);
          if (two) Tiles::template store<7>(cbuf[3], 64);
        }
        for (int i = 0; i < (ra1 ? 2 : 1); ++i)
          for (int j = 0; j < (two ? 2 : 1); ++j) {
            const int64_t n0 = (nb + j) * kTileN;
            const int64_t ncols = std::min<int64_t>(16, L.N - n0);
            for (int r = 0; r < (i ? ra1 : ra0); ++r)
              if (ncols > 0) std::memcpy(C + (m0 + 16 * i + r) * ldc + n0, &cbuf[2 * i + j][r * 16], ncols * 4);
          }
      }
    }
    Tiles::release();
  }
};

// 64-byte aligned scratch carved from one growing buffer per calling thread (forward is not reentrant per thread).
class Scratch {
 public:
  void reset(size_t bytes) {
    if (buf_.size() < bytes + 64) buf_.assign(bytes + 64, 0);
    base_ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf_.data()) + 63) & ~uintptr_t(63));
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
  std::vector<uint8_t> buf_;
  uint8_t* base_ = nullptr;
  size_t used_ = 0;
};

// One pass over at most kMaxTokensPerPass tokens (moe_forward below splits longer inputs).
template <class Tiles, WeightFormat Fmt>
void moe_forward_pass(const LayerLayout& L, const uint8_t* blob, int64_t T, int64_t k, const int64_t* ids,
                      const float* weights, const float* x, float* out, ThreadPool& pool) {
  const MatLayout& GU = L.gate_up;  // [I, H]
  const MatLayout& D = L.down;      // [H, I]
  const int64_t E = L.E, H = L.H, I = L.I;
  const VecKernels& vec = vec_best();
  const int64_t min_rows = tile_min_rows();
  constexpr bool kInt8 = Fmt == WeightFormat::Int8;

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
  std::vector<int64_t> active;  // experts with rows
  for (int64_t e = 0; e < E; ++e)
    if (offs[e + 1] > offs[e]) active.push_back(e);

  // Scratch: A [R, Kp(H)], gate/up/h [R, I], h converted [R, Kp(I)], Y [R, H]. int8 rows take 2 bytes per element
  // (hi digits, then lo digits: stride 2*Kp); bf16 rows 4: an expert on tiles reads its rows as bf16 (stride 2*Kp
  // elements), one on vectors as f32 (stride Kp).
  const size_t ab = kInt8 ? 2 : 4;
  std::vector<char> row_tiles(R);
  for (int64_t e : active)
    std::fill(row_tiles.begin() + offs[e], row_tiles.begin() + offs[e + 1], offs[e + 1] - offs[e] >= min_rows);
  thread_local Scratch scratch;
  scratch.reset(Scratch::need(R * GU.Kp, ab) + 2 * Scratch::need(R * GU.ngroups, 4) + 2 * Scratch::need(R * I, 4) +
                Scratch::need(R * D.Kp, ab) + 2 * Scratch::need(R * D.ngroups, 4) + Scratch::need(R * H, 4));
  uint8_t* A = scratch.take<uint8_t>(R * GU.Kp * ab);
  float* as = scratch.take<float>(R * GU.ngroups);
  int32_t* acorr = scratch.take<int32_t>(R * GU.ngroups);
  float* Hb = scratch.take<float>(R * I);  // gate, then silu(gate) * up
  float* Ub = scratch.take<float>(R * I);
  uint8_t* Hq = scratch.take<uint8_t>(R * D.Kp * ab);
  float* hs = scratch.take<float>(R * D.ngroups);
  int32_t* hcorr = scratch.take<int32_t>(R * D.ngroups);
  float* Y = scratch.take<float>(R * H);

  constexpr int64_t kRowChunk = 16;
  auto convert_rows = [&](const MatLayout& ML, const float* src, int64_t ld, const int64_t* tok, uint8_t* dst,
                          float* sc, int32_t* cr) {
    pool.parallel_for((R + kRowChunk - 1) / kRowChunk, [&](int64_t c, int) {
      for (int64_t r = c * kRowChunk; r < std::min(R, (c + 1) * kRowChunk); ++r) {
        const float* v = src + (tok ? tok[r] : r) * ld;
        if constexpr (kInt8)
          vec.quantize_i8(ML, v, reinterpret_cast<int8_t*>(dst) + r * 2 * ML.Kp, sc + r * ML.ngroups,
                          cr + r * ML.ngroups);
        else if (row_tiles[r])
          vec.convert_bf16(ML, v, reinterpret_cast<uint16_t*>(dst) + r * 2 * ML.Kp);
        else
          pad_row_f32(ML, v, reinterpret_cast<float*>(dst) + r * ML.Kp);
      }
    });
  };
  // C[M, slab] for one expert's rows on tiles or vectors.
  auto gemm = [&](const MatLayout& ML, const uint8_t* W, const uint8_t* Ain, const float* sc, const int32_t* cr,
                  int64_t M, int64_t nb0, int64_t nb1, float* C, int64_t ldc) {
    if constexpr (kInt8) {
      const int8_t* a = reinterpret_cast<const int8_t*>(Ain);
      if (M >= min_rows)
        TileGemm<Tiles>::i8(vec, ML, W, a, 2 * ML.Kp, sc, cr, M, nb0, nb1, C, ldc);
      else
        vec.gemm_i8(ML, W, a, 2 * ML.Kp, sc, cr, M, nb0, nb1, C, ldc);
    } else if (M >= min_rows) {
      TileGemm<Tiles>::bf16(ML, W, reinterpret_cast<const uint16_t*>(Ain), 2 * ML.Kp, M, nb0, nb1, C, ldc);
    } else {
      vec.gemm_bf16(ML, W, reinterpret_cast<const float*>(Ain), ML.Kp, M, nb0, nb1, C, ldc);
    }
  };
  // Tasks (active expert, slab of n-blocks) over a matrix with nblocks.
  auto for_expert_slabs = [&](int64_t nblocks, auto&& fn) {
    const int64_t slabs = (nblocks + kSlabBlocks - 1) / kSlabBlocks;
    pool.parallel_for(static_cast<int64_t>(active.size()) * slabs, [&](int64_t task, int) {
      const int64_t e = active[task / slabs], s = task % slabs;
      fn(e, s * kSlabBlocks, std::min(nblocks, (s + 1) * kSlabBlocks));
    });
  };

  // 1. activations of every routed row: int8 per (row, group) with scales; bf16 (tiles) or f32 (vectors).
  convert_rows(GU, x, H, row_tok.data(), A, as, acorr);
  // 2. gate and up, then h = silu(gate) * up on the same slab.
  for_expert_slabs(GU.nblocks, [&](int64_t e, int64_t nb0, int64_t nb1) {
    const int64_t r0 = offs[e], M = offs[e + 1] - r0;
    const uint8_t* a = A + r0 * GU.Kp * ab;
    const float* sc = as + r0 * GU.ngroups;
    const int32_t* cr = acorr + r0 * GU.ngroups;
    gemm(GU, L.gate(blob, e), a, sc, cr, M, nb0, nb1, Hb + r0 * I, I);
    gemm(GU, L.up(blob, e), a, sc, cr, M, nb0, nb1, Ub + r0 * I, I);
    const int64_t c0 = nb0 * kTileN, c1 = std::min(I, nb1 * kTileN);
    for (int64_t r = r0; r < r0 + M; ++r) vec.silu_mul(Hb + r * I + c0, Ub + r * I + c0, c1 - c0);
  });
  // 3. h rows converted for the down projection.
  convert_rows(D, Hb, I, nullptr, Hq, hs, hcorr);
  // 4. down: Y [R, H].
  for_expert_slabs(D.nblocks, [&](int64_t e, int64_t nb0, int64_t nb1) {
    const int64_t r0 = offs[e], M = offs[e + 1] - r0;
    gemm(D, L.down_mat(blob, e), Hq + r0 * D.Kp * ab, hs + r0 * D.ngroups, hcorr + r0 * D.ngroups, M, nb0, nb1,
         Y + r0 * H, H);
  });
  // 5. out[t] = sum_j weights[t, j] * Y[row(t, j)], in slot order.
  pool.parallel_for(T, [&](int64_t t, int) {
    float* o = out + t * H;
    std::fill(o, o + H, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = row_of[t * k + j];
      if (r < 0) continue;
      const float w = weights[t * k + j];
      const float* y = Y + r * H;
      for (int64_t h = 0; h < H; ++h) o[h] += w * y[h];
    }
  });
}

// Tokens are independent, so a long prefill runs in passes of this many: the scratch stays bounded (about 100 MB for
// a Qwen3-30B-A3B layer, k = 8) while each expert still sees enough rows (~32 at E = 128) to fill its tiles.
constexpr int64_t kMaxTokensPerPass = 512;

// One layer forward (BackendOps::forward contract in tessera/backend.h).
template <class Tiles, WeightFormat Fmt>
void moe_forward(const char* backend, const uint8_t* blob, int64_t T, int64_t k, const int64_t* ids,
                 const float* weights, const float* x, float* out, ThreadPool& pool) {
  const LayerLayout L = read_layer(blob, backend, Fmt);
  for (int64_t t0 = 0; t0 < T; t0 += kMaxTokensPerPass) {
    const int64_t n = std::min(kMaxTokensPerPass, T - t0);
    moe_forward_pass<Tiles, Fmt>(L, blob, n, k, ids + t0 * k, weights + t0 * k, x + t0 * L.H, out + t0 * L.H, pool);
  }
}

}  // namespace tessera::amx
