// The vector half of the AMX backends: the same packed tiles read as 512-bit rows (one row = 16 output lanes), used
// for experts with few tokens (decode) where tiles would sit mostly empty. Two implementations with one contract:
// AVX-512 VNNI/FMA (amx_vec_avx512.cpp, its own translation unit) and a portable scalar twin (amx_vec_scalar.cpp).
//
// Contract (both formats): for rows m < M and outputs n in [nb0*16, min(nb1*16, N)),
//   int8: A row m holds two activation digits (amx_pack.h quantize_row_i8): hi at A[m*lda + k], lo at
//         A[m*lda + Kp + k], k < Kp. With hi_g / lo_g the int32 dot products of those digits with the stored (+128)
//         weight bytes of row n over group g, and d_g = 254 * hi_g + lo_g - corr[m*ngroups + g] (int32, modulo 2^32:
//         the exact signed dot product of 254 * hi + lo with the weights, which fits in int32 for groups <= 256),
//         C[m*ldc + n] = sum_g ((float)d_g * wscale[g][n]) * ascale[m*ngroups + g]   (sum in g order from 0);
//   bf16: A is f32 (decode keeps full-precision activations; only the tiles need bf16 ones):
//         C[m*ldc + n] = e + o, where e and o start at 0 and take, for k = 0, 2, 4, ... in order,
//         e = fma(A[m][k], W[n][k], e) and o = fma(A[m][k+1], W[n][k+1], o)   (IEEE fp32, RNE, no flushing).
// A rows hold Kp elements (zero beyond K; int8: two digit rows of Kp) at stride lda (elements); C is the row base
// (column n at C[m*ldc + n]).
#pragma once

#include <cstdint>

#include "amx_layout.h"

namespace tessera::amx {

struct VecKernels {
  const char* name;
  void (*gemm_i8)(const MatLayout& L, const uint8_t* W, const int8_t* A, int64_t lda, const float* ascale,
                  const int32_t* corr, int64_t M, int64_t nb0, int64_t nb1, float* C, int64_t ldc);
  void (*gemm_bf16)(const MatLayout& L, const uint8_t* W, const float* A, int64_t lda, int64_t M, int64_t nb0,
                    int64_t nb1, float* C, int64_t ldc);
  // The tile path's int8 group epilogue over the stored C tiles of the hi and lo digits: for r < rows, n < 16,
  //   facc[r*ldf + n] += ((float)d * wscale[n]) * ascale[r*as_stride],
  //   d = 254 * hi[r*16 + n] + lo[r*16 + n] - corr[r*as_stride] (int32 modulo 2^32, as in gemm_i8)
  void (*i8_epilogue)(const int32_t* hi, const int32_t* lo, const float* wscale, const float* ascale,
                      const int32_t* corr, int64_t as_stride, int rows, float* facc, int64_t ldf);
  // g[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u with exp as exp_poly below: the same bits on either variant.
  void (*silu_mul)(float* g, const float* u, int64_t n);
  // Activation rows as amx_pack.h's quantize_row_i8 / convert_row_bf16 define them, bit for bit.
  void (*quantize_i8)(const MatLayout& L, const float* x, int8_t* q, float* scales, int32_t* corr);
  void (*convert_bf16)(const MatLayout& L, const float* x, uint16_t* q);
  // n-block nb of an int8 matrix (L) as bf16 tiles in amx_layout.h's bf16 layout: out[kb * 512 + r * 32 + 2 n + q] =
  // bf16(float(w_q) * scale) for K = 32 kb + 2 r + q, kb < Kp / 32 (f32_to_bf16: round to nearest even, NaN quiet;
  // a product below FLT_MIN in magnitude becomes a signed zero first, as VCVTNE2PS2BF16 does), w_q the stored byte -
  // 128 and scale its (lane, group)'s; the same bits on every variant.
  void (*dequant_bf16)(const MatLayout& L, const uint8_t* W, int64_t nb, uint16_t* out);
  // Packing (once per load): a bf16 weight row of an int8 matrix quantized as amx_pack.h's quantize_weight_row_bf16
  // defines it, the same bits on every variant.
  void (*quantize_weight_bf16)(const MatLayout& L, const uint16_t* w, uint8_t* out, float* scales,
                               int64_t scale_stride);
};

const VecKernels& vec_scalar();
// nullptr when the AVX-512 translation unit was not compiled (non-x86 builds).
const VecKernels* vec_avx512();
// vec_avx512's table with dequant_bf16 on VCVTNE2PS2BF16, for CPUs with avx512_bf16 (nullptr likewise).
const VecKernels* vec_avx512_bf16();
// AVX-512 when the CPU and OS have avx512f/bw/vl + avx512_vnni (and TESSERA_MAX_ISA allows avx512; with avx512_bf16
// vec_avx512_bf16's table), else the scalar twin.
const VecKernels& vec_best();

// exp(x) for the activation, one operation sequence for every variant (the AVX-512 one repeats it lane-wise, and
// -ffp-contract=off keeps both unfused): Cephes' expf polynomial after x = n ln2 + r, relative error ~1e-7; inputs are
// clamped to [-88, 88] (exp(-88) is a normal float, exp(88) finite), which silu's quotient absorbs.
namespace exp_poly {
constexpr float kLo = -88.0f, kHi = 88.0f, kLog2e = 1.44269504088896341f, kC1 = 0.693359375f, kC2 = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f, kRound = 12582912.0f;  // 1.5 * 2^23
inline float exp(float x) {
  x = x < kLo ? kLo : (x > kHi ? kHi : x);
  const float n = (x * kLog2e + kRound) - kRound;  // round to nearest even
  float r = x - n * kC1;
  r = r - n * kC2;
  float p = kP0;
  p = p * r + kP1;
  p = p * r + kP2;
  p = p * r + kP3;
  p = p * r + kP4;
  p = p * r + kP5;
  const float y = (p * (r * r) + r) + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-127, 127]
  float two_n;
  __builtin_memcpy(&two_n, &bits, 4);
  return y * two_n;
}
}  // namespace exp_poly

inline float silu_mul(float g, float u) { return g / (1.0f + exp_poly::exp(-g)) * u; }

// 254 * hi + lo - corr in int32 modulo 2^32 (unsigned arithmetic: wrapping is defined; the true value fits).
inline int32_t i8_two_digit_dot(int32_t hi, int32_t lo, int32_t corr) {
  return static_cast<int32_t>(254u * static_cast<uint32_t>(hi) + static_cast<uint32_t>(lo) - static_cast<uint32_t>(corr));
}

// The int8 epilogue of one group for 16 lanes, shared by every path (tiles included) so all round identically.
inline void i8_group_epilogue(const int32_t* hi, const int32_t* lo, const float* wscale, float ascale, int32_t corr,
                              float* facc) {
  for (int n = 0; n < 16; ++n) facc[n] += (static_cast<float>(i8_two_digit_dot(hi[n], lo[n], corr)) * wscale[n]) * ascale;
}

}  // namespace tessera::amx
