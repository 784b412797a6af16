// Several quantized GGUF weights that multiply the same activations (a layer's q/k/v projections) in one pool
// dispatch, the activations quantized once: quant_matvec_multi for one token (decode), quant_matmul_multi for T tokens
// (prefill). Same arithmetic as one quant_matmul per weight, bit for bit (the same row groups and kernels), so a caller
// may use either.
#pragma once
#include <cstdint>

#include "tessera/pool.h"
#include "tessera/quant.h"

namespace tessera {

// One weight of a fused mat-vec: out[N] = W[N, K] . x, W as its quantized rows (row_bytes apart); of a fused mat-mul:
// out[T, N] = x[T, K] . W^T.
struct QMatvecPart {
  QType type;
  const uint8_t* w;
  size_t row_bytes;
  int64_t N;
  float* out;
};

// x [K] f32; every part's K is this K. One activation quantization, one parallel_for over all parts' row groups.
void quant_matvec_multi(QIsa isa, const float* x, int64_t K, const QMatvecPart* parts, int n_parts, ThreadPool& pool);

// x [T, K] f32 (row-major); every part's K is this K, its out [T, N]. On AVX-512 VNNI from vnni_gemm_min_tokens
// tokens (tuning.h; default quant::kGemmMinTokens): one quantization, the tokens packed once per distinct GEMM
// packing, one parallel_for over all parts' row groups (quant_driver.cpp); at T = 1 quant_matvec_multi; otherwise
// one quant_matmul per part.
void quant_matmul_multi(QIsa isa, const float* x, int64_t T, int64_t K, const QMatvecPart* parts, int n_parts,
                        ThreadPool& pool);

}  // namespace tessera
