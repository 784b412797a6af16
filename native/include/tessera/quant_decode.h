// Decode-step mat-vecs on quantized GGUF rows (one token): several weights that multiply the same activation row
// (a layer's q/k/v projections) in one pool dispatch, the row quantized once. Same arithmetic as quant_matmul at T = 1,
// bit for bit (the same row groups and kernels), so a caller may use either.
#pragma once
#include <cstdint>

#include "tessera/pool.h"
#include "tessera/quant.h"

namespace tessera {

// One weight of a fused mat-vec: out[N] = W[N, K] . x, W as its quantized rows (row_bytes apart).
struct QMatvecPart {
  QType type;
  const uint8_t* w;
  size_t row_bytes;
  int64_t N;
  float* out;
};

// x [K] f32; every part's K is this K. One activation quantization, one parallel_for over all parts' row groups.
void quant_matvec_multi(QIsa isa, const float* x, int64_t K, const QMatvecPart* parts, int n_parts, ThreadPool& pool);

}  // namespace tessera
