// The real AMX instructions behind the tile interface of amx_tile.h. Include only from a translation unit compiled
// with -mamx-tile -mamx-int8 -mamx-bf16, and call only after CpuFeatures reports AMX usable (CPUID, XCR0 bits 17/18
// and the XTILEDATA permission granted): on any other CPU the first tile instruction raises SIGILL.
#pragma once

#include <immintrin.h>

#include <cstddef>

#include "amx_tile.h"

#if !defined(__AMX_TILE__) || !defined(__AMX_INT8__) || !defined(__AMX_BF16__)
#error "amx_tile_hw.h needs -mamx-tile -mamx-int8 -mamx-bf16"
#endif

namespace tessera::amx {

// GCC's _tile_* macros paste their tile argument into the register name, so they cannot take a template parameter;
// the same instructions are written here with the tile number as an "i" operand printed by %c. Loads and stores
// clobber memory so the compiler keeps the surrounding stores and loads in order.
struct TileHw {
  static constexpr const char* kName = "hardware";
  static void config(const TileConfig& c) { __asm__ volatile("ldtilecfg %0" ::"m"(c) : "memory"); }
  static void release() { __asm__ volatile("tilerelease" ::: "memory"); }
  template <int T> static void zero() { __asm__ volatile("tilezero %%tmm%c0" ::"i"(T)); }
  template <int T> static void load(const void* p, std::ptrdiff_t stride) {
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(p), "r"(static_cast<long>(stride)), "i"(T) : "memory");
  }
  template <int T> static void store(void* p, std::ptrdiff_t stride) {
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(p), "r"(static_cast<long>(stride)), "i"(T) : "memory");
  }
  template <int C, int A, int B> static void dpbssd() {
    __asm__ volatile("tdpbssd %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
  }
  template <int C, int A, int B> static void dpbsud() {
    __asm__ volatile("tdpbsud %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
  }
  template <int C, int A, int B> static void dpbf16ps() {
    __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
  }
};

}  // namespace tessera::amx
