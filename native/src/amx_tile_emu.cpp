// Portable AMX emulator. Every operation follows the pseudocode of its SDM Vol. 2 page; comments quote the steps.
#include "amx_tile_emu.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

namespace tessera::amx::emu {

namespace {

[[noreturn]] void fault(const std::string& what) { throw TileFault("AMX emulator: " + what); }

std::string tile_name(int t) { return "tmm" + std::to_string(t); }

void check_index(int t, const char* op) {
  if (t < 0 || t >= kNumTiles) fault(std::string(op) + ": no tile register " + std::to_string(t));
}

// AMX-E3/E5: the tiles must be configured and the named tile valid (rows and colsb both nonzero).
void check_valid(int t, const char* op) {
  check_index(t, op);
  const TileState& s = state();
  if (!s.configured) fault(std::string(op) + ": tiles are not configured (LDTILECFG first)");
  if (s.cfg.rows[t] == 0 || s.cfg.colsb[t] == 0) fault(std::string(op) + ": " + tile_name(t) + " is not configured");
}

// AMX-E4 shape rules for the dot-product instructions.
void check_dp(int c, int a, int b, const char* op) {
  check_valid(c, op);
  check_valid(a, op);
  check_valid(b, op);
  if (c == a || c == b || a == b) fault(std::string(op) + ": tile operands must be distinct registers");
  const TileConfig& g = state().cfg;
  if (g.colsb[c] % 4 || g.colsb[a] % 4 || g.colsb[b] % 4) fault(std::string(op) + ": colsb must be a multiple of 4");
  if (g.rows[c] != g.rows[a])
    fault(std::string(op) + ": " + tile_name(c) + ".rows != " + tile_name(a) + ".rows");
  if (g.colsb[a] / 4 != g.rows[b])
    fault(std::string(op) + ": " + tile_name(a) + ".colsb/4 != " + tile_name(b) + ".rows");
  if (g.colsb[c] != g.colsb[b])
    fault(std::string(op) + ": " + tile_name(c) + ".colsb != " + tile_name(b) + ".colsb");
}

// write_row_and_zero + zero_upper_rows: the bytes of the tile beyond rows x colsb are zero after every write.
void zero_outside_shape(int t) {
  TileState& s = state();
  const int rows = s.cfg.rows[t], colsb = s.cfg.colsb[t];
  uint8_t* d = s.data[t];
  for (int r = 0; r < rows; ++r) std::memset(d + r * kMaxColsb + colsb, 0, kMaxColsb - colsb);
  std::memset(d + rows * kMaxColsb, 0, static_cast<size_t>(kMaxRows - rows) * kMaxColsb);
}

inline int32_t load_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline float daz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

}  // namespace

TileState& state() {
  static thread_local TileState s;
  return s;
}

void ldtilecfg(const TileConfig& cfg) {
  // palette 0 is the INIT state; palette 1 is the only other legal value.
  if (cfg.palette_id > 1) fault("ldtilecfg: palette " + std::to_string(cfg.palette_id) + " is not supported (#GP)");
  TileState& s = state();
  if (cfg.palette_id == 0) {
    tilerelease();
    return;
  }
  for (uint8_t b : cfg.reserved0)
    if (b) fault("ldtilecfg: reserved bytes 2..15 must be zero (#GP)");
  for (int t = 0; t < 16; ++t) {
    if (t >= kNumTiles) {
      if (cfg.colsb[t] || cfg.rows[t]) fault("ldtilecfg: tile " + std::to_string(t) + " is beyond max_names (#GP)");
      continue;
    }
    if (cfg.colsb[t] > kMaxColsb) fault("ldtilecfg: " + tile_name(t) + ".colsb > 64 (#GP)");
    if (cfg.rows[t] > kMaxRows) fault("ldtilecfg: " + tile_name(t) + ".rows > 16 (#GP)");
    if ((cfg.rows[t] == 0) != (cfg.colsb[t] == 0))
      fault("ldtilecfg: " + tile_name(t) + " has only one of rows and colsb set (#GP)");
  }
  s.cfg = cfg;
  std::memset(s.data, 0, sizeof(s.data));  // zero_all_tile_data()
  s.configured = true;
}

void tilerelease() {
  TileState& s = state();
  s.cfg = TileConfig{};
  std::memset(s.data, 0, sizeof(s.data));
  s.configured = false;
}

void tilezero(int t) {
  check_valid(t, "tilezero");
  std::memset(state().data[t], 0, kTileBytes);
}

void tileloadd(int t, const void* base, std::ptrdiff_t stride) {
  check_valid(t, "tileloadd");
  TileState& s = state();
  const int rows = s.cfg.rows[t], colsb = s.cfg.colsb[t];
  const uint8_t* src = static_cast<const uint8_t*>(base);
  for (int r = s.cfg.start_row; r < rows; ++r) std::memcpy(s.data[t] + r * kMaxColsb, src + r * stride, colsb);
  zero_outside_shape(t);
  s.cfg.start_row = 0;
}

void tilestored(int t, void* base, std::ptrdiff_t stride) {
  check_valid(t, "tilestored");
  TileState& s = state();
  const int rows = s.cfg.rows[t], colsb = s.cfg.colsb[t];
  uint8_t* dst = static_cast<uint8_t*>(base);
  for (int r = s.cfg.start_row; r < rows; ++r) std::memcpy(dst + r * stride, s.data[t] + r * kMaxColsb, colsb);
  s.cfg.start_row = 0;
}

namespace {

// TDPBSSD / TDPBSUD: DPBD with tsrc1 signed and tsrc2 signed or unsigned (zero-extended), int32 wrap-around.
template <bool kBSigned>
void dp_int8(int c, int a, int b, const char* op) {
  check_dp(c, a, b, op);
  TileState& s = state();
  const int rows = s.cfg.rows[c], kq = s.cfg.colsb[a] / 4, nq = s.cfg.colsb[c] / 4;
  for (int m = 0; m < rows; ++m) {
    uint8_t* crow = s.data[c] + m * kMaxColsb;
    const int8_t* arow = reinterpret_cast<const int8_t*>(s.data[a] + m * kMaxColsb);
    for (int n = 0; n < nq; ++n) {
      // DPBD(tmp.dword[n], tsrc1.row[m].dword[k], tsrc2.row[k].dword[n]) for k = 0..kq-1
      uint32_t acc = static_cast<uint32_t>(load_i32(crow + 4 * n));
      for (int k = 0; k < kq; ++k) {
        const uint8_t* bq = s.data[b] + k * kMaxColsb + 4 * n;
        for (int q = 0; q < 4; ++q) {
          const int32_t bv = kBSigned ? static_cast<int32_t>(static_cast<int8_t>(bq[q])) : static_cast<int32_t>(bq[q]);
          acc += static_cast<uint32_t>(static_cast<int32_t>(arow[4 * k + q]) * bv);
        }
      }
      std::memcpy(crow + 4 * n, &acc, 4);
    }
  }
  zero_outside_shape(c);
  s.cfg.start_row = 0;
}

}  // namespace

void tdpbssd(int c, int a, int b) { dp_int8<true>(c, a, b, "tdpbssd"); }
void tdpbsud(int c, int a, int b) { dp_int8<false>(c, a, b, "tdpbsud"); }

float bf16_to_fp32_daz(uint16_t x) {
  // make_fp32: the bf16 bits in the upper half of a dword; input denormals are treated as zero.
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return daz(f);
}

float fma_daz_ftz(float a, float b, float c) {
  a = daz(a);
  b = daz(b);
  c = daz(c);
  const float r = std::fma(a, b, c);  // correctly rounded (RNE), gradual underflow
  const float mag = std::fabs(r);
  if (mag > FLT_MIN || std::isnan(r)) return r;
  if (mag < FLT_MIN) return std::copysign(0.0f, r);  // tiny after rounding at any exponent range: flushed
  // |r| == FLT_MIN: the exact result may lie just below it and round up only because of the denormal grid. Round it
  // again with the exponent range extended (scaling by 2^24 is exact here) to decide tininess as x86 does.
  const float scaled = std::fma(a * 0x1p24f, b, c * 0x1p24f);
  return std::fabs(scaled) < FLT_MIN * 0x1p24f ? std::copysign(0.0f, r) : r;
}

float add_daz_ftz(float a, float b) {
  // A sum of two floats smaller than 2^-125 in magnitude is exact, so tininess before/after rounding agree.
  const float r = daz(a) + daz(b);
  return std::fabs(r) < FLT_MIN ? std::copysign(0.0f, r) : r;
}

void tdpbf16ps(int c, int a, int b) {
  check_dp(c, a, b, "tdpbf16ps");
  TileState& s = state();
  const int rows = s.cfg.rows[c], kp = s.cfg.colsb[a] / 4, nd = s.cfg.colsb[c] / 4;
  float temp1[2 * kMaxColsb / 4];
  for (int m = 0; m < rows; ++m) {
    const uint8_t* arow = s.data[a] + m * kMaxColsb;
    uint8_t* crow = s.data[c] + m * kMaxColsb;
    for (int i = 0; i < 2 * nd; ++i) temp1[i] = 0.0f;
    for (int k = 0; k < kp; ++k) {
      const float a0 = bf16_to_fp32_daz(load_u16(arow + 4 * k));
      const float a1 = bf16_to_fp32_daz(load_u16(arow + 4 * k + 2));
      const uint8_t* brow = s.data[b] + k * kMaxColsb;
      for (int n = 0; n < nd; ++n) {
        temp1[2 * n + 0] = fma_daz_ftz(a0, bf16_to_fp32_daz(load_u16(brow + 4 * n)), temp1[2 * n + 0]);
        temp1[2 * n + 1] = fma_daz_ftz(a1, bf16_to_fp32_daz(load_u16(brow + 4 * n + 2)), temp1[2 * n + 1]);
      }
    }
    for (int n = 0; n < nd; ++n) {
      const float tmp = add_daz_ftz(temp1[2 * n], temp1[2 * n + 1]);
      const float out = add_daz_ftz(load_f32(crow + 4 * n), tmp);
      std::memcpy(crow + 4 * n, &out, 4);
    }
  }
  zero_outside_shape(c);
  s.cfg.start_row = 0;
}

}  // namespace tessera::amx::emu
