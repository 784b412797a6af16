// Internal to the quantized kernels: the unpacked row tile, the quantized activation row, and the per-ISA kernel
// table that quant_driver.cpp calls. See tessera/quant.h for the arithmetic.
//
// Padded lengths: Kp = K rounded up to 64 (one zmm of codes); S16 = Kp / 16 rounded up to 16 (one zmm of f32).
// Padding is zero everywhere (codes, scales, activations), so it adds nothing.
//
// Row tile (up to kTileRows rows), row r:    u   [r * Kp + i]   uint8 code of value i
//                                            a4  [r * Kp/4 + i/4]  A of value i's group (one f32 per 4 values)
//                                            b16 [r * S16 + i/16]  B of value i's 16-group
// Activation row (one token):                q   [Kp] int8, d4 [Kp/4] dx of value i's 32-block, s16 [S16] dx * sum(q)
//
// Lane layout: 4 consecutive values form one int32 lane of vpdpbusd (and of AVX2 maddubs + madd), so a4[i/4] and
// d4[i/4] line up with lane i/4 and the f32 part is one multiply-add per lane.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tessera/quant.h"

namespace tessera {
namespace quant {

constexpr int kTileRows = 4;
constexpr int64_t kTokenBlock = 64;

inline int64_t padded_k(int64_t K) { return (K + 63) / 64 * 64; }
inline int64_t padded_s16(int64_t K) { return (padded_k(K) / 16 + 15) / 16 * 16; }

struct ActRow {
  const int8_t* q;
  const float* d4;
  const float* s16;
};

struct Kernels {
  QIsa isa;
  // x [K] -> q [Kp], d4 [Kp/4], s16 [S16] (padding zeroed).
  void (*quantize_row)(const float* x, int64_t K, int8_t* q, float* d4, float* s16);
  // rows [0, R) of W starting at `w` (row_bytes apart) -> the tile arrays (strides Kp, Kp/4, S16; padding zeroed).
  void (*unpack_rows)(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, uint8_t* u, float* a4, float* b16);
  // out[r] = sum_i w[r, i] x[i] for r < R, one token.  wide: codes may exceed 127 (QTypeInfo::wide).
  void (*dot_rows)(const uint8_t* u, const float* a4, const float* b16, int R, int64_t K, const ActRow& x, bool wide,
                   float* out);
  // Optional (nullptr: the driver uses unpack_rows + dot_rows): one row read straight from its blocks, codes and scales
  // kept in registers while nt <= kTokenBlock tokens pass over each 256 values; out[i] = row . xs[i].
  void (*dot_direct)(QType t, const uint8_t* row, int64_t K, const ActRow* xs, int nt, float* out);
};

const Kernels& kernels_reference();  // quant_ref.cpp
const Kernels& kernels_avx2();       // quant_avx2.cpp
const Kernels& kernels_avx512_vnni();  // quant_avx512_vnni.cpp

// IQ4_NL / IQ4_XS code book (ggml's kvalues_iq4nl).
constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

}  // namespace quant
}  // namespace tessera
