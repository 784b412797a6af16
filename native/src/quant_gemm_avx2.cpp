// Quantized prefill GEMM, AVX2: R weight rows (one driver task, <= kRowGroup) times nt tokens (<= kTokenBlock) on
// the file's blocks, for every type of quant_kernels.h: the AVX2 twin of quant_gemm_avx512.cpp, for CPUs without
// AVX-512. AVX2 has no vpdpbusd; AVX-VNNI's 256-bit one (a CPUID flag of its own: Intel Core from the 12th
// generation, most of today's Intel desktops) is quant_gemm_avx_vnni.cpp, the same body with vpdpbusd for the dot.
//
// Why a GEMM: the AVX2 row path (quant_avx2.cpp) runs every token over a 4-row tile: per 32 values of one (row, token)
// a maddubs, a madd, an int -> f32 conversion, a multiply by A * dx and an FMA into a lane accumulator, then a
// horizontal sum. Here the 8 lanes of a ymm are 8 tokens, their int8 activations transposed so that one int32 lane
// holds 4 consecutive values of one token; 4 consecutive codes of a row are broadcast and vpmaddubsw multiplies them
// by those 8 tokens' 4 values (32 MACs, int16 pair sums). The int16 pair sums of several steps are added in int16 while
// they provably cannot overflow (below), then one vpmaddwd by ones widens them to int32; the group's sub-scale A_g is
// applied once per (row, 16- or 32-value group, 8 tokens) in f32, the token scale dx once per (row, 256 values, 8
// tokens), the B term (Q4_K/Q5_K mins) as a small f32 GEMM of B_g by dx * sum(q). No horizontal sums.
//
// int16 bounds (activations q in [-127, 127], quant_body.inc clamps them; vpmaddubsw saturates past 32767):
//   Q4_0, Q4_K  codes 0..15: one vpmaddubsw lane <= 2 * 15 * 127 = 3810,  8 steps (a 32-group) in int16 <= 30480
//   Q5_K        codes 0..31: <= 7874,  4 steps in int16 <= 31496
//   Q6_K        codes 0..63: <= 16002, 2 steps in int16 <= 32004
//   Q8_0, IQ4_XS (codes u = s + 128, s in [-128, 127]): the sign trick, |s| x sign(q, s) <= 2 * 128 * 127 = 32512,
//               one step per vpmaddwd; A * u - B = A * s exactly (B = 128 A), so no B term and no offset.
// Q4_0 and Q6_K subtract their code offset (8, 32) as an integer start z = -off * sum(q) of each group's dot, as the
// AVX-512 GEMM does. So every group's dot is the exact integer sum_i (u_i - off) q_i, as in every other path.
//
// The body is quant_gemm_avx2_body.inc, shared with quant_gemm_avx_vnni.cpp. Steps per call: (1) transpose the
// tokens' activations 8 at a time (or take them packed once per call); (2) per 4 rows, decode them once into a
// per-thread scratch (u8 codes, f32 A_g and B_g: the same values as quant_body.inc's unpack, by SIMD per block; wide types also
// get the signed codes), then for every 8-token group the register micro-kernel (4 rows x 8 tokens:
// int16 and int32 group sums and f32 partial sums per 256 values in 12 ymm). Rows past R are decoded as zeros and not
// stored; tokens past nt are zero and not stored.
//
// Arithmetic: not bit-identical to the row path (that one rounds a product per 4 values in f32; this one per group,
// as the AVX-512 GEMM), held to Reference at NMSE 1e-10 like the AVX-512 GEMM; each (row, token) result depends only on
// that row and that token (lanes and rows never mix), not on which other rows or tokens share the call.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "quant_kernels.h"

#include "isa_target.h"

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX2)
#include "avx2_transpose.h"  // after BEGIN: compiled for this file's ISA

namespace tessera {
namespace quant {
namespace {

#define TESSERA_AVX2_GEMM_VNNI 0
#include "quant_gemm_avx2_body.inc"
#undef TESSERA_AVX2_GEMM_VNNI

}  // namespace

void gemm_avx2(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt, float* out) {
  gemm_types(t, w, row_bytes, R, K, xs, nt, out);
}

void gemm_avx2_packed(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tokens, int nt,
                      float* out) {
  packed_types(t, w, row_bytes, R, K, tokens, nt, out);
}

void gemm_avx2_pack(QType t, int64_t K, const ActRow* xs, int nt, uint8_t* dst) { pack_types(t, K, xs, nt, dst); }

size_t gemm_avx2_packed_bytes(QType t, int64_t K, int nt) {
  return size_t((nt + kLanes - 1) / kLanes) * TokLayout(padded_k256(K), t == QType::Q6_K ? 16 : 32).group;
}

bool gemm_avx2_same_packing(QType a, QType b) {
  auto mode = [](QType t) {  // what a group holds besides xt and dx: 0 nothing, 1 sb, 2 + offset: z
    return t == QType::Q4_K || t == QType::Q5_K ? 1 : (t == QType::Q4_0 || t == QType::Q6_K) ? 2 + code_offset(t) : 0;
  };
  return (a == QType::Q6_K) == (b == QType::Q6_K) && mode(a) == mode(b);  // same G, same sb / z term
}

void silu_mul_avx2(float* g, const float* u, int64_t n) {
  // silu_mul_avx512's exp (Cephes expf's split of ln2 and polynomial), with 2^m built in the exponent bits: the
  // argument is clamped to [-88, 88] first, so m stays in [-127, 127] and exp stays finite. Past the clamp silu
  // saturates as the scalar one does, to within f32 rounding: g -> -inf gives g / e^88 (~1e-38 g: tiny, not -0), g ->
  // +inf gives g; NaN stays NaN (the clamp passes it through: max/min return their second operand for NaN).
  using E = ExpfCephes;
  const __m256 log2e = _mm256_set1_ps(E::kLog2e), c1 = _mm256_set1_ps(E::kC1), c2 = _mm256_set1_ps(E::kC2),
               one = _mm256_set1_ps(1.0f), hi = _mm256_set1_ps(88.0f), lo = _mm256_set1_ps(-88.0f);
  const __m256 p0 = _mm256_set1_ps(E::kP[0]), p1 = _mm256_set1_ps(E::kP[1]), p2 = _mm256_set1_ps(E::kP[2]),
               p3 = _mm256_set1_ps(E::kP[3]), p4 = _mm256_set1_ps(E::kP[4]), p5 = _mm256_set1_ps(E::kP[5]);
  const __m256i bias = _mm256_set1_epi32(127), lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::min<int64_t>(8, n - i))), lanes);
    const __m256 gv = _mm256_maskload_ps(g + i, m), uv = _mm256_maskload_ps(u + i, m);
    const __m256 x = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_sub_ps(_mm256_setzero_ps(), gv)));  // exp(-g)
    const __m256 e2 = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 r = _mm256_fnmadd_ps(e2, c2, _mm256_fnmadd_ps(e2, c1, x));
    __m256 p = _mm256_fmadd_ps(p0, r, p1);
    p = _mm256_fmadd_ps(p, r, p2);
    p = _mm256_fmadd_ps(p, r, p3);
    p = _mm256_fmadd_ps(p, r, p4);
    p = _mm256_fmadd_ps(p, r, p5);
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, one));  // 1 + r + r^2 P(r)
    const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(e2), bias), 23));
    const __m256 ex = _mm256_mul_ps(p, scale);
    _mm256_maskstore_ps(g + i, m, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, ex)), uv));
  }
}

}  // namespace quant
}  // namespace tessera

TESSERA_ISA_END
