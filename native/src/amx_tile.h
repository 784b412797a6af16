// The AMX tile interface the AMX kernels are written against (Intel AMX, palette 1).
//
// A tile back end is a struct with these static members (tile numbers are template arguments because the real
// instructions take them as immediates):
//   config(const TileConfig&)        LDTILECFG: validate the 64-byte image, zero all tile data
//   release()                        TILERELEASE: back to the INIT state
//   zero<t>()                        TILEZERO
//   load<t>(const void* p, stride)   TILELOADD: rows x colsb bytes, row r at p + r*stride, rest of the tile zeroed
//   store<t>(void* p, stride)        TILESTORED: rows x colsb bytes
//   dpbssd<c, a, b>()                TDPBSSD: C[m][n] += sum_q A[m].s8[4k+q] * B[k].s8[4n+q], int32, wraps
//   dpbsud<c, a, b>()                TDPBSUD: the same with B's bytes unsigned (packed int8 weights are stored +128)
//   dpbf16ps<c, a, b>()              TDPBF16PS: bf16 pairs, fp32 accumulate, DAZ/FTZ, RNE
// Two implement it: TileEmu (amx_tile_emu.h, portable, follows the SDM pseudocode) and TileHw (amx_tile_hw.h, the
// real instructions; only ever called after CpuFeatures says AMX is usable).
#pragma once

#include <cstdint>

namespace tessera::amx {

constexpr int kNumTiles = 8;    // palette 1: max_names
constexpr int kMaxRows = 16;    // palette 1: max_rows
constexpr int kMaxColsb = 64;   // palette 1: bytes_per_row
constexpr int kTileBytes = kMaxRows * kMaxColsb;

// The LDTILECFG memory image (SDM Vol. 2, LDTILECFG, Table "Memory Area Layout").
struct alignas(64) TileConfig {
  uint8_t palette_id = 0;
  uint8_t start_row = 0;
  uint8_t reserved0[14] = {};
  uint16_t colsb[16] = {};  // only tiles 0..7 may be nonzero in palette 1
  uint8_t rows[16] = {};    // only tiles 0..7 may be nonzero in palette 1

  // Sets one tile's shape and selects palette 1.
  TileConfig& tile(int t, int nrows, int ncolsb) {
    palette_id = 1;
    rows[t] = static_cast<uint8_t>(nrows);
    colsb[t] = static_cast<uint16_t>(ncolsb);
    return *this;
  }
  // All eight tiles at their largest shape (16 rows x 64 bytes), palette 1: what the 2x2 kernels and probes run.
  static TileConfig full() {
    TileConfig c;
    for (int t = 0; t < kNumTiles; ++t) c.tile(t, kMaxRows, kMaxColsb);
    return c;
  }
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads exactly 64 bytes");

}  // namespace tessera::amx
