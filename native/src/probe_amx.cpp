// AMX probe kernels: register-only tdpbf16ps and tdpbssd loops (the tile peaks AMXBF16's and AMXInt8's prefill are
// judged by). Compiled with the AMX flags only (native/cmake/amx.cmake); called only after CpuFeatures reports AMX
// usable (CPUID, XCR0 bits 17/18, XTILEDATA permission), never elsewhere: a tile instruction there raises SIGILL.
#include <chrono>
#include <cstdint>

#include "amx_tile_hw.h"
#include "probe_isa.h"

namespace tessera {
namespace {

using amx::TileConfig;
using amx::TileHw;

// Tiles 0-3: four independent 16x16 int32/fp32 accumulators (C = A x B with two A and two B tiles, like a 32x32
// block of the prefill kernels), tiles 4-5 A (16 rows x 64 bytes), 6-7 B (16 rows x 64 bytes). Every tile op reads
// registers only, so the loop measures the tile unit, not memory.
template <bool kBF16>
double tile_loop(int64_t iters) {
  const TileConfig cfg = TileConfig::full();
  alignas(64) static const uint8_t zeros[16 * 64] = {};
  TileHw::config(cfg);
  TileHw::zero<0>();
  TileHw::zero<1>();
  TileHw::zero<2>();
  TileHw::zero<3>();
  TileHw::load<4>(zeros, 64);
  TileHw::load<5>(zeros, 64);
  TileHw::load<6>(zeros, 64);
  TileHw::load<7>(zeros, 64);
  for (int64_t it = 0; it < iters; ++it) {
    if constexpr (kBF16) {
      TileHw::dpbf16ps<0, 4, 6>();
      TileHw::dpbf16ps<1, 4, 7>();
      TileHw::dpbf16ps<2, 5, 6>();
      TileHw::dpbf16ps<3, 5, 7>();
    } else {
      TileHw::dpbssd<0, 4, 6>();
      TileHw::dpbssd<1, 4, 7>();
      TileHw::dpbssd<2, 5, 6>();
      TileHw::dpbssd<3, 5, 7>();
    }
  }
  alignas(64) uint8_t out[16 * 64];
  TileHw::store<0>(out, 64);  // keeps the accumulator chain observable
  TileHw::release();
  volatile uint8_t keep = out[0];
  (void)keep;
  // Per instruction: 16 x 16 outputs, each a sum of 32 bf16 pairs (or 64 int8 pairs), mul + add each.
  return double(iters) * 4 * 16 * 16 * (kBF16 ? 32 : 64) * 2;
}

// 12 independent vfmadd231ps on registers zmm0-11 (zmm30/31 as operands): vector work with no memory traffic and no
// dependency on the tiles. Inline asm, so no AVX-512 compiler flag is needed here (the caller checked AVX-512).
__attribute__((always_inline)) inline void fma_block() {
  __asm__ volatile(
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm0\n\tvfmadd231ps %%zmm30, %%zmm31, %%zmm1\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm2\n\tvfmadd231ps %%zmm30, %%zmm31, %%zmm3\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm4\n\tvfmadd231ps %%zmm30, %%zmm31, %%zmm5\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm6\n\tvfmadd231ps %%zmm30, %%zmm31, %%zmm7\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm8\n\tvfmadd231ps %%zmm30, %%zmm31, %%zmm9\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm10\n\tvfmadd231ps %%zmm30, %%zmm31, %%zmm11\n\t" ::
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");
}

// One "item" of a quantized tile GEMM: 4 K-steps of a 32 x 32 block (per step 2 A + 2 B tile loads from L1 and 4
// TDPBSSD), the 4 C tiles zeroed before and stored after, as gemm_fold's items are; plus `blocks` fma_blocks of
// vector work, placed by `where`: 0 none (tiles only), 1 vector only (no tile instruction), 2 after the item's tiles
// (a whole epilogue after its tiles), 3 spread over the K-steps (a quarter after each step's TDPBSSDs).
template <int kWhere>
void overlap_items(int blocks, int64_t items, const int8_t* a, const int8_t* b, int32_t* c) {
  for (int64_t it = 0; it < items; ++it) {
    if (kWhere != 1) {
      TileHw::zero<0>();
      TileHw::zero<1>();
      TileHw::zero<2>();
      TileHw::zero<3>();
    }
    for (int ks = 0; ks < 4; ++ks) {
      if (kWhere != 1) {
        TileHw::load<4>(a + ks * 2048, 64);
        TileHw::load<6>(b + ks * 2048, 64);
        TileHw::load<5>(a + ks * 2048 + 1024, 64);
        TileHw::load<7>(b + ks * 2048 + 1024, 64);
        TileHw::dpbssd<0, 4, 6>();
        TileHw::dpbssd<1, 4, 7>();
        TileHw::dpbssd<2, 5, 6>();
        TileHw::dpbssd<3, 5, 7>();
      }
      if (kWhere == 3)
        for (int i = ks * blocks / 4; i < (ks + 1) * blocks / 4; ++i) fma_block();
    }
    if (kWhere != 1) {
      TileHw::store<0>(c, 64);
      TileHw::store<1>(c + 256, 64);
      TileHw::store<2>(c + 512, 64);
      TileHw::store<3>(c + 768, 64);
    }
    if (kWhere == 1 || kWhere == 2)
      for (int i = 0; i < blocks; ++i) fma_block();
  }
}

}  // namespace

AmxOverlapNs amx_overlap_probe(int fma_blocks, int64_t items) {
  const TileConfig cfg = TileConfig::full();
  alignas(64) static int8_t a[4 * 2048], b[4 * 2048];  // 16 KiB of operands: L1
  alignas(64) static int32_t c[4 * 256];
  for (int i = 0; i < 4 * 2048; ++i) a[i] = b[i] = int8_t(i % 7 - 3);
  TileHw::config(cfg);
  auto ns = [&](auto run) {
    run(items / 8 + 1);  // warm-up: the tile unit, the caches
    const auto t0 = std::chrono::steady_clock::now();
    run(items);
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / double(items);
  };
  AmxOverlapNs r;
  r.tiles_ns = ns([&](int64_t n) { overlap_items<0>(fma_blocks, n, a, b, c); });
  r.vector_ns = ns([&](int64_t n) { overlap_items<1>(fma_blocks, n, a, b, c); });
  r.after_ns = ns([&](int64_t n) { overlap_items<2>(fma_blocks, n, a, b, c); });
  r.spread_ns = ns([&](int64_t n) { overlap_items<3>(fma_blocks, n, a, b, c); });
  TileHw::release();
  return r;
}

double amx_bf16_loop(int64_t iters) { return tile_loop<true>(iters); }
double amx_int8_loop(int64_t iters) { return tile_loop<false>(iters); }

}  // namespace tessera
