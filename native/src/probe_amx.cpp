// AMX probe kernels: register-only tdpbf16ps and tdpbssd loops (the tile peaks AMXBF16's and AMXInt8's prefill are
// judged by). Compiled with the AMX flags only (native/cmake/amx.cmake); called only after CpuFeatures reports AMX
// usable (CPUID, XCR0 bits 17/18, XTILEDATA permission), never elsewhere: a tile instruction there raises SIGILL.
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
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.tile(t, 16, 64);
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

}  // namespace

double amx_bf16_loop(int64_t iters) { return tile_loop<true>(iters); }
double amx_int8_loop(int64_t iters) { return tile_loop<false>(iters); }

}  // namespace tessera
