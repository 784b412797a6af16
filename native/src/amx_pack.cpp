// Packing and activation conversion for the AMX backends (portable C++; runs once per load, not per token).
#include "amx_pack.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "amx_vec.h"
#include "tessera/bf16.h"

namespace tessera::amx {

namespace {

// One source row [K] of any loaded weight type to f32.
void row_to_f32(WeightType type, const void* base, int64_t row, int64_t K, float* out) {
  const size_t off = static_cast<size_t>(row) * K;
  switch (type) {
    case WeightType::F32:
      std::memcpy(out, static_cast<const float*>(base) + off, K * sizeof(float));
      break;
    case WeightType::BF16: {
      const uint16_t* p = static_cast<const uint16_t*>(base) + off;
      for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_f32(p[k]);
      break;
    }
    case WeightType::F16: {
      const uint16_t* p = static_cast<const uint16_t*>(base) + off;
      for (int64_t k = 0; k < K; ++k) out[k] = f16_to_f32(p[k]);
      break;
    }
  }
}

// round-to-nearest-even of |v| < 2^22 without a libm call (vectorizes; exact under the default rounding mode, which
// -ffp-contract=off and no -ffast-math keep the compiler from reassociating).
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

inline int8_t quantize_value(float v, float inv_scale) {
  const float c = std::clamp(v * inv_scale, -127.0f, 127.0f);
  return c == c ? static_cast<int8_t>(round_even(c)) : 0;  // NaN: its group's scale is NaN and carries it instead
}

inline float inverse(float scale) { return scale == 0.0f ? 0.0f : 1.0f / scale; }

// amax / 127 over x[k0, k1) of the real (unpadded) columns.
// A NaN anywhere in the group makes the scale NaN, so the products of the group stay NaN as in float arithmetic.
inline float group_scale(const float* x, int64_t k0, int64_t k1) {
  float amax = 0.0f;
  bool nan = false;
  for (int64_t k = k0; k < k1; ++k) {
    amax = std::max(amax, std::fabs(x[k]));
    nan |= x[k] != x[k];
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f;
}

// One f32 weight row [K] -> out[k] = q + 128 (k < K) and scales[g * scale_stride] per group (pack_matrix's rule).
void quantize_weight_row(const MatLayout& L, const float* row, uint8_t* out, float* scales, int64_t scale_stride) {
  for (int64_t g = 0; g < L.ngroups; ++g) {
    const int64_t k0 = g * L.group, k1 = std::min(L.K, k0 + L.group);
    const float s = k0 < k1 ? group_scale(row, k0, k1) : 0.0f;
    scales[g * scale_stride] = s;
    const float inv = inverse(s);
    for (int64_t k = k0; k < k1; ++k) out[k] = static_cast<uint8_t>(quantize_value(row[k], inv) + 128);
  }
}

}  // namespace

void quantize_weight_row_bf16(const MatLayout& L, const uint16_t* w, uint8_t* out, float* scales,
                              int64_t scale_stride) {
  thread_local std::vector<float> row;  // pack_layer's workers call this once per weight row
  row.resize(L.K);
  for (int64_t k = 0; k < L.K; ++k) row[k] = bf16_to_f32(w[k]);
  quantize_weight_row(L, row.data(), out, scales, scale_stride);
}

void pack_matrix(const MatLayout& L, WeightType type, const void* w, uint8_t* dst) {
  std::memset(dst + L.tile_bytes, 0, L.bytes - L.tile_bytes);
  // One n-block at a time: its 16 rows converted into a row-major staging block [16][Kp] of the stored element
  // (int8 + 128, or bf16; zero weights beyond N and K), then each tile row gathered as 4-byte quads / pairs.
  const VecKernels& vec = vec_best();
  std::vector<float> row(L.K);
  std::vector<uint32_t> stage(static_cast<size_t>(kTileN) * L.Kp / (L.fmt == WeightFormat::Int8 ? 4 : 2));
  const size_t stage_row = stage.size() / kTileN;  // dwords per staged row
  for (int64_t nb = 0; nb < L.nblocks; ++nb) {
    if (L.fmt == WeightFormat::Int8) {
      std::memset(stage.data(), 128, stage.size() * 4);
      float* scales = reinterpret_cast<float*>(dst + L.scale_offset) + nb * L.ngroups * kTileN;
      for (int64_t lane = 0; lane < kTileN && nb * kTileN + lane < L.N; ++lane) {
        uint8_t* out = reinterpret_cast<uint8_t*>(stage.data() + lane * stage_row);
        const int64_t n = nb * kTileN + lane;
        if (type == WeightType::BF16) {  // the files' common type: the vector table's copy of the rule
          vec.quantize_weight_bf16(L, static_cast<const uint16_t*>(w) + n * L.K, out, scales + lane, kTileN);
        } else {
          row_to_f32(type, w, n, L.K, row.data());
          quantize_weight_row(L, row.data(), out, scales + lane, kTileN);
        }
      }
    } else {
      std::memset(stage.data(), 0, stage.size() * 4);
      for (int64_t lane = 0; lane < kTileN && nb * kTileN + lane < L.N; ++lane) {
        row_to_f32(type, w, nb * kTileN + lane, L.K, row.data());
        uint16_t* out = reinterpret_cast<uint16_t*>(stage.data() + lane * stage_row);
        for (int64_t k = 0; k < L.K; ++k) out[k] = f32_to_bf16(row[k]);
      }
    }
    // tile (nb, kb) row r, dword n = staged row n, dword kb*16 + r (a K quad of int8 or a K pair of bf16)
    for (int64_t kb = 0; kb < L.kblocks; ++kb) {
      uint32_t* t = reinterpret_cast<uint32_t*>(dst + static_cast<size_t>(nb * L.kblocks + kb) * kBTileBytes);
      for (int r = 0; r < 16; ++r)
        for (int n = 0; n < kTileN; ++n) t[r * 16 + n] = stage[n * stage_row + kb * 16 + r];
    }
  }
}

void unpack_matrix(const MatLayout& L, const uint8_t* mat, float* w) {
  for (int64_t n = 0; n < L.N; ++n) {
    const int64_t nb = n / kTileN, lane = n % kTileN;
    for (int64_t k = 0; k < L.K; ++k) {
      float v;
      if (L.fmt == WeightFormat::Int8) {
        const uint8_t* t = L.tile(mat, nb, k / kTileKInt8);
        const int64_t kk = k % kTileKInt8;
        const int q = static_cast<int>(t[(kk / 4) * 64 + lane * 4 + kk % 4]) - 128;
        v = static_cast<float>(q) * L.scales(mat, nb)[(k / L.group) * kTileN + lane];
      } else {
        const uint8_t* t = L.tile(mat, nb, k / kTileKBF16);
        const int64_t kk = k % kTileKBF16;
        uint16_t b;
        std::memcpy(&b, t + (kk / 2) * 64 + lane * 4 + (kk % 2) * 2, 2);
        v = bf16_to_f32(b);
      }
      w[n * L.K + k] = v;
    }
  }
}

void quantize_row_i8(const MatLayout& L, const float* x, int8_t* q, float* scales, int32_t* corr) {
  int8_t* lo = q + L.Kp;
  for (int64_t g = 0; g < L.ngroups; ++g) {
    const int64_t k0 = g * L.group, k1 = std::min(L.K, k0 + L.group);
    const float s = k0 < k1 ? group_scale(x, k0, k1) : 0.0f;
    scales[g] = s / 254.0f;
    const float inv = inverse(s), inv_lo = inv * 254.0f;
    uint32_t sum_hi = 0, sum_lo = 0;
    for (int64_t k = k0; k < k1; ++k) {
      q[k] = quantize_value(x[k], inv);
      const float r = x[k] - static_cast<float>(q[k]) * s;  // |r| <= s / 2 (NaN where x is)
      lo[k] = quantize_value(r, inv_lo);
      sum_hi += static_cast<uint32_t>(static_cast<int32_t>(q[k]));
      sum_lo += static_cast<uint32_t>(static_cast<int32_t>(lo[k]));
    }
    corr[g] = static_cast<int32_t>(128u * (254u * sum_hi + sum_lo));
  }
  if (L.Kp > L.K) {
    std::memset(q + L.K, 0, L.Kp - L.K);
    std::memset(lo + L.K, 0, L.Kp - L.K);
  }
}

void convert_row_bf16(const MatLayout& L, const float* x, uint16_t* q) {
  for (int64_t k = 0; k < L.K; ++k) q[k] = f32_to_bf16(x[k]);
  for (int64_t k = L.K; k < L.Kp; ++k) q[k] = 0;
}

void pad_row_f32(const MatLayout& L, const float* x, float* out) {
  std::memcpy(out, x, L.K * sizeof(float));
  for (int64_t k = L.K; k < L.Kp; ++k) out[k] = 0.0f;
}

LayerLayout layer_layout(WeightFormat fmt, const MoeDims& d) {
  return LayerLayout::make(fmt, d.E, d.H, d.I, fmt == WeightFormat::Int8 ? kInt8Group : 0);
}

size_t packed_bytes(WeightFormat fmt, const MoeDims& dims) { return layer_layout(fmt, dims).bytes; }

void pack_layer(WeightFormat fmt, const char* backend, const MoeDims& dims, const WeightsIn& w, uint8_t* dst,
                ThreadPool& pool) {
  const LayerLayout L = layer_layout(fmt, dims);
  write_header(dst, backend, dims, w.type);
  AmxHeader h{};
  std::memcpy(h.magic, kAmxMagic, 8);
  h.format = static_cast<int32_t>(fmt);
  h.group = static_cast<int32_t>(fmt == WeightFormat::Int8 ? kInt8Group : 0);
  h.E = L.E;
  h.H = L.H;
  h.I = L.I;
  h.gate_offset = L.gate_offset;
  h.up_offset = L.up_offset;
  h.down_offset = L.down_offset;
  std::memcpy(dst + 64, &h, sizeof h);
  const size_t esize = w.type == WeightType::F32 ? 4 : 2;
  const size_t in_gate = static_cast<size_t>(dims.I * dims.H) * esize;
  pool.parallel_for(3 * dims.E, [&](int64_t task, int) {
    const int64_t e = task / 3, which = task % 3;
    if (which == 0)
      pack_matrix(L.gate_up, w.type, static_cast<const uint8_t*>(w.gate) + e * in_gate,
                  const_cast<uint8_t*>(L.gate(dst, e)));
    else if (which == 1)
      pack_matrix(L.gate_up, w.type, static_cast<const uint8_t*>(w.up) + e * in_gate,
                  const_cast<uint8_t*>(L.up(dst, e)));
    else
      pack_matrix(L.down, w.type, static_cast<const uint8_t*>(w.down) + e * in_gate,
                  const_cast<uint8_t*>(L.down_mat(dst, e)));
  });
}

LayerLayout read_layer(const uint8_t* blob, const char* backend, WeightFormat fmt) {
  const MoeDims dims = read_header(blob, backend);
  AmxHeader h;
  std::memcpy(&h, blob + 64, sizeof h);
  if (std::memcmp(h.magic, kAmxMagic, 8) != 0)
    throw std::invalid_argument(std::string(backend) + ": packed with another AMX layout revision; repack");
  if (h.format != static_cast<int32_t>(fmt))
    throw std::invalid_argument(std::string(backend) + ": packed for another weight format");
  if (fmt == WeightFormat::Int8 && (h.group < kTileKInt8 || h.group > kMaxInt8Group || h.group % kTileKInt8 != 0))
    throw std::invalid_argument(std::string(backend) + ": int8 group " + std::to_string(h.group) +
                                " in the AMX header is not a multiple of 64 in [64, " + std::to_string(kMaxInt8Group) +
                                "]; repack");
  const LayerLayout L = LayerLayout::make(fmt, dims.E, dims.H, dims.I, h.group);
  if (h.E != L.E || h.H != L.H || h.I != L.I || h.gate_offset != L.gate_offset || h.up_offset != L.up_offset ||
      h.down_offset != L.down_offset)
    throw std::invalid_argument(std::string(backend) + ": AMX header does not match the layer dimensions");
  return L;
}

void unpack_expert(const uint8_t* blob, const char* backend, WeightFormat fmt, int64_t e, float* gate, float* up,
                   float* down) {
  const LayerLayout L = read_layer(blob, backend, fmt);
  if (e < 0 || e >= L.E) throw std::invalid_argument(std::string(backend) + ": expert index out of range");
  unpack_matrix(L.gate_up, L.gate(blob, e), gate);
  unpack_matrix(L.gate_up, L.up(blob, e), up);
  unpack_matrix(L.down, L.down_mat(blob, e), down);
}

}  // namespace tessera::amx
