// One decoder layer of a Qwen3-MoE model at T = 1 on the CPU, in one native call: input RMSNorm -> q/k/v mat-vecs ->
// per-head q/k RMSNorm -> RoPE (neox halves, as HF Qwen3) -> K/V appended to the bf16 cache in its tiled layout ->
// attention over the cache (attention_bf16) -> o_proj -> residual -> post-attention RMSNorm -> router mat-vec ->
// softmax / top-k / renormalise -> (optionally) the routed experts on quantized blocks (quant_moe_forward) or a backend's
// packed copy (BackendOps::forward) -> residual.
// It replaces ~60 small torch ops and Python calls per layer of a decode step with one call: the same arithmetic as
// tessera/engine/model.py's Python path (the same mat-vec kernels, bit for bit, for quantized and 16-bit weights), only
// the norms, RoPE, softmax and the f32 mat-vec sum in another order.
//
// Letters: H hidden size, nh query heads, nkv key/value heads, hd head dim, C cache capacity, E experts, k experts per
// token, I expert intermediate size.
#pragma once
#include <cstdint>

#include "tessera/backend.h"
#include "tessera/pool.h"
#include "tessera/quant.h"

namespace tessera {

// One dense weight W [N, K] as the model's Linear holds it (the nn.Linear layout, rows contiguous).
struct DecodeWeight {
  enum class Kind : int32_t { Quant = 0, BF16 = 1, F16 = 2, F32 = 3 };
  Kind kind = Kind::F32;
  QType qtype = QType::Q8_0;  // Kind::Quant only
  const void* w = nullptr;    // Quant: [N, row_bytes] uint8; BF16/F16: [N, K] uint16; F32: [N, K] float
  size_t row_bytes = 0;       // Quant only
  int64_t N = 0, K = 0;
};

// Everything about one layer that does not change between steps. Pointers are borrowed: the caller keeps them alive.
struct DecodeLayerPlan {
  int64_t H = 0, nh = 0, nkv = 0, hd = 0;
  float eps = 1e-6f;
  const float* input_norm = nullptr;  // [H]
  const float* post_norm = nullptr;   // [H]
  const float* q_norm = nullptr;      // [hd]
  const float* k_norm = nullptr;      // [hd]
  DecodeWeight q, k, v, o;            // [nh*hd, H], [nkv*hd, H], [nkv*hd, H], [H, nh*hd]
  bool has_router = false;            // an MoE layer; false: a dense-MLP layer (the caller runs its MLP)
  DecodeWeight router;                // [E, H]
  int64_t top_k = 0;
  bool norm_topk = true;              // renormalise the k weights to sum 1
  QIsa isa = QIsa::Reference;         // of the quantized mat-vecs (the one engine.dense's Linear uses: the best)
};

// The routed experts of one layer: on quantized blocks (tessera/quant.h's QMoeArgs without the per-call parts), or,
// when `packed_ops` is set, a backend's packed blob (tessera/backend.h) run by that backend's forward.
struct DecodeExperts {
  int64_t E = 0, I = 0;
  QWeights gate, up, down;  // [E, I, H], [E, I, H], [E, H, I] rows (blocks only)
  QIsa isa = QIsa::Reference;
  const BackendOps* packed_ops = nullptr;  // packed only: the backend that packed `packed` (its header names it)
  const uint8_t* packed = nullptr;         // packed only: the layer's blob, 64-byte aligned
};

// The per-step parts. x is not modified; every output is overwritten.
struct DecodeStep {
  const float* x = nullptr;  // [H] this layer's input (the residual stream)
  const float* cos = nullptr;  // [hd] of this position (engine.model.Rope.cos_sin)
  const float* sin = nullptr;  // [hd]
  uint16_t* kt = nullptr;      // [nkv, ceil(C/32), hd, 32] bf16: this layer's keys (position `start` is written)
  uint16_t* v = nullptr;       // [nkv, C, hd] bf16
  // Or a q8_0 cache (tessera/attention_q8.h; then kt and v are null): int8 keys/values and their f16 scales.
  int8_t* k8 = nullptr;
  uint16_t* ks = nullptr;
  int8_t* v8 = nullptr;
  uint16_t* vs = nullptr;
  int64_t C = 0, start = 0;    // capacity, this token's position (start < C; checked by the caller)
  float* h = nullptr;          // [H] out: x + attention
  float* normed = nullptr;     // [H] out: post_attention_layernorm(h)
  int64_t* ids = nullptr;      // [k] out (has_router): the chosen experts, by falling probability
  float* weights = nullptr;    // [k] out (has_router): their weights (renormalised when norm_topk)
  const DecodeExperts* experts = nullptr;  // optional (has_router): run them here too ...
  float* out = nullptr;                    // [H] ... and write h + experts(normed) here
};

// Runs the layer for one token on `pool`. Preconditions (checked in the bindings): shapes agree, start < C, hd even.
void decode_layer_step(const DecodeLayerPlan& plan, const DecodeStep& step, ThreadPool& pool);

// One layer of decode_stack_step: an MoE layer whose experts run in the same call.
struct DecodeStackLayer {
  const DecodeLayerPlan* plan = nullptr;   // has_router
  const DecodeExperts* experts = nullptr;  // E = plan->router.N
  uint16_t* kt = nullptr;                  // this layer's cache buffers (DecodeStep's kt, v)
  uint16_t* v = nullptr;
  int8_t* k8 = nullptr;                    // or a q8_0 cache's (DecodeStep's k8, ks, v8, vs)
  uint16_t* ks = nullptr;
  int8_t* v8 = nullptr;
  uint16_t* vs = nullptr;
  int64_t* ids = nullptr;                  // [k] out
  float* weights = nullptr;                // [k] out
  int64_t* counts = nullptr;               // [E] out: tokens routed to each expert (0 or 1 at T = 1)
};

// n consecutive layers for one token, layer i reading layer i-1's output: decode_layer_step per layer, with no return
// to the caller between layers (the pool's workers stay warm). x [H] in, out [H] the last layer's output; C, start as
// in DecodeStep (every layer's cache has capacity C).
void decode_stack_step(const DecodeStackLayer* layers, int n, const float* x, const float* cos, const float* sin,
                       int64_t C, int64_t start, float* out, ThreadPool& pool);

// out[N] = W[N, K] . x[K] for one weight of any kind, on the pool (the f32 kind sums in f32 in another order than
// torch; the others are the kernels engine.dense uses, bit for bit).
void decode_matvec(const DecodeWeight& w, QIsa isa, const float* x, float* out, ThreadPool& pool);

}  // namespace tessera
