// Quantized prefill GEMM, AVX2 + AVX-VNNI: quant_gemm_avx2.cpp's GEMM (its comment describes it) with each step's
// integer dot formed by the 256-bit VEX vpdpbusd (one instruction per 32 byte products, into int32) instead of
// vpmaddubsw + int16 adds + vpmaddwd. The CPUs it is for: AVX-VNNI without AVX-512, i.e. Intel Core from the 12th
// generation (Alder Lake and later desktops and laptops), and any CPU with both when TESSERA_MAX_ISA=avx2 caps the
// kernels at AVX2. Chosen at run time by quant::gemm_avx2_auto (quant_driver.cpp) where CPUID reports avx_vnni and
// TESSERA_AVX_VNNI is not 0.
//
// Same exact integer dots, same f32 steps after them: its results equal the AVX2 GEMM's bit for bit (tested in
// tests/native/test_quant_gemm.py), so everything the AVX2 GEMM's tests prove holds for it too.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "quant_kernels.h"

#include "isa_target.h"

// acc (8 x i32) += per lane, the sum of its 4 byte products u8 a x s8 b: the VEX (AVX-VNNI) encoding, by asm so the
// accumulator array stays in registers (vnni_asm.h says why) and GCC cannot pick the EVEX form.
#define TESSERA_VPDPBUSD_VEX(acc, a_u8, b_s8) asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a_u8), "x"(b_s8))

TESSERA_ISA_BEGIN(TESSERA_TARGET_AVX_VNNI)
#include "avx2_transpose.h"  // after BEGIN: compiled for this file's ISA

namespace tessera {
namespace quant {
namespace {

#define TESSERA_AVX2_GEMM_VNNI 1
#include "quant_gemm_avx2_body.inc"
#undef TESSERA_AVX2_GEMM_VNNI

}  // namespace

void gemm_avx2_vnni(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt,
                    float* out) {
  gemm_types(t, w, row_bytes, R, K, xs, nt, out);
}

void gemm_avx2_vnni_packed(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tokens,
                           int nt, float* out) {
  packed_types(t, w, row_bytes, R, K, tokens, nt, out);
}

}  // namespace quant
}  // namespace tessera

TESSERA_ISA_END
