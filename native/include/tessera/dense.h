// Dense (non-expert) mat-vec for decode: out[T, N] = x[T, K] . W[N, K]^T with W kept as stored (bf16 or f16, row-major,
// the Hugging Face nn.Linear layout), x and out f32. Weights are widened to f32 exactly (bf16 -> f32 is a shift,
// f16 -> f32 is exact) and every product is exact inside an f32 FMA; sums accumulate in f32. Each weight is read from
// memory once per call whatever T is: a block of rows stays in L1 while every group of 4 tokens passes over it.
// Rows are split across the pool's participants (the caller included) in contiguous ranges.
#pragma once
#include <cstdint>

#include "tessera/backend.h"
#include "tessera/pool.h"

namespace tessera {

struct DenseArgs {
  WeightType type;      // BF16 or F16 (F32 weights stay with torch)
  const uint16_t* w;    // [N, K] row-major
  int64_t N, K;         // output features, input features
  int64_t T;            // tokens
  const float* x;       // [T, K]
  float* out;           // [T, N], overwritten
};

// Which kernel dense_matvec uses on this CPU under the TESSERA_MAX_ISA cap: "AVX512", "AVX2" or "Reference".
const char* dense_kernel_name();
// Runs the kernel dense_kernel_name() names. Preconditions (checked in bindings.cpp): N, K, T > 0, pointers valid.
void dense_matvec(const DenseArgs& a, ThreadPool& pool);
// The scalar twin with double accumulation (tests, the Reference level).
void dense_matvec_reference(const DenseArgs& a, ThreadPool& pool);

// One token through several matrices that multiply the same x (a layer's q/k/v projections) in one pool dispatch:
// parts[i].out[n] = sum_k parts[i].w[n, k] x[k]. The rows of all parts are split over the pool's participants as one
// range, so the short k/v matrices add no dispatch of their own; each row is summed exactly as dense_matvec sums it at
// T = 1 (bit-identical to one dense_matvec call per part). Preconditions: n >= 1, K > 0, every part's N > 0.
struct DenseMatvecPart {
  WeightType type;    // BF16 or F16
  const uint16_t* w;  // [N, K] row-major
  int64_t N;
  float* out;         // [N], overwritten
};
void dense_matvec_multi(const DenseMatvecPart* parts, int n, const float* x, int64_t K, ThreadPool& pool);

// Prefill GEMM on bf16 weights (dense_gemm_avx512_bf16.cpp): x is rounded once to bf16 (nearest even) and multiplied
// with vdpbf16ps (exact products, f32 sums, bf16 denormals flushed); each weight is read once per call whatever T is.
// Available when the CPU has avx512_bf16 and TESSERA_MAX_ISA allows AVX-512; callers check, then pass a.type == BF16.
bool dense_gemm_bf16_available();
// Which products dense_gemm_bf16 runs: Auto (AMX tiles where dense_gemm_bf16_amx_available(), else vdpbf16ps),
// Vector (vdpbf16ps only), Amx (the tiles; throws where unavailable), AmxEmulated (the tile emulator: tests on any
// avx512_bf16 CPU; the same bits as Amx).
enum class DenseTiles : int { Auto = 0, Vector = 1, Amx = 2, AmxEmulated = 3 };
// AMX bf16 tiles granted (CPUID, XCR0, the Linux permission) and TESSERA_MAX_ISA allows AMX, with avx512_bf16.
bool dense_gemm_bf16_amx_available();
void dense_gemm_bf16(const DenseArgs& a, ThreadPool& pool, DenseTiles tiles = DenseTiles::Auto);

// Prefill GEMM on bf16 or f16 weights for CPUs without avx512_bf16 (dense_gemm_avx2.cpp, AVX2 + FMA + F16C): each
// weight widened exactly to f32 once per call, x kept in f32, f32 FMA sums in K order (per (row, token) the same bits
// whatever T is). Available where the CPU has avx2/fma/f16c and TESSERA_MAX_ISA allows AVX2; callers check.
bool dense_gemm_f32_available();
void dense_gemm_f32(const DenseArgs& a, ThreadPool& pool);

// f32 rows (the router's weight at decode, decode_layer.cpp): out[r] = sum_j w[r, j] x[j] for r < rows, each row
// summed in one fixed order (16 lanes of products then sums, never fused; the K % 16 tail; the lanes in order), so
// every kernel gives the same bits: the ISA ones only read faster. Single-threaded: the caller splits the rows.
void dense_matvec_f32_rows(const float* w, int64_t rows, int64_t K, const float* x, float* out);
void dense_matvec_f32_rows_reference(const float* w, int64_t rows, int64_t K, const float* x, float* out);

namespace dense_isa {
void matvec_f32_rows_avx512(const float* w, int64_t rows, int64_t K, const float* x, float* out);
void matvec_f32_rows_avx2(const float* w, int64_t rows, int64_t K, const float* x, float* out);
void matvec_avx512(const DenseArgs& a, ThreadPool& pool);  // dense_avx512.cpp (AVX-512F)
void matvec_avx2(const DenseArgs& a, ThreadPool& pool);    // dense_avx2.cpp (AVX2 + FMA + F16C)
void matvec_multi_avx512(const DenseMatvecPart* parts, int n, const float* x, int64_t K, ThreadPool& pool);
void matvec_multi_avx2(const DenseMatvecPart* parts, int n, const float* x, int64_t K, ThreadPool& pool);
// dense_gemm_avx512_bf16.cpp (AVX512-BF16); tiles: Vector, Amx or AmxEmulated (resolved by dense_gemm_bf16)
void gemm_bf16_avx512(const DenseArgs& a, ThreadPool& pool, DenseTiles tiles);
void gemm_f32_avx2(const DenseArgs& a, ThreadPool& pool);  // dense_gemm_avx2.cpp (AVX2 + FMA + F16C)
}  // namespace dense_isa

}  // namespace tessera
