// Causal grouped-query attention over a bf16 KV cache, read in place (never widened as a whole, no T x S score matrix).
// Letters: T new query positions, nh query heads, nkv key/value heads (g = nh / nkv query heads per KV head), hd head
// dim, C cache capacity (positions allocated), start = positions already cached before these T, S = start + T.
#pragma once
#include <cstdint>
#include <string>

#include "tessera/pool.h"

namespace tessera {

struct AttentionArgs {
  const float* q;      // [nh, T, hd] f32 (or [T, nh, hd]: q_token_major), after q-norm and RoPE (not yet scaled)
  const uint16_t* kt;  // [nkv, ceil(C/32), hd, 32] bf16: keys in tiles of 32 positions
  const uint16_t* v;   // [nkv, C, hd] bf16
  int64_t T, nh, nkv, hd, C, start;
  float scale;         // applied to q (1/sqrt(hd) for Qwen3)
  float* out;          // [T, nh, hd] f32: query t at position start+t attends to keys [0, start+t]
  bool q_token_major = false;  // q is [T, nh, hd], as the q projection leaves it (attention_prepare's output)
};

// The step's work between the projections and the kernel (engine.model.Attention at any T): q and k normed per head
// (RMSNorm with q_norm / k_norm) and rotated (neox RoPE with cos/sin of each token's position); q in place, k and v
// rounded to bf16 (nearest even) into the cache at positions [start, start + T).
struct AttentionPrepareArgs {
  float* q;                     // [T, nh * hd] f32, rows q_stride floats apart: normed and rotated in place
  const float* k;               // [T, nkv * hd] f32, rows k_stride apart
  const float* v;               // [T, nkv * hd] f32, rows v_stride apart
  int64_t q_stride, k_stride, v_stride;
  const float* q_norm;          // [hd]
  const float* k_norm;          // [hd]
  const float* cos;             // [T, hd]
  const float* sin;             // [T, hd]
  float eps;
  int64_t T, nh, nkv, hd, C, start;
  uint16_t* kt;                 // [nkv, ceil(C/32), hd, 32] bf16 key tiles
  uint16_t* vc;                 // [nkv, C, hd] bf16 values
};
void attention_prepare(const AttentionPrepareArgs& a, ThreadPool& pool);

// Decode (T = 1): AVX512 (f32 products) where the CPU (and TESSERA_MAX_ISA) allows it and hd is a multiple of 32 up
// to 512, else the reference. Prefill (T > 1): AMX_BF16 (the same products on AMX tiles) where the CPU has AMX-BF16
// and Linux grants it, else AVX512_BF16 (vdpbf16ps; q and the probabilities rounded to bf16) where the CPU has
// avx512_bf16 (1.8x faster there; no faster at decode: docs/BENCHMARKS.md, "Attention prefill").
void attention_bf16(const AttentionArgs& a, ThreadPool& pool);
// The named kernel ("AMX_BF16", "AMX_BF16-emulated" (the AMX kernel on the portable tile emulator: tests, any CPU
// with avx512_bf16), "AVX512_BF16", "AVX512" or "Reference"); throws std::invalid_argument if it cannot run here.
void attention_bf16_with(const AttentionArgs& a, ThreadPool& pool, const std::string& kernel);
// Scalar, double accumulation, two passes (max, then exp-sum): the yardstick the fast kernel is tested against.
void attention_bf16_reference(const AttentionArgs& a, ThreadPool& pool);
// "AVX512" or "Reference": what attention_bf16 runs for a head dim of hd on this CPU at decode (T = 1).
const char* attention_kernel_name(int64_t hd);
// "AMX_BF16", "AVX512_BF16", "AVX512" or "Reference": what it runs at prefill (T > 1).
const char* attention_prefill_kernel_name(int64_t hd);

namespace attention_isa {
void attention_avx512(const AttentionArgs& a, ThreadPool& pool);
void attention_avx2(const AttentionArgs& a, ThreadPool& pool);  // CPUs without AVX-512 (f32 products)
void attention_avx512_bf16(const AttentionArgs& a, ThreadPool& pool);
// emulated: the tile emulator instead of the instructions (which run only where amx_bf16_usable()).
void attention_amx_bf16(const AttentionArgs& a, ThreadPool& pool, bool emulated);
}

}  // namespace tessera
