# The AMX backends' sources (AMXInt8, AMXBF16 and their emulated twins), included by native/CMakeLists.txt.
# -ffp-contract=off everywhere: the tile path, the vector path and the scalar twin must round identically, so no TU may
# fuse a multiply and an add the others keep separate.
# Portable: the tile emulator, packing, the scalar vector twin and the emulated backends. No ISA flags, so the
# emulated backends run on any CPU.
foreach(f IN ITEMS src/amx_tile_emu.cpp src/amx_pack.cpp src/amx_vec_scalar.cpp src/moe_amx_emu.cpp)
  tessera_isa_source(${f} -ffp-contract=off)
endforeach()
# The AVX-512 VNNI / FMA vector half (decode), called only after vec_best() saw the features.
tessera_isa_source(src/amx_vec_avx512.cpp ${TESSERA_AVX512_VNNI_FLAGS} -ffp-contract=off)
# Real tile instructions, and nothing else ISA-specific: this TU's static registration runs on every CPU at import,
# so it gets the AMX flags only (the compiler never emits tile instructions by itself). Its kernels run only after
# supported() saw amx_tile/amx_int8/amx_bf16 in CPUID, XCR0 bits 17/18 and a granted arch_prctl(ARCH_REQ_XCOMP_PERM).
tessera_isa_source(src/moe_amx_hw.cpp -mamx-tile -mamx-int8 -mamx-bf16 -ffp-contract=off)
