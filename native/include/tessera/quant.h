// Kernels on GGUF quantized blocks, read in place (the file's own block layout, memory-mapped, zero copy): no weight is
// ever widened to f32/bf16 beyond one row tile in L1 at a time, and no block is requantized.
//
// Types (GGML ids): Q4_0 (2), Q8_0 (8), Q4_K (12), Q5_K (13), Q6_K (14), IQ4_XS (23).
// A weight matrix W [N, K] is N rows of K/block blocks each, `row_bytes = K / block * type_size` bytes per row,
// rows contiguous (GGUF: ffn_{gate,up}_exps [E, I, H] = E*I rows of H; ffn_down_exps [E, H, I] = E*H rows of I).
//
// How a kernel computes (the same scheme in every ISA):
// - Every weight of every type is written exactly as w = A_g * u - B_g, u an unsigned 8-bit code, A_g and B_g f32 per
//   16-value group g (from the block's f16 scale(s) and 6-bit/8-bit sub-scales and mins, kept as stored):
//   Q8_0 u = q + 128, A = d, B = 128 d; Q4_0 u = nibble, A = d, B = 8 d; Q4_K/Q5_K u = 4/5-bit code, A = d * sc,
//   B = dmin * m; Q6_K u = 6-bit code, A = d * sc, B = 32 A; IQ4_XS u = kvalues[nibble] + 128, A = d (ls - 32),
//   B = 128 A. In exact arithmetic this is gguf.quants.dequantize's value.
// - Activations are quantized per token as llama.cpp's Q8_K: blocks of 256 values (the last block of a row whose K is
//   not a multiple of 256 holds the K % 256 values left), f32 scale dx = max|x| / 127, int8 q = round(x / dx) (nearest
//   even), and the int16 sum of every 16 q (with its f32 dx * sum) for the B terms.
// - out = sum_g A_g dx * dot_g(u, q) - sum_g B_g * dx sum_g(q): integer dots, exact in int32, accumulated in f32 with
//   the scales (Reference: double). The AVX-512 kernels apply the K-quants' integer sub-scales to the integer dots
//   (one f32 multiply-add per 256 values); the f32 products d * sc are exact, so this is the same value.
// - A row tile (4 rows x K) is unpacked into a per-thread L1 buffer (u8 codes + scales) and reused by every token of a
//   token block (64 tokens), so prefill reads each weight block once per 64 tokens, decode once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tessera/pool.h"

namespace tessera {

enum class QType : int32_t { Q4_0 = 2, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, IQ4_XS = 23 };

struct QTypeInfo {
  QType type;
  const char* name;  // "Q4_K"
  int block;         // values per block (32 or 256)
  int bytes;         // bytes per block
  bool wide;         // codes u may exceed 127 (Q8_0, IQ4_XS): AVX2 takes the sign path
};

// nullptr when `ggml_type` is not one of the supported types.
const QTypeInfo* qtype_info(int32_t ggml_type);
const QTypeInfo& qtype_info(QType t);
// Every supported type, in GGML id order, and their names "Q4_0, Q8_0, ..." for error messages.
const char* qtype_names();

// The quantized-kernel ISAs. Each backend maps to one (tessera/engine/native.py: quant_isa_for_backend).
// AMXInt8: AVX-512 VNNI decode, the prefill GEMM on AMX int8 tiles (quant_gemm_amx.cpp); AMXInt8Emu: the same on the
// tile emulator, for tests on CPUs without AMX (never chosen by qisa_best, nor by any backend).
enum class QIsa : int32_t { Reference = 0, AVX2 = 1, AVX512VNNI = 2, AMXInt8Emu = 3, AMXInt8 = 4 };
constexpr int kQIsaCount = 5;
const char* qisa_name(QIsa isa);  // "reference", "avx2", "avx512_vnni", "amx_int8_emu", "amx_int8"
// Whether `isa` runs the AVX-512 VNNI kernels (decode, short token blocks, quantization and token packing).
inline bool qisa_vnni(QIsa isa) { return isa == QIsa::AVX512VNNI || isa == QIsa::AMXInt8 || isa == QIsa::AMXInt8Emu; }
// Whether this CPU (under TESSERA_MAX_ISA) runs `isa`; on false *why says what is missing.
bool qisa_available(QIsa isa, std::string* why);
QIsa qisa_best();
// Whether the AVX2 ISA's prefill GEMM runs on AVX-VNNI's vpdpbusd (quant_gemm_avx_vnni.cpp): the CPU reports
// avx_vnni, the AVX2 ISA is available, and TESSERA_AVX_VNNI (tuning().avx_vnni) is not 0. Same results either way.
bool avx2_gemm_uses_avx_vnni();

// Exact dequantization of `rows` rows of K values (bit-identical to gguf.quants.dequantize): tests and the embedding
// lookup (one row at a time). out [rows, K] f32.
void quant_dequantize(QType t, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t K, float* out,
                      ThreadPool& pool);

// The first block (row-major order) whose f16 scale (d, or dmin for Q4_K/Q5_K) is NaN or Inf.
struct QBadBlock {
  int64_t row = -1, block = -1;  // -1: every scale is finite
  const char* field = "";        // "d" or "dmin"
};
QBadBlock quant_find_nonfinite(QType t, const uint8_t* w, size_t row_bytes, int64_t rows, ThreadPool& pool);

// out[T, N] = x[T, K] @ W[N, K]^T, W quantized (row_bytes per row), x and out f32 (out overwritten).
// Preconditions (checked in bindings): K a multiple of the type's block, row_bytes = K / block * bytes, T, N > 0.
struct QMatmulArgs {
  QType type;
  const uint8_t* w;
  size_t row_bytes;
  int64_t N, K, T;
  const float* x;
  float* out;
};
void quant_matmul(QIsa isa, const QMatmulArgs& a, ThreadPool& pool);
// Token blocks (<= 64 tokens of one task) of at least this many tokens run `isa`'s prefill GEMM on type t, shorter
// ones its row path; 0: the ISA has no GEMM (Reference). AVX2: per type, from where it measured faster
// (docs/BENCHMARKS.md), or TESSERA_AVX2_GEMM_MIN_T for every type.
int quant_gemm_min_tokens(QIsa isa, QType t);
// Tokens per pass of quant_moe_forward on `isa` when the knob (tessera/tuning.h quant_moe_chunk_tokens) is 0.
int64_t quant_moe_default_chunk(QIsa isa);

// One projection of a layer's experts: E * rows_per_expert rows of `row_bytes`.
struct QWeights {
  QType type;
  const uint8_t* w;
  size_t row_bytes;
};
// The MoE forward of backend.h's contract on quantized experts: gate, up [E, I, H] (E*I rows of H), down [E, H, I];
// ids [T, k] (negative = skip the slot), weights [T, k] f32, x [T, H] f32, out [T, H] f32 (overwritten).
struct QMoeArgs {
  int64_t E, H, I, T, k;
  QWeights gate, up, down;
  const int64_t* ids;
  const float* weights;
  const float* x;
  float* out;
};
void quant_moe_forward(QIsa isa, const QMoeArgs& a, ThreadPool& pool);

}  // namespace tessera
