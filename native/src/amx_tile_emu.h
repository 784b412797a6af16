// Portable AMX tile emulator: the palette-1 tile state of the calling thread and the operations the AMX kernels use,
// following the SDM pseudocode (LDTILECFG, TILERELEASE, TILEZERO, TILELOADD, TILESTORED, TDPBSSD, TDPBF16PS).
// A use the hardware would fault on (#GP from LDTILECFG, #UD from the AMX-E3/E4/E5 rules) throws TileFault instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "amx_tile.h"

namespace tessera::amx {

class TileFault : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace emu {

// One thread's architectural tile state (TILECFG + TILEDATA). Tiles are thread state, as on the hardware.
struct TileState {
  TileConfig cfg;           // all zero in the INIT state
  bool configured = false;  // TILES_CONFIGURED
  alignas(64) uint8_t data[kNumTiles][kTileBytes] = {};
};
TileState& state();

void ldtilecfg(const TileConfig& cfg);
void tilerelease();
void tilezero(int t);
void tileloadd(int t, const void* base, std::ptrdiff_t stride);
void tilestored(int t, void* base, std::ptrdiff_t stride);
void tdpbssd(int c, int a, int b);
void tdpbsud(int c, int a, int b);
void tdpbf16ps(int c, int a, int b);

// The scalar arithmetic of TDPBF16PS, exposed for tests: an fp32 FMA / add with DAZ on inputs, FTZ on the output
// (tininess after rounding, as x86 detects it) and round-to-nearest-even.
float bf16_to_fp32_daz(uint16_t bf16);
float fma_daz_ftz(float a, float b, float c);
float add_daz_ftz(float a, float b);

}  // namespace emu

struct TileEmu {
  static constexpr const char* kName = "emulated";
  static void config(const TileConfig& c) { emu::ldtilecfg(c); }
  static void release() { emu::tilerelease(); }
  template <int T> static void zero() { emu::tilezero(T); }
  template <int T> static void load(const void* p, std::ptrdiff_t stride) { emu::tileloadd(T, p, stride); }
  template <int T> static void store(void* p, std::ptrdiff_t stride) { emu::tilestored(T, p, stride); }
  template <int C, int A, int B> static void dpbssd() { emu::tdpbssd(C, A, B); }
  template <int C, int A, int B> static void dpbsud() { emu::tdpbsud(C, A, B); }
  template <int C, int A, int B> static void dpbf16ps() { emu::tdpbf16ps(C, A, B); }
};

}  // namespace tessera::amx
