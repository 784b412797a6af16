// Packing for the AMX backends (layout in amx_layout.h): weight matrices to int8 tiles + scales or bf16 tiles, back
// to f32 for the round-trip tests, and the per-token activation conversions the kernels share (one implementation,
// so the tile path, the vector path and their tests round identically).
#pragma once

#include <cstdint>

#include "amx_layout.h"
#include "tessera/backend.h"

namespace tessera::amx {

// int8 group size used by AMXInt8 (a multiple of 64; 0 = one scale per output channel; at most kMaxInt8Group).
// Weights are quantized symmetrically per (row, group), activations per (token, group) with two int8 digits (below).
// Measured on a Qwen3-30B-A3B layer shape (H=2048, I=768, random weights, 64 tokens; relative L2 vs fp32, Gaussian /
// Student-t(4) activations): per channel 2.6 % / 4.3 %, G=128 2.0 % / 2.3 %, G=64 1.75 % / 2.0 % with one activation
// digit; with two digits the activations' share vanishes and G=64 leaves the weights' own ~1.04 % (numpy model of the
// same shape: G=64 weights alone 1.04 %, one-digit G=64 activations alone 1.39 %, both 1.73 %, two digits 1.04 %).
// G=64 (one epilogue per K tile) is kept: decode (the vector path) barely pays for it, and the tile path's epilogue
// is vectorized.
constexpr int64_t kInt8Group = 64;
// 254 * sum(hi * w) + sum(lo * w) stays within int32 up to 255 * 127 * 127 * 256 < 2^31 (amx_vec.h's contract).
constexpr int64_t kMaxInt8Group = 256;

// W [N, K] of `type` -> one packed matrix at dst (L.bytes, 64-byte aligned). int8: scale = amax / 127 per (n, group),
// q = round-to-nearest-even(clamp(w * (1 / scale), -127, 127)).
void pack_matrix(const MatLayout& L, WeightType type, const void* w, uint8_t* dst);
// One bf16 weight row w [K] of an int8 matrix, as pack_matrix quantizes it: out[k] = q + 128 for k < K and
// scales[g * scale_stride] = the scale of group g (0 for a group with no column). The scalar copy of VecKernels'
// quantize_weight_bf16 (amx_vec.h), which pack_matrix calls for bf16 weights.
void quantize_weight_row_bf16(const MatLayout& L, const uint16_t* w, uint8_t* out, float* scales, int64_t scale_stride);
// Packed matrix -> W [N, K] f32 (int8: q * scale).
void unpack_matrix(const MatLayout& L, const uint8_t* mat, float* w);

// x [K] -> two int8 digits per element, q[0, Kp) = hi and q[Kp, 2 Kp) = lo (zero beyond K), so that
// x ~ u * (254 * hi + lo) with, per group, s = amax / 127 (as for the weights), hi = q(x / s) (round to nearest even,
// clamped to +-127), r = x - hi * s, lo = q(r * (254 / s)) and u = s / 254 stored in scales[g]; corr[g] =
// 128 * (254 * sum(hi) + sum(lo)) (int32 modulo 2^32; the correction for the weights' +128 bias). The second digit
// takes the activations' quantization error from 1/254 of the group's amax down to ~1/64516 of it: the heavy-tailed
// silu(gate) * up rows were the largest error term with one digit (AVX512Int8 does the same, moe_avx512_int8.cpp).
// Tiles run the hi and lo rows as two A tiles against the same B tiles; the vector path loads each weight row once
// for both digits, so decode reads no more bytes.
void quantize_row_i8(const MatLayout& L, const float* x, int8_t* q, float* scales, int32_t* corr);
// x [K] -> [Kp] bf16 (round to nearest even, zero beyond K).
void convert_row_bf16(const MatLayout& L, const float* x, uint16_t* q);
// x [K] -> [Kp] f32 (zero beyond K): the bf16 vector path keeps activations in full precision.
void pad_row_f32(const MatLayout& L, const float* x, float* out);

// The whole layer (BackendOps pack / unpack / packed_bytes for AMXInt8 and AMXBF16).
LayerLayout layer_layout(WeightFormat fmt, const MoeDims& dims);
size_t packed_bytes(WeightFormat fmt, const MoeDims& dims);
void pack_layer(WeightFormat fmt, const char* backend, const MoeDims& dims, const WeightsIn& w, uint8_t* dst,
                ThreadPool& pool);
// Reads and checks both headers; throws std::invalid_argument naming the mismatch.
LayerLayout read_layer(const uint8_t* blob, const char* backend, WeightFormat fmt);
void unpack_expert(const uint8_t* blob, const char* backend, WeightFormat fmt, int64_t e, float* gate, float* up,
                   float* down);

}  // namespace tessera::amx
