// Per-function ISA targets for the ISA translation units (moe_avx512.cpp, dense_avx2.cpp, ...).
//
// Why not -mavx512f on the whole file: every function the compiler emits for such a file may then use AVX-512,
// including the inline functions and templates it instantiates from shared headers (std::vector<float>::resize,
// tessera's own inline helpers). Those are emitted as weak (COMDAT) copies in every file that uses them, the linker
// keeps one at random, and a baseline caller (the Reference backend, the backend probe, a static constructor) can then
// run AVX-512 code on a CPU without it: SIGILL. So with GCC an ISA file includes every header first, with the baseline
// flags, and only its own code comes between TESSERA_ISA_BEGIN(...) and TESSERA_ISA_END: kernels, and the bodies
// they instantiate (moe_body.inc, dense_body.h), whose names are per ISA or file-local. The backend's supported()
// check and its registration (run on every CPU at import) come after TESSERA_ISA_END.
// tests/native/test_isa_isolation.py compiles each ISA file and fails if, in its object code, a shared function or one
// that runs on every CPU uses AVX registers.
//
// Other compilers get the ISA flags per file from CMake (native/CMakeLists.txt) and these macros expand to nothing.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#define TESSERA_ISA_PRAGMA(x) _Pragma(#x)
#define TESSERA_ISA_BEGIN(targets) _Pragma("GCC push_options") TESSERA_ISA_PRAGMA(GCC target(targets))
#define TESSERA_ISA_END _Pragma("GCC pop_options")
#else
#define TESSERA_ISA_BEGIN(targets)
#define TESSERA_ISA_END
#endif

// The target lists (GCC); other compilers use the CMake flag sets of the same names: change both together.
#define TESSERA_TARGET_AVX2 "avx2,fma,f16c"
#define TESSERA_TARGET_AVX_VNNI "avx2,fma,f16c,avxvnni"  // AVX2 plus the 256-bit VEX vpdpbusd
#define TESSERA_TARGET_AVX512 "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"
#define TESSERA_TARGET_AVX512_BF16 "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16"
#define TESSERA_TARGET_AVX512_VNNI "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512vnni"
