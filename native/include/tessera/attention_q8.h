// Causal grouped-query attention over a q8_0 KV cache (int8 keys and values, one f16 scale per 32 values of one
// position and KV head: the granularity of llama.cpp's `-ctk q8_0 -ctv q8_0`), read in place, and the block quantizer
// that writes it. Half the bytes of the bf16 cache (plus 1/16 for the scales), for decode at long contexts, where
// reading the cache is the cost.
//
// Layout (positions in tiles of 32; C, the capacity, a multiple of 32; hd a multiple of 32; nb = hd / 32):
//   k  [nkv, C/32, hd/4, 32, 4] int8   per tile: for each group of 4 dims, 32 keys x those 4 dims (one VNNI operand
//                                      per 16 keys)
//   v  [nkv, C/4, hd, 4] int8          per group of 4 positions: every dim x those 4 positions
//   ks [nkv, C/32, nb, 32] f16 bits    per tile: for each block of 32 dims, the 32 keys' scales
//   vs [nkv, C/32, nb, 32] f16 bits    the same for the values
// Value of key j, dim d: k[j][d] * f16(ks[j][d/32]) (values likewise).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "tessera/bf16.h"
#include "tessera/pool.h"

namespace tessera {

constexpr int64_t kQ8Block = 32;  // values per scale (along the head dim) and positions per tile

struct AttentionQ8Args {
  const float* q;       // [nh, T, hd] f32, after q-norm and RoPE (not yet scaled)
  const int8_t* k;      // [nkv, C/32, hd/4, 32, 4]
  const uint16_t* ks;   // [nkv, C/32, hd/32, 32] f16
  const int8_t* v;      // [nkv, C/4, hd, 4]
  const uint16_t* vs;   // [nkv, C/32, hd/32, 32] f16
  int64_t T, nh, nkv, hd, C, start;
  float scale;          // applied to q (1/sqrt(hd) for Qwen3)
  float* out;           // [T, nh, hd] f32: query t at position start+t attends to keys [0, start+t]
};

// AVX512_VNNI where the CPU (and TESSERA_MAX_ISA) allows it and hd is a multiple of 32 up to 512, else AVX2 (AVX2 + FMA
// + F16C, the same head dims), else the reference.
void attention_q8(const AttentionQ8Args& a, ThreadPool& pool);
// The named kernel ("AVX512_VNNI", "AVX2" or "Reference"); throws std::invalid_argument if it cannot run here.
void attention_q8_with(const AttentionQ8Args& a, ThreadPool& pool, const std::string& kernel);
// Scalar, double accumulation over the dequantized cache: the yardstick the fast kernel is tested against.
void attention_q8_reference(const AttentionQ8Args& a, ThreadPool& pool);
// "AVX512_VNNI", "AVX2" or "Reference": what attention_q8 runs for a head dim of hd on this CPU.
const char* attention_q8_kernel_name(int64_t hd);

namespace attention_isa {
void attention_q8_avx512_vnni(const AttentionQ8Args& a, ThreadPool& pool);
void attention_q8_avx2(const AttentionQ8Args& a, ThreadPool& pool);
}

// f32 -> f16 bits, round to nearest even (numpy's npy_floatbits_to_halfbits; torch's .to(float16) rounds the same).
inline uint16_t f32_to_f16(float x) {
  uint32_t f;
  std::memcpy(&f, &x, 4);
  const uint16_t sign = uint16_t((f & 0x80000000u) >> 16);
  uint32_t e = f & 0x7f800000u;
  if (e >= 0x47800000u) {  // overflow, inf or NaN
    if ((f & 0x7fffffffu) > 0x7f800000u) return uint16_t(sign | 0x7e00u);
    return uint16_t(sign | 0x7c00u);
  }
  if (e <= 0x38000000u) {  // subnormal half or zero
    if (e < 0x33000000u) return sign;
    e >>= 23;
    uint32_t sig = 0x00800000u + (f & 0x007fffffu);
    sig >>= (113 - e);
    if ((sig & 0x00003fffu) != 0x00001000u || (f & 0x000007ffu)) sig += 0x00001000u;
    return uint16_t(sign | (sig >> 13));
  }
  uint32_t sig = f & 0x007fffffu;
  if ((sig & 0x00003fffu) != 0x00001000u) sig += 0x00001000u;
  return uint16_t(sign + (((e - 0x38000000u) >> 13) + (sig >> 13)));  // a carry into the exponent is correct
}

// One block of 32 values to q8_0: d = amax / 127 rounded to f16 (capped at f16's largest), q = round(x / d) (half to
// even) clamped to [-127, 127], 0 where d is 0. The same arithmetic as engine.kv_cache.quantize_q8_0 (f32 division,
// then rounding), so both paths store identical bytes.
inline void quantize_q8_block(const float* x, int8_t* q, uint16_t* d16) {
  float amax = 0.0f;
  for (int i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(x[i]));
  *d16 = f32_to_f16(std::min(amax / 127.0f, 65504.0f));
  const float d = f16_to_f32(*d16);
  for (int i = 0; i < kQ8Block; ++i)
    q[i] = d > 0.0f ? int8_t(std::clamp(std::nearbyint(x[i] / d), -127.0f, 127.0f)) : int8_t(0);
}

// Writes position `pos` of KV head h (k, v: hd values each) into a q8_0 cache of capacity C (layout above).
inline void write_q8_position(const float* k, const float* v, int64_t h, int64_t pos, int64_t hd, int64_t C,
                              int8_t* kc, uint16_t* ks, int8_t* vc, uint16_t* vs) {
  const int64_t tiles = C / kQ8Block, tile = pos / kQ8Block, lane = pos % kQ8Block, nb = hd / kQ8Block;
  int8_t* kt = kc + (h * tiles + tile) * hd * kQ8Block;         // [hd/4][32][4]
  int8_t* vt = vc + (h * C + (pos / 4) * 4) * hd;               // [hd][4]
  uint16_t* kst = ks + (h * tiles + tile) * nb * kQ8Block;      // [nb][32]
  uint16_t* vst = vs + (h * tiles + tile) * nb * kQ8Block;
  for (int64_t b = 0; b < nb; ++b) {
    // dim d = b*32 + i: key byte at [(d/4)][lane][d%4]; i = 4*g + c -> offset ((b*8 + g) * 32 + lane) * 4 + c
    int8_t kq[kQ8Block], vq[kQ8Block];
    quantize_q8_block(k + b * kQ8Block, kq, kst + b * kQ8Block + lane);
    quantize_q8_block(v + b * kQ8Block, vq, vst + b * kQ8Block + lane);
    for (int i = 0; i < kQ8Block; ++i) {
      kt[((b * 8 + i / 4) * kQ8Block + lane) * 4 + i % 4] = kq[i];
      vt[(b * kQ8Block + i) * 4 + pos % 4] = vq[i];
    }
  }
}

}  // namespace tessera
