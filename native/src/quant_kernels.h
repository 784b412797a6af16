// Internal to the quantized kernels: the unpacked row tile, the quantized activation row, and the per-ISA kernel
// table that quant_driver.cpp calls. See tessera/quant.h for the arithmetic.
//
// Padded lengths: Kp = K rounded up to 64 (one zmm of codes); Kq = K rounded up to 256 (one activation block);
// S16 = Kq / 16 (one zmm of f32 per 256 values). Padding is zero everywhere (codes, scales, activations), so it adds
// nothing.
//
// Row tile (up to kTileRows rows), row r:    u   [r * Kp + i]   uint8 code of value i
//                                            a4  [r * Kp/4 + i/4]  A of value i's group (one f32 per 4 values)
//                                            b16 [r * S16 + i/16]  B of value i's 16-group
// Activation row (one token):                q   [Kq] int8, d256 [Kq/256] dx of value i's 256-block,
//                                            bs16 [S16] int16 sum(q) of each 16 values, s16 [S16] dx * bs16
//
// Activations are llama.cpp's Q8_K scheme: one f32 scale per 256 values (the last block of a row whose K is not a
// multiple of 256 covers the K % 256 values left), so a K-quant super-block's integer sub-scales apply to integer dots
// and only one f32 multiply-add per 256 values remains. Lane layout of the tile: 4 consecutive values form one int32
// lane of vpdpbusd (and of AVX2 maddubs + madd), so a4[i/4] lines up with lane i/4.
#pragma once
#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

#include "tessera/quant.h"

namespace tessera {
namespace quant {

constexpr int kTileRows = 4;
constexpr int64_t kTokenBlock = 64;
constexpr int64_t kRowGroup = 32;  // rows per driver task

// Decode (one token) on a kernel with dot_direct: rows per pool task, so that a task streams ~kDecodeTaskBytes of
// blocks in one sequential run (a multiple of 16 rows, at least kRowGroup, at most kDecodeMaxRows); the
// TESSERA_DECODE_ROWS knob overrides it. dot_direct's one-token results do not depend on how many rows a call gets, so
// the outputs are the same bits whatever the task size. Defined in quant_driver.cpp.
constexpr size_t kDecodeTaskBytes = size_t(256) << 10;
constexpr int64_t kDecodeMaxRows = 2048;
int64_t decode_task_rows(size_t row_bytes);

// The direct-read kernels (dot_direct: AVX-512 VNNI, AVX2) read one row after the other (at decode:
// decode_streams() sequential streams per thread), and prefetch this far ahead into the next rows of each stream,
// `bytes` of it per block read.
constexpr int kPrefetchBytes = 3072;
template <_mm_hint hint = _MM_HINT_T0>
__attribute__((always_inline)) inline void prefetch_ahead(const uint8_t* p, int bytes) {
  for (int o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + o), hint);
}

inline int64_t padded_k(int64_t K) { return (K + 63) / 64 * 64; }
inline int64_t padded_k256(int64_t K) { return (K + 255) / 256 * 256; }
inline int64_t padded_s16(int64_t K) { return padded_k256(K) / 16; }

struct ActRow {
  const int8_t* q;
  const float* d256;
  const int16_t* bs16;
  const float* s16;
};

struct Kernels {
  QIsa isa;
  // x [K] -> q [Kq], d256 [Kq/256], bs16 [S16], s16 [S16] (padding zeroed).
  void (*quantize_row)(const float* x, int64_t K, int8_t* q, float* d256, int16_t* bs16, float* s16);
  // The row-tile path, for an ISA without dot_direct (Reference); nullptr where dot_direct is set (never called there):
  // rows [0, R) of W starting at `w` (row_bytes apart) -> the tile arrays (strides Kp, Kp/4, S16; padding zeroed).
  void (*unpack_rows)(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, uint8_t* u, float* a4, float* b16);
  // out[r] = sum_i w[r, i] x[i] for r < R, one token.  wide: codes may exceed 127 (QTypeInfo::wide).
  void (*dot_rows)(const uint8_t* u, const float* a4, const float* b16, int R, int64_t K, const ActRow& x, bool wide,
                   float* out);
  // nullptr: the driver uses unpack_rows + dot_rows (Reference). R <= kRowGroup rows starting at `w` (row_bytes apart)
  // read straight from their blocks, codes and scales kept in registers while nt <= kTokenBlock tokens pass over each
  // 256 values; out[r * nt + i] = row r . xs[i]. Several rows per call: decode interleaves rows for independent chains.
  void (*dot_direct)(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt,
                     float* out);
};

// The same GEMM on tokens packed once and shared by every row group of a call (quant_matmul's prefill): the packed
// size of nt tokens of K values for type t (whole 16-token groups, 64-byte aligned), the packing (dst 64-byte
// aligned), and the GEMM of R <= kRowGroup rows over nt tokens of a packing that starts at a 16-token group boundary
// (out[r * nt + i], as gemm_avx512_vnni's; bit-identical to it for the same rows and tokens).
size_t gemm_avx512_vnni_packed_bytes(QType t, int64_t K, int nt);
// Per-thread scratch of the GEMMs (AVX-512 and AVX2), grown on demand; a GEMM call uses one region of it at a time.
// Defined in quant_driver.cpp: baseline code, outside any ISA region (isa_target.h).
uint8_t* gemm_scratch(size_t bytes);

// The packing's layout: per 16-token group, xt [Kq/4][16] int32 (token l's int8 values 4i .. 4i + 3 in lane l of
// row i: an AMX B tile's layout, 64 values of 16 tokens per 1024 bytes), dx [Kq/256][16] f32, sb [Kq/G][16] f32
// (dx * sum(q) per G-value group) and z [Kq/G][16] int32 (-offset * sum(q)), each 64-byte aligned. G = 16 for Q6_K,
// 32 for the other types.
inline size_t align64(size_t n) { return (n + 63) / 64 * 64; }
struct TokenLayout {
  size_t n_xt, n_dx, n_sb;
  TokenLayout(int64_t Kq, int G)
      : n_xt(align64(size_t(Kq) * 16)), n_dx(align64(size_t(Kq / 256) * 16 * 4)),
        n_sb(align64(size_t(Kq / G) * 16 * 4)) {}
  size_t group() const { return n_xt + n_dx + 2 * n_sb; }
};
inline int packing_group(QType t) { return t == QType::Q6_K ? 16 : 32; }

void gemm_avx512_vnni_pack(QType t, int64_t K, const ActRow* xs, int nt, uint8_t* dst);
// Whether two types' packings are the same bytes for the same tokens (one packing serves both).
bool gemm_avx512_vnni_same_packing(QType a, QType b);
// Cephes expf, for the vector SiLUs (silu_mul_avx512, silu_mul_avx2): exp(x) = 2^m (1 + r + r^2 P(r)) with
// x = m ln2 + r, m = round(x log2e), r = x - m C1 - m C2 (ln2 split in two for an exact first product), P by its
// six coefficients, highest power first.
struct ExpfCephes {
  static constexpr float kLog2e = 1.44269504088896341f, kC1 = 0.693359375f, kC2 = -2.12194440e-4f;
  static constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                  4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
};
// g[i] = silu(g[i]) * u[i] for i < n, 16 at a time (exp by a degree-6 polynomial on [-ln2/2, ln2/2], relative error
// ~2e-7; not the scalar std::exp's rounding): the MoE's prefill (T > 1) on AVX-512 VNNI.
void silu_mul_avx512(float* g, const float* u, int64_t n);
// A GEMM task's results [R, nt] (row-major, R <= kRowGroup) to the tokens' rows: dst[s][r] = res[r * nt + s] for
// s < nt, r < R (dst[s]: where token s's R outputs go, contiguous). 16 x 16 blocks transposed in zmm registers, masked
// at the edges; pure data movement, so the same values as the scalar loop (rows_to_tokens in quant_driver.cpp).
// stream: whole aligned 16-float rows go out with streaming stores (no read of the line first; for destinations far
// larger than the caches), then a store fence.
void rows_to_tokens_avx512(const float* res, int R, int nt, float* const* dst, bool stream = false);
void gemm_avx512_vnni_packed(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tokens,
                             int nt, float* out);
// The same contract on AMX int8 tiles (quant_gemm_amx.cpp), every type: the super-block types' codes times their
// integer sub-scales, exact, summed per 256-value super-block in int32 by TDPBSSD (one f32 step per super-block);
// Q8_0 / Q4_0 one TDPBSSD per 32-value block and gemm_avx512_vnni_packed's f32 steps (bit-identical to it). emulate:
// the tile emulator (amx_tile_emu.h) instead of the instructions (any CPU with AVX-512 VNNI); else only where
// CpuFeatures grants AMX. Each (row, token) result depends only on that row and that token.
void gemm_amx_packed(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tokens, int nt,
                     float* out, bool emulate);

// Prefill GEMM (quant_gemm_avx512.cpp), the contract of Kernels::dot_direct for 1 <= nt <= kTokenBlock tokens: rows
// decoded once per call, 16 tokens per vector lane set. The driver sends it blocks of kGemmMinTokens tokens and more
// on the AVX-512 VNNI ISA; its f32 rounding order differs from dot_direct's (same integer dots).
void gemm_avx512_vnni(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt,
                      float* out);
constexpr int kGemmMinTokens = 12;  // below: dot_direct (a 16-lane group would be mostly padding)

// Prefill GEMM for AVX2 (quant_gemm_avx2.cpp), the same contract: 8 tokens per vector lane set, 4-row micro-tiles.
// The driver sends it blocks of quant_gemm_min_tokens(AVX2, t) tokens and more; shorter blocks keep the row tiles
// (unpack_rows + dot_rows). Its f32 rounding order differs from the row tiles' (same integer dots).
void gemm_avx2(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt, float* out);
// g[i] = silu(g[i]) * u[i] for n values, 8 lanes at a time (the MoE's gate/up phase on AVX2): silu_mul_avx512's
// polynomial exp, its argument clamped to +-88 (see quant_gemm_avx2.cpp); close to the scalar silu, not bit-identical.
void silu_mul_avx2(float* g, const float* u, int64_t n);
// The same GEMM with AVX-VNNI's vpdpbusd for the integer dots (quant_gemm_avx_vnni.cpp): bit-identical results; the
// driver takes it where avx2_gemm_uses_avx_vnni() (tessera/quant.h).
void gemm_avx2_vnni(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs, int nt,
                    float* out);
// The AVX2 GEMM on tokens packed once (gemm_avx2_pack: 8 tokens a group, each group gemm_avx2_packed_bytes(t, K, 8)
// bytes, the last padded with zero tokens) and shared by every row group and by weights whose packing agrees
// (gemm_avx2_same_packing): per (row, token) the same bits as gemm_avx2 / gemm_avx2_vnni. tokens: group of token 0.
void gemm_avx2_pack(QType t, int64_t K, const ActRow* xs, int nt, uint8_t* dst);
size_t gemm_avx2_packed_bytes(QType t, int64_t K, int nt);
bool gemm_avx2_same_packing(QType a, QType b);
void gemm_avx2_packed(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tokens, int nt,
                      float* out);
void gemm_avx2_vnni_packed(QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tokens,
                           int nt, float* out);
// From how many tokens the AVX2 GEMM beat the row tiles, per type: scripts/bench_avx2_gemm_threshold.py (one 768 x
// 2048 matrix, 2 threads). Never below 2: one token is decode, which stays on the row tiles (quant_matvec_multi equals
// quant_matmul at T = 1 bit for bit). `vnni`: the GEMM on AVX-VNNI (gemm_avx2_vnni), measured on the only CPUs with it
// here, an Intel Xeon running AVX2 code (docs/BENCHMARKS.md, session 16): the row tiles won at 2 tokens for every type
// and at 3 for Q8_0 and IQ4_XS (Q4_K, Q6_K: even at 3). Without: vpmaddubsw, measured on a Zen 4 running AVX2 code
// ("AVX2 quantized prefill GEMM"), where the GEMM was as fast or faster from 2 tokens for all but Q8_0 (the same
// Xeon's vpmaddubsw figures wanted 3-6: this table is Zen's, the CPUs that have AVX2 and no AVX-VNNI are mostly AMD's).
constexpr int avx2_gemm_min_tokens(QType t, bool vnni) {
  if (vnni) {
    switch (t) {
      case QType::Q4_0:
      case QType::Q5_K: return 3;
      default: return 4;  // Q8_0, Q4_K, Q6_K, IQ4_XS
    }
  }
  switch (t) {
    case QType::Q8_0: return 4;
    default: return 2;  // Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS
  }
}

const Kernels& kernels_reference();  // quant_ref.cpp
const Kernels& kernels_avx2();       // quant_avx2.cpp
const Kernels& kernels_avx512_vnni();  // quant_avx512_vnni.cpp

// IQ4_NL / IQ4_XS code book (ggml's kvalues_iq4nl).
constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

}  // namespace quant
}  // namespace tessera
