// Dense mat-vec: dispatch by CPU features under the TESSERA_MAX_ISA cap, and the scalar reference (double
// accumulation), which is also the Reference level's kernel. Portable: no ISA flags.
#include "tessera/dense.h"

#include <algorithm>
#include <stdexcept>

#include "tessera/bf16.h"
#include "tessera/cpu.h"

namespace tessera {
namespace {

enum class DenseKernel { Reference, AVX2, AVX512 };

DenseKernel pick() {
  static const DenseKernel k = [] {
    const CpuFeatures& c = cpu_features();
    if (c.avx512f && c.os_avx512 && max_isa_cap() >= IsaLevel::AVX512) return DenseKernel::AVX512;
    if (c.avx2 && c.fma && c.f16c && c.os_avx && max_isa_cap() >= IsaLevel::AVX2) return DenseKernel::AVX2;
    return DenseKernel::Reference;
  }();
  return k;
}

}  // namespace

const char* dense_kernel_name() {
  switch (pick()) {
    case DenseKernel::AVX512: return "AVX512";
    case DenseKernel::AVX2: return "AVX2";
    default: return "Reference";
  }
}

void dense_matvec_reference(const DenseArgs& a, ThreadPool& pool) {
  pool.run([&](int ith, int nth) {
    const int64_t per = (a.N + nth - 1) / nth;
    const int64_t r0 = std::min<int64_t>(a.N, ith * per), r1 = std::min<int64_t>(a.N, r0 + per);
    for (int64_t n = r0; n < r1; ++n) {
      const uint16_t* w = a.w + n * a.K;
      for (int64_t t = 0; t < a.T; ++t) {
        const float* x = a.x + t * a.K;
        double s = 0.0;
        for (int64_t k = 0; k < a.K; ++k)
          s += double(a.type == WeightType::BF16 ? bf16_to_f32(w[k]) : f16_to_f32(w[k])) * double(x[k]);
        a.out[t * a.N + n] = float(s);
      }
    }
  });
}

void dense_matvec(const DenseArgs& a, ThreadPool& pool) {
  switch (pick()) {
    case DenseKernel::AVX512: dense_isa::matvec_avx512(a, pool); break;
    case DenseKernel::AVX2: dense_isa::matvec_avx2(a, pool); break;
    default: dense_matvec_reference(a, pool); break;
  }
}

void dense_matvec_multi(const DenseMatvecPart* parts, int n, const float* x, int64_t K, ThreadPool& pool) {
  switch (pick()) {
    case DenseKernel::AVX512: dense_isa::matvec_multi_avx512(parts, n, x, K, pool); break;
    case DenseKernel::AVX2: dense_isa::matvec_multi_avx2(parts, n, x, K, pool); break;
    default:  // the Reference level: one exact call per part
      for (int i = 0; i < n; ++i)
        dense_matvec_reference(DenseArgs{parts[i].type, parts[i].w, parts[i].N, K, 1, x, parts[i].out}, pool);
      break;
  }
}

// The order every f32-rows kernel follows (dense.h); no ISA flags here, so no fused multiply-adds.
void dense_matvec_f32_rows_reference(const float* w, int64_t rows, int64_t K, const float* x, float* out) {
  constexpr int kLanes = 16;
  for (int64_t n = 0; n < rows; ++n) {
    const float* r = w + n * K;
    float acc[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= K; j += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += r[j + l] * x[j + l];
    float s = 0.0f;
    for (; j < K; ++j) s += r[j] * x[j];
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    out[n] = s;
  }
}

void dense_matvec_f32_rows(const float* w, int64_t rows, int64_t K, const float* x, float* out) {
  switch (pick()) {
    case DenseKernel::AVX512: dense_isa::matvec_f32_rows_avx512(w, rows, K, x, out); break;
    case DenseKernel::AVX2: dense_isa::matvec_f32_rows_avx2(w, rows, K, x, out); break;
    default: dense_matvec_f32_rows_reference(w, rows, K, x, out); break;
  }
}

bool dense_gemm_bf16_available() {
  static const bool ok = [] {
    const CpuFeatures& c = cpu_features();
    return c.avx512f && c.avx512bw && c.avx512vl && c.avx512dq && c.avx512_bf16 && c.os_avx512 &&
           max_isa_cap() >= IsaLevel::AVX512;
  }();
  return ok;
}

bool dense_gemm_f32_available() {
  static const bool ok = [] {
    const CpuFeatures& c = cpu_features();
    return c.avx2 && c.fma && c.f16c && c.os_avx && max_isa_cap() >= IsaLevel::AVX2;
  }();
  return ok;
}

void dense_gemm_f32(const DenseArgs& a, ThreadPool& pool) {
  if (!dense_gemm_f32_available()) throw std::runtime_error("dense_gemm_f32: this CPU (or TESSERA_MAX_ISA) has no AVX2");
  if (a.type != WeightType::BF16 && a.type != WeightType::F16)
    throw std::invalid_argument("dense_gemm_f32: w must be bfloat16 or float16");
  dense_isa::gemm_f32_avx2(a, pool);
}

bool dense_gemm_bf16_amx_available() {
  static const bool ok = [] {
    const CpuFeatures& c = cpu_features();
    return dense_gemm_bf16_available() && c.amx_tile && c.amx_bf16 && c.os_amx && c.amx_permitted &&
           max_isa_cap() >= IsaLevel::AMX;
  }();
  return ok;
}

void dense_gemm_bf16(const DenseArgs& a, ThreadPool& pool, DenseTiles tiles) {
  if (!dense_gemm_bf16_available()) throw std::runtime_error("dense_gemm_bf16: this CPU (or TESSERA_MAX_ISA) has no avx512_bf16");
  if (a.type != WeightType::BF16) throw std::invalid_argument("dense_gemm_bf16: w must be bfloat16");
  if (tiles == DenseTiles::Amx && !dense_gemm_bf16_amx_available())
    throw std::runtime_error("dense_gemm_bf16: AMX bf16 tiles are not available here (CPU, OS or TESSERA_MAX_ISA)");
  if (tiles == DenseTiles::Auto) tiles = dense_gemm_bf16_amx_available() ? DenseTiles::Amx : DenseTiles::Vector;
  dense_isa::gemm_bf16_avx512(a, pool, tiles);
}

}  // namespace tessera
