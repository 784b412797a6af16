// Every TESSERA_* tuning knob of the native module, read from the environment in ONE place (src/tuning.cpp), once
// per process, before the first kernel runs. Kernels read the fields; none calls getenv itself.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

struct Tuning {
  // TESSERA_MAX_ISA=reference|avx2|avx512|amx: caps dispatch (tests, bug reports). "" = no cap.
  std::string max_isa;
  // TESSERA_INT8_GROUP: AVX512Int8 inputs per weight scale, rounded up to a multiple of 4; 0 = one scale per output
  // channel. Changes the packed bytes, so it is part of the packed-weight cache key (engine.native.packing_knobs).
  int64_t int8_group = 128;
  // TESSERA_PF: how far ahead (bytes) the AVX kernels prefetch weight panels. Atomic (like spin_us and
  // amx_tile_min_rows): a stored calibration (tessera/engine/tuned.py, `tessera-cli tune`) sets it after the environment was
  // read, and the calibration times candidate values in one process.
  std::atomic<int64_t> prefetch_bytes{-1};  // -1: the kernel's default (kKC * 64 in moe_body.inc)
  // TESSERA_SPIN_US: microseconds a pool worker spins after a job before it sleeps.
  std::atomic<int> spin_us{50};
  // TESSERA_PROFILE (set to anything): per forward chunk, wall time of each phase on stderr.
  bool profile = false;
  // TESSERA_DENSE_NATIVE_MAX_T: engine.dense multiplies bf16/f16 weights natively for steps of up to this many tokens
  // (more: torch on an f32 upcast). Read here so every knob has one reader; tessera/engine/dense.py uses it.
  int64_t dense_native_max_tokens = 512;
  int64_t dense_quant_max_tokens = 2048;  // TESSERA_DENSE_QUANT_MAX_T: engine.dense, quantized weights on the blocks
  // TESSERA_AVX2_GEMM_MIN_T: on the AVX2 quantized kernels, token blocks of at least this many tokens (2 at least:
  // decode keeps the row tiles) take the GEMM (quant_gemm_avx2.cpp) for every type, shorter ones the row tiles; above
  // 64 (kTokenBlock) the GEMM never runs (the row path alone, for before/after timings). 0 (default): per type, from
  // where it measured faster
  // (quant_kernels.h avx2_gemm_min_tokens, one table for the vpmaddubsw GEMM and one for AVX-VNNI's;
  // tessera.engine.native.quant_isas() lists them). Atomic: tests switch it (set_tuning_knob).
  std::atomic<int64_t> avx2_gemm_min_tokens{0};
  // Knobs whose value could not be read, as "NAME=value" lines; engine.native.tuning() raises a named error for them.
  std::string invalid;
  // Knobs the environment set, one TESSERA_* name per line: a stored calibration never overrides them.
  std::string from_environment;
  // TESSERA_AMX_TILE_MIN_ROWS: experts with at least this many rows use AMX tiles; 0 (default): per weight format,
  // amx_moe.h kTileMinRowsBF16 (2) and kTileMinRowsInt8 (16), measured on an AMX Xeon (docs/BENCHMARKS.md, issue 16
  // items 1-2). Atomic: a stored calibration sets it, and tests switch it while the process runs
  // (set_amx_tile_min_rows).
  std::atomic<int64_t> amx_tile_min_rows{0};
  // AMXInt8 pieces with at least this many rows run on bf16 tiles over their dequantized weights (amx_moe.h): -1 the
  // kernel's default, 0 never. TESSERA_AMX_INT8_BF16_MIN_ROWS, tests: set_amx_int8_bf16_min_rows.
  std::atomic<int64_t> amx_int8_bf16_min_rows{-1};
  // TESSERA_QUANT_MOE_CHUNK_T: tokens per pass of the quantized MoE (quant_driver.cpp). Each pass reads (and on
  // AVX-512 VNNI decodes) every active expert's rows once, so a longer pass reuses each weight over more tokens, at the
  // cost of scratch ~ T * k * (I + H) floats, kept from call to call. 0 (default): quant_moe_default_chunk, 2048
  // tokens on every quantized ISA (measured on AMX, AVX-512 VNNI and AVX2). Atomic: the calibration times
  // candidates in one process (`tessera-cli tune`, calibrate.py QUANT_CHUNK; docs/BENCHMARKS.md "Self-tuning, second
  // pass", "Long prompts on AMX"). The engine's calls hold at most generate.PREFILL_CHUNK (2048) tokens.
  std::atomic<int64_t> quant_moe_chunk_tokens{0};
  // TESSERA_VNNI_GEMM_MIN_T: on AVX-512 VNNI, token blocks (an expert's tokens in a quantized MoE pass, a quant_matmul
  // call) of at least this many tokens take the GEMM (quant_gemm_avx512.cpp), shorter ones the mat-vec per token.
  // 0: the kernels' default (quant_kernels.h kGemmMinTokens, 12); never below 2 (one token is decode). Atomic: measured
  // by the calibration like quant_moe_chunk_tokens (calibrate.py VNNI_GEMM_MIN).
  std::atomic<int64_t> vnni_gemm_min_tokens{0};
  // TESSERA_DECODE_ROWS: rows per pool task of the decode mat-vecs that read the blocks directly (quant_matvec_multi,
  // the quantized MoE at T = 1, on AVX-512 VNNI); 0 (default): quant::decode_task_rows's rule, ~256 KiB of blocks a
  // task (docs/BENCHMARKS.md, session 8: 32-row tasks streamed 25-35 % slower on Zen 4). Atomic: tests switch it.
  std::atomic<int64_t> decode_rows{0};
  // TESSERA_DECODE_STREAMS: sequential row streams per thread of the decode mat-vecs that read the blocks directly
  // (dot_direct at T = 1 on AVX-512 VNNI and AVX2: the quantized MoE's decode and every quantized dense mat-vec): 1,
  // or 2 (the call's rows in two halves, a row of each in turn). 0 (default): per CPU vendor, decode_streams() below
  // (Intel 2, others 1). Results are the same bits either way. Atomic: measured by the calibration (calibrate.py
  // DECODE_STREAMS), tests switch it.
  std::atomic<int64_t> decode_streams{0};
  // TESSERA_AVX_VNNI: 0 keeps the AVX2 quantized prefill GEMM on vpmaddubsw even where the CPU has AVX-VNNI (for
  // before/after timings and the tests that compare the two); anything else (default 1): vpdpbusd where CPUID reports
  // avx_vnni (quant_gemm_avx_vnni.cpp). Both give the same results bit for bit. Atomic: tests switch it.
  std::atomic<int64_t> avx_vnni{1};
};

// Constants the kernels keep fixed, and why none of them is a per-CPU knob (issue 16 item 3: no constant claims to
// be tuned unless a measurement stands behind it):
// - dense_native_max_tokens / dense_quant_max_tokens (above) and quant_kernels.h avx2_gemm_min_tokens: measured
//   crossovers (docs/BENCHMARKS.md "Dense layers in bf16", the quantized dense threshold, "AVX2 quantized prefill
//   GEMM"); the env overrides them for a CPU where they measure otherwise. Read once, not calibrated per load: the
//   dense thresholds showed no measurable gain either way from T = 128 on, i.e. no CPU-dependent optimum to find.
// - moe_panels.h kBf16MinTokens (16): a numerics boundary, not a speed one: below it activations stay f32 so decode
//   matches Reference's greedy output on every CPU; a per-CPU value would make results depend on the machine.
// - moe_panels.h kMaxChunkTokens (1024) and amx_moe.h kGroupRows (2048 routed rows): bound scratch memory only; the
//   engine's calls hold at most 2048 tokens (generate.PREFILL_CHUNK): the bf16 panel backends read an expert's weights
//   at most twice per call, the AMX backends' groups once either way.
// - Register blockings and tile shapes (kMRC, kNBC, kMR, kLanes, AMX tile shapes): fixed by the ISA's register file
//   and tile palette, not by the CPU model.
// - Cache blockings (moe_body.inc kKC 128 pairs, quant_driver.cpp kGemmBlock 256 tokens / kRowGroup, dense GEMM kKc,
//   attention_flash.inc kKeys / kRowsPerTask): compile-time loop bounds sized for a 32-48 KB L1 and >= 1 MB L2 per
//   core, measured on Zen 4 only (docs/BENCHMARKS.md, the sections of each kernel). Not calibrated: they are template
//   and array bounds, and no CPU measured yet disagrees; attention_flash.inc kPrefetchBlocks has its measurement
//   beside it.
// - moe_body.inc's reduce phase splits H in chunks of 256: its work is k*H adds per token against 3*k*H*I FLOPs in
//   the projections (~0.1 % at I = 768), and decode (T <= 4) runs it without the pool: no chunk size measurably
//   matters.
// - Threads per phase: every phase uses all of the pool's threads (the pool's size is the --threads setting). On the
//   2-core development machine no phase ran faster on 1 thread than on 2 (scripts/bench_phase_threads.py; decode,
//   bf16 and Q4_K prefill; docs/BENCHMARKS.md "Self-tuning, second pass"), so there is nothing to tune per phase
//   there; a many-core CPU whose decode saturates the bandwidth below its core count is where it would be measured.


// Read on first call (thread-safe), then the same object for the life of the process.
Tuning& tuning();

// Sequential streams per thread of the memory-bound decode loops, 1 or 2: the knob tuning().decode_streams, or for 0
// this CPU's default. Two streams keep twice the misses in flight per core: on an AMX Xeon VM (2 cores) a Q4_K_M MoE
// layer's decode read 21.1 -> 24.5 GB/s, Q8_0 22.7 -> 27.6 on AVX-512 VNNI (the read probe: 26.6-27.4), 21.6 -> 24.4
// and 25.1 -> 28.5 on AVX2, end to end 6.9 -> 8.6 tok/s on the 48-layer Q4_K_M (docs/BENCHMARKS.md, session 18). On
// Zen 4 two interleaved rows measured 1.2-2x slower (session 2, an older kernel): one stream there. Readers: the
// quantized decode mat-vecs (quant_kernels.h; AVX-512 VNNI alternates super-blocks of two rows, AVX2 whole rows).
// Results are the same bits either way. (The bf16 decode attention with two key-range tasks taking turns per thread
// measured no faster at 8k: docs/BENCHMARKS.md, session 18.)
int decode_streams();

}  // namespace tessera
