// vpdpbusd as inline asm, for register-tiled kernels (used only between TESSERA_ISA_BEGIN/END of a VNNI file).
//
// Why: GCC 12 compiles `acc[m][b] = _mm512_dpbusd_epi32(acc[m][b], a, w)` on an accumulator array with a register copy
// in, a copy out and a store to the stack around every vpdpbusd (measured in moe_avx512_int8.cpp's 3 x 4 x 2 tile:
// ~3 extra moves per dot, the tile at ~35 % of the unit's peak). The asm form ties the accumulator to one register
// ("+v"), so the unrolled array stays in zmm registers. The probe (probe_avx512_vnni.cpp) met the same problem.
// Not volatile: a pure function of its operands, so the compiler may schedule it.
#pragma once

// acc (i32 x 16) += sum over each lane's 4 byte pairs of a_u8 (unsigned) * b_s8 (signed). AT&T operand order.
#define TESSERA_VPDPBUSD_ZMM(acc, a_u8, b_s8) asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a_u8), "v"(b_s8))
