// Portable scalar twin of the AMX backends' vector kernels (contract in amx_vec.h).
#include <cmath>
#include <cstring>
#include <limits>

#include "amx_pack.h"
#include "amx_tile_emu.h"
#include "amx_vec.h"
#include "tessera/bf16.h"
#include "tessera/cpu.h"

namespace tessera::amx {

namespace {

void gemm_i8(const MatLayout& L, const uint8_t* W, const int8_t* A, int64_t lda, const float* ascale,
             const int32_t* corr, int64_t M, int64_t nb0, int64_t nb1, float* C, int64_t ldc) {
  const int64_t kpg = L.kblocks_per_group();
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* hi = A + m * lda;
    const int8_t* lo = hi + L.Kp;
    for (int64_t nb = nb0; nb < nb1; ++nb) {
      float facc[16] = {};
      for (int64_t g = 0; g < L.ngroups; ++g) {
        int32_t acc_hi[16] = {}, acc_lo[16] = {};
        for (int64_t kb = g * kpg; kb < (g + 1) * kpg; ++kb) {
          const uint8_t* t = L.tile(W, nb, kb);
          const int64_t k0 = kb * kTileKInt8;
          for (int r = 0; r < 16; ++r)
            for (int n = 0; n < 16; ++n)
              for (int q = 0; q < 4; ++q) {
                const int32_t w = t[r * 64 + 4 * n + q];
                acc_hi[n] += int32_t(hi[k0 + 4 * r + q]) * w;
                acc_lo[n] += int32_t(lo[k0 + 4 * r + q]) * w;
              }
        }
        i8_group_epilogue(acc_hi, acc_lo, L.scales(W, nb) + g * kTileN, ascale[m * L.ngroups + g],
                          corr[m * L.ngroups + g], facc);
      }
      for (int n = 0; n < 16 && nb * 16 + n < L.N; ++n) C[m * ldc + nb * 16 + n] = facc[n];
    }
  }
}

void gemm_bf16(const MatLayout& L, const uint8_t* W, const float* A, int64_t lda, int64_t M, int64_t nb0,
               int64_t nb1, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m) {
    const float* a = A + m * lda;
    for (int64_t nb = nb0; nb < nb1; ++nb) {
      float e[16] = {}, o[16] = {};
      for (int64_t kb = 0; kb < L.kblocks; ++kb) {
        const uint8_t* t = L.tile(W, nb, kb);
        for (int r = 0; r < 16; ++r) {
          const float a0 = a[kb * kTileKBF16 + 2 * r], a1 = a[kb * kTileKBF16 + 2 * r + 1];
          for (int n = 0; n < 16; ++n) {
            uint16_t b[2];
            std::memcpy(b, t + r * 64 + 4 * n, 4);
            e[n] = std::fma(a0, bf16_to_f32(b[0]), e[n]);
            o[n] = std::fma(a1, bf16_to_f32(b[1]), o[n]);
          }
        }
      }
      for (int n = 0; n < 16 && nb * 16 + n < L.N; ++n) C[m * ldc + nb * 16 + n] = e[n] + o[n];
    }
  }
}

void i8_epilogue(const int32_t* hi, const int32_t* lo, const float* wscale, const float* ascale, const int32_t* corr,
                 int64_t as_stride, int rows, float* facc, int64_t ldf) {
  for (int r = 0; r < rows; ++r)
    i8_group_epilogue(hi + r * 16, lo + r * 16, wscale, ascale[r * as_stride], corr[r * as_stride], facc + r * ldf);
}

void silu_mul_rows(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = silu_mul(g[i], u[i]);
}

void dequant_bf16(const MatLayout& L, const uint8_t* W, int64_t nb, uint16_t* out) {
  const float* sc = L.scales(W, nb);
  for (int64_t k = 0; k < L.Kp; ++k) {
    const uint8_t* t = L.tile(W, nb, k / kTileKInt8);
    const int64_t kk = k % kTileKInt8;
    for (int n = 0; n < kTileN; ++n) {
      const float v = static_cast<float>(static_cast<int>(t[(kk / 4) * 64 + n * 4 + kk % 4]) - 128) *
                      sc[(k / L.group) * kTileN + n];
      const float flushed = std::fabs(v) < std::numeric_limits<float>::min() ? std::copysign(0.0f, v) : v;
      out[(k / 32) * 512 + ((k % 32) / 2) * 32 + 2 * n + k % 2] = f32_to_bf16(flushed);
    }
  }
}

}  // namespace

const VecKernels& vec_scalar() {
  static const VecKernels k{"scalar", gemm_i8, gemm_bf16, i8_epilogue, silu_mul_rows, quantize_row_i8,
                            convert_row_bf16, dequant_bf16, quantize_weight_row_bf16};
  return k;
}

const VecKernels& vec_best() {
  const CpuFeatures& c = cpu_features();
  const bool avx512 = c.os_avx512 && c.avx512f && c.avx512bw && c.avx512vl && c.avx512_vnni;
  const VecKernels* v = c.avx512_bf16 ? vec_avx512_bf16() : vec_avx512();
  return (avx512 && v && int(max_isa_cap()) >= int(IsaLevel::AVX512)) ? *v : vec_scalar();
}

}  // namespace tessera::amx
