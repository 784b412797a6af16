// Partial 16-lane AVX-512 loads shared by the AVX-512 files that walk rows 16 values at a time: amx_vec_avx512.cpp
// (activation and weight quantizers of the AMX backends) and moe_avx512_int8.cpp (AVX512Int8's weight packing).
// Include it after TESSERA_ISA_BEGIN (isa_target.h): the functions are static, so each including file keeps its own
// copy compiled for its own ISA.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace tessera {

// The first min(left, 16) lanes.
__attribute__((always_inline)) static inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}

// bf16 p[0, 16) widened exactly to f32, lanes outside m zero (and not read).
__attribute__((always_inline)) static inline __m512 load_bf16x16(__mmask16 m, const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

}  // namespace tessera
