// The quantized mat-mul and MoE forward: activation quantization, tiling, and the phases on the thread pool; the
// arithmetic is the ISA's kernel table (quant_kernels.h). Portable: no ISA flags.
//
// Tiling: a task owns up to kRowGroup rows of one weight matrix and up to kTokenBlock tokens. It unpacks 4 rows at a
// time from the file's blocks into its thread's L1 tile (u8 codes + f32 scales) and runs every token of its block
// over that tile, so a weight block is read from memory once per 64 tokens (prefill) and once per call (decode).
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

#include "quant_kernels.h"
#include "tessera/quant_decode.h"
#include "tessera/step_profile.h"
#include "tessera/tuning.h"

namespace tessera {
namespace {

using quant::ActRow;
using quant::Kernels;
using quant::kTileRows;
using quant::kTokenBlock;
using quant::padded_k;
using quant::padded_s16;

using quant::kRowGroup;  // rows per task: 8 tiles

const Kernels& kernels_for(QIsa isa) {
  switch (isa) {
    case QIsa::AMXInt8:
    case QIsa::AMXInt8Emu:  // the VNNI kernels, with the tile GEMM for prefill (packed_gemm)
    case QIsa::AVX512VNNI: return quant::kernels_avx512_vnni();
    case QIsa::AVX2: return quant::kernels_avx2();
    default: return quant::kernels_reference();
  }
}

// The packed prefill GEMM of `isa` (gemm_avx512_vnni_packed's contract): on AMXInt8 the tile GEMM
// (quant_gemm_amx.cpp), else the AVX-512 VNNI register GEMM.
void packed_gemm(QIsa isa, QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const uint8_t* tokens,
                 int nt, float* out) {
  if (isa == QIsa::AMXInt8 || isa == QIsa::AMXInt8Emu)
    return quant::gemm_amx_packed(t, w, row_bytes, R, K, tokens, nt, out, isa == QIsa::AMXInt8Emu);
  if (isa == QIsa::AVX2)
    return (avx2_gemm_uses_avx_vnni() ? quant::gemm_avx2_vnni_packed : quant::gemm_avx2_packed)(t, w, row_bytes, R, K,
                                                                                              tokens, nt, out);
  quant::gemm_avx512_vnni_packed(t, w, row_bytes, R, K, tokens, nt, out);
}

// How an ISA with a packed GEMM packs its tokens: 16 a group for the AVX-512 VNNI layout (AMX reads it too), 8 for
// AVX2's; a group's bytes; whether two weight types share a packing; one group packed.
int pack_group_tokens(QIsa isa) { return isa == QIsa::AVX2 ? 8 : 16; }
size_t packed_group_bytes(QIsa isa, QType t, int64_t K) {
  return isa == QIsa::AVX2 ? quant::gemm_avx2_packed_bytes(t, K, 8) : quant::gemm_avx512_vnni_packed_bytes(t, K, 16);
}
bool same_packing(QIsa isa, QType a, QType b) {
  return isa == QIsa::AVX2 ? quant::gemm_avx2_same_packing(a, b) : quant::gemm_avx512_vnni_same_packing(a, b);
}
void pack_group(QIsa isa, QType t, int64_t K, const ActRow* xs, int n, uint8_t* dst) {
  if (isa == QIsa::AVX2) quant::gemm_avx2_pack(t, K, xs, n, dst);
  else quant::gemm_avx512_vnni_pack(t, K, xs, n, dst);
}

// res [R, nt] (a GEMM task's results) -> dst[s][0 .. R): the AVX-512 transpose where the ISA has it, else a loop.
void rows_to_tokens(QIsa isa, const float* res, int R, int nt, float* const* dst, bool stream = false) {
  if (isa != QIsa::AVX2) return quant::rows_to_tokens_avx512(res, R, nt, dst, stream);
  for (int s = 0; s < nt; ++s)
    for (int r = 0; r < R; ++r) dst[s][r] = res[r * nt + s];
}

// Grows v to at least n elements and never shrinks it: the prefill's scratch (activations, packed tokens, per-slot
// results: up to ~190 MB for a 2048-token pass of a 30B-A3B layer) is kept thread_local from call to call, so a layer
// neither zero-fills it nor faults its pages in again (a fresh vector of that size costs both at every layer: measured
// in docs/BENCHMARKS.md, "Prefill scratch kept"). Every element a call reads it has written in the same call.
template <class V>
auto* grown(V& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// The first 64-byte boundary at or after p (a buffer grown 64 bytes longer than it needs holds its data from there).
inline uint8_t* aligned64(uint8_t* p) { return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64; }

// The MoE pass's per-slot results (act [slot, I], y [slot, H]), grown like `grown` and kept by the calling thread, but
// 2 MiB aligned and advised onto transparent huge pages from 8 MiB on: each token's row of a task's results lands in
// another 4 KiB page (rows are I or H floats apart and the slots of a task are scattered), so on small pages nearly
// every row written costs a TLB miss (docs/BENCHMARKS.md "Prefill scratch kept"). Contents are not kept on growth:
// each pass writes every element it reads.
class SlotBuffer {
 public:
  SlotBuffer() = default;
  SlotBuffer(const SlotBuffer&) = delete;
  SlotBuffer& operator=(const SlotBuffer&) = delete;
  ~SlotBuffer() { std::free(p_); }
  float* grow(size_t n) {
    if (n <= cap_) return p_;
    std::free(p_);
    p_ = nullptr;
    cap_ = 0;
    const size_t bytes = std::max<size_t>(n * sizeof(float), 64);
    const size_t align = bytes >= (size_t(8) << 20) ? (size_t(2) << 20) : 64;
    const size_t rounded = (bytes + align - 1) / align * align;  // aligned_alloc wants a multiple of the alignment
    void* p = std::aligned_alloc(align, rounded);
    if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    if (align > 64) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: where THP is off, 4 KiB pages as before
#endif
    p_ = static_cast<float*>(p);
    cap_ = rounded / sizeof(float);
    return p_;
  }

 private:
  float* p_ = nullptr;
  size_t cap_ = 0;
};

// Quantized activations of n rows of K values (quant_kernels.h: Q8_K-style, one scale per 256); storage grown, not
// reallocated (grown), so one thread_local Acts serves every layer.
struct Acts {
  int64_t K = 0, Kq = 0, S16 = 0;
  std::vector<int8_t> q;
  std::vector<float> d256, s16;
  std::vector<int16_t> bs16;
  void resize(int64_t n, int64_t k) {
    K = k;
    Kq = quant::padded_k256(k);
    S16 = padded_s16(k);
    grown(q, size_t(n * Kq));
    grown(d256, size_t(n * Kq / 256));
    grown(bs16, size_t(n * S16));
    grown(s16, size_t(n * S16));
  }
  ActRow row(int64_t i) const {
    return {q.data() + i * Kq, d256.data() + i * (Kq / 256), bs16.data() + i * S16, s16.data() + i * S16};
  }
  void quantize(const Kernels& kr, int64_t i, const float* x) {
    kr.quantize_row(x, K, q.data() + i * Kq, d256.data() + i * (Kq / 256), bs16.data() + i * S16,
                    s16.data() + i * S16);
  }
};

// quant_matmul's prefill on AVX-512 VNNI / AMX and on AVX2 (T at or above the ISA's GEMM threshold), for one weight or
// several that multiply the same x [T, K] (quant_matmul_multi: a layer's q/k/v projections): x is quantized once, its
// tokens are packed for the GEMM once per distinct packing (16 at a time for AVX-512, 8 for AVX2, on the pool; Q4_K and
// Q6_K weights need two) and shared by every row group of every part, and a task runs its kRowGroup rows over up to
// kGemmBlock tokens, so each row is decoded once per kGemmBlock tokens; all parts' tasks go to one parallel_for. Per
// (row, token) the same arithmetic as the ISA's GEMM whatever the other parts are: bit-identical to one call per part.
constexpr int64_t kGemmBlock = 256;
// act / y buffers at least this large are written with streaming stores (see quant_moe_forward). Chosen above the
// last-level caches of the machines measured, not tuned: on an AMX Xeon (bench-moe, Q4_K_M layer, 2 threads) streaming
// left 512-token prefills (y 33.5 MB) unchanged on AMX and 4 % faster on VNNI, and made 1024-4096 tokens 2-9 % faster
// (docs/BENCHMARKS.md, session 15).
constexpr int64_t kStreamMinBytes = int64_t(32) << 20;

// Per-thread result buffers of a GEMM task ([row, token]), grown on demand.
float* task_buffer(int which, size_t n) {
  thread_local std::vector<float> buf[2];
  return grown(buf[which], n);
}

void matmul_gemm_packed(QIsa isa, const Kernels& kr, const float* x, int64_t T, int64_t K, const QMatvecPart* parts,
                        int n_parts, ThreadPool& pool) {
  const int G = pack_group_tokens(isa);
  thread_local Acts acts_of_thread;
  Acts& acts = acts_of_thread;  // the caller's: a pool lambda naming a thread_local would get its own thread's
  acts.resize(T, K);
  pool.parallel_for(T, [&](int64_t t, int) { acts.quantize(kr, t, x + t * K); });
  std::vector<QType> packings;  // one representative type per distinct packing
  std::vector<size_t> packing_of(static_cast<size_t>(n_parts));
  for (int p = 0; p < n_parts; ++p) {
    size_t j = 0;
    while (j < packings.size() && !same_packing(isa, packings[j], parts[p].type)) ++j;
    if (j == packings.size()) packings.push_back(parts[p].type);
    packing_of[size_t(p)] = j;
  }
  const int64_t n_groups = (T + G - 1) / G;
  std::vector<size_t> group_bytes(packings.size()), start_of(packings.size() + 1, 0);
  for (size_t j = 0; j < packings.size(); ++j) {
    group_bytes[j] = packed_group_bytes(isa, packings[j], K);
    start_of[j + 1] = start_of[j] + size_t(n_groups) * group_bytes[j];
  }
  thread_local std::vector<uint8_t> buf;
  uint8_t* packed = aligned64(grown(buf, start_of.back() + 64));  // the caller's buffer; the lambdas capture `packed`
  pool.parallel_for(int64_t(packings.size()) * n_groups, [&](int64_t task, int) {
    const size_t j = size_t(task / n_groups);
    const int64_t g = task % n_groups;
    ActRow xs[16];
    const int n = int(std::min<int64_t>(G, T - G * g));
    for (int i = 0; i < n; ++i) xs[i] = acts.row(G * g + i);
    pack_group(isa, packings[j], K, xs, n, packed + start_of[j] + size_t(g) * group_bytes[j]);
  });
  const int64_t n_tb = (T + kGemmBlock - 1) / kGemmBlock;
  std::vector<int64_t> first(size_t(n_parts) + 1, 0);  // first task of each part
  for (int p = 0; p < n_parts; ++p)
    first[size_t(p) + 1] = first[size_t(p)] + (parts[p].N + kRowGroup - 1) / kRowGroup * n_tb;
  pool.parallel_for(first.back(), [&](int64_t task, int) {
    const size_t pi = size_t(std::upper_bound(first.begin(), first.end(), task) - first.begin() - 1);
    const QMatvecPart& P = parts[pi];
    const size_t j = packing_of[pi];
    const int64_t n_rg = (P.N + kRowGroup - 1) / kRowGroup, local = task - first[pi];
    const int64_t rg = local % n_rg, tb = local / n_rg;
    const int64_t t0 = tb * kGemmBlock, t1 = std::min(T, t0 + kGemmBlock);
    const int nt = int(t1 - t0), R = int(std::min(P.N, (rg + 1) * kRowGroup) - rg * kRowGroup);
    float* res = task_buffer(0, size_t(kRowGroup * kGemmBlock));  // [row, token]
    packed_gemm(isa, P.type, P.w + rg * kRowGroup * P.row_bytes, P.row_bytes, R, K,
                packed + start_of[j] + size_t(t0 / G) * group_bytes[j], nt, res);
    float* dst[kGemmBlock];  // token-major: each token's R outputs are contiguous
    for (int s = 0; s < nt; ++s) dst[s] = P.out + (t0 + s) * P.N + rg * kRowGroup;
    rows_to_tokens(isa, res, R, nt, dst);
  });
}

// One thread's row tile.
struct Tile {
  std::vector<uint8_t> u;
  std::vector<float> a4, b16;
  void resize(int64_t K) {
    const size_t Kp = size_t(padded_k(K));
    u.resize(kTileRows * Kp);
    a4.resize(kTileRows * Kp / 4);
    b16.resize(size_t(kTileRows * padded_s16(K)));
  }
  void unpack(const Kernels& kr, const QWeights& w, int64_t row0, int R, int64_t K) {
    kr.unpack_rows(w.type, w.w + row0 * w.row_bytes, w.row_bytes, R, K, u.data(), a4.data(), b16.data());
  }
  void dot(const Kernels& kr, int R, int64_t K, const ActRow& x, bool wide, float* out) const {
    kr.dot_rows(u.data(), a4.data(), b16.data(), R, K, x, wide, out);
  }
};

struct Tiles {
  std::vector<Tile> per_thread;
  Tiles(int nth, int64_t K) : per_thread(size_t(nth)) {
    for (auto& t : per_thread) t.resize(K);
  }
  Tile& operator[](int ith) { return per_thread[size_t(ith)]; }
};

// From how many tokens a block takes the AVX-512 VNNI GEMM: the runtime knob (tessera/tuning.h vnni_gemm_min_tokens;
// 0: quant::kGemmMinTokens), never below 2 (one token is decode: the mat-vec, as quant_matvec_multi computes it).
int vnni_gemm_min_tokens() {
  const int64_t knob = tuning().vnni_gemm_min_tokens.load(std::memory_order_relaxed);
  return knob > 0 ? int(std::clamp<int64_t>(knob, 2, kTokenBlock + 1)) : quant::kGemmMinTokens;
}

// Whether a task goes through dot_block (an ISA that reads the blocks directly: AVX-512 VNNI and AVX2, their GEMM
// from its threshold on, dot_direct below) or through the row tiles (unpack_rows + dot_rows: Reference).
bool block_path(const Kernels& kr) { return kr.dot_direct != nullptr; }

// A row group over a token block read straight from the blocks: prefill on AVX-512 VNNI and AVX2 takes the GEMM
// (quant_gemm_avx512.cpp, quant_gemm_avx2.cpp) from its threshold on, decode and shorter blocks the ISA's dot_direct.
void dot_block(const Kernels& kr, QType t, const uint8_t* w, size_t row_bytes, int R, int64_t K, const ActRow* xs,
               int nt, float* out) {
  if (kr.isa == QIsa::AVX512VNNI && nt >= vnni_gemm_min_tokens())
    quant::gemm_avx512_vnni(t, w, row_bytes, R, K, xs, nt, out);
  else if (kr.isa == QIsa::AVX2 && nt >= quant_gemm_min_tokens(QIsa::AVX2, t))
    (avx2_gemm_uses_avx_vnni() ? quant::gemm_avx2_vnni : quant::gemm_avx2)(t, w, row_bytes, R, K, xs, nt, out);
  else
    kr.dot_direct(t, w, row_bytes, R, K, xs, nt, out);
}

inline float silu(float g) { return g / (1.0f + std::exp(-g)); }

// The MoE's prefill GEMM on AVX-512 VNNI / AMX and on AVX2: each expert with at least the ISA's GEMM threshold of
// tokens in a chunk has its tokens packed for the GEMM once (pack_group_tokens at a time, on the pool), shared by all
// its row groups and, when their packings agree, by gate and up; a task then runs kRowGroup rows over up to kGemmBlock
// of its tokens, so each row is decoded once per kGemmBlock tokens. Per (row, token) the arithmetic of the ISA's
// unpacked GEMM (gemm_avx512_vnni, gemm_avx2[_vnni]: bit-identical to it).
struct ExpertPacking {
  std::vector<size_t> off;  // per active expert: byte offset of its packed tokens, or kNone (row path)
  size_t group_bytes = 0;
  uint8_t* base = nullptr;
  static constexpr size_t kNone = ~size_t(0);
};

// Packs, for each active expert e with is_gemm(n_e), the rows act_row(e, s) of its slots s into `buf` (type t,
// K values): on the pool, one task per group of pack_group_tokens(isa) tokens.
template <class IsGemm, class ActRowOf>
void pack_experts(QIsa isa, QType t, int64_t K, const std::vector<int64_t>& active,
                  const std::vector<std::vector<int64_t>>& slots, IsGemm is_gemm, ActRowOf act_row,
                  std::vector<uint8_t>& buf, ExpertPacking& p, ThreadPool& pool) {
  const int G = pack_group_tokens(isa);
  p.group_bytes = packed_group_bytes(isa, t, K);
  p.off.assign(active.size(), ExpertPacking::kNone);
  std::vector<std::pair<int64_t, int64_t>> groups;  // (active index, token group)
  size_t total = 0;
  for (size_t ai = 0; ai < active.size(); ++ai) {
    const int64_t n = int64_t(slots[size_t(active[ai])].size());
    if (!is_gemm(n)) continue;
    p.off[ai] = total;
    for (int64_t g = 0; g * G < n; ++g) groups.emplace_back(int64_t(ai), g);
    total += size_t((n + G - 1) / G) * p.group_bytes;
  }
  p.base = aligned64(grown(buf, total + 64));
  pool.parallel_for(int64_t(groups.size()), [&](int64_t task, int) {
    const auto [ai, g] = groups[size_t(task)];
    const auto& sl = slots[size_t(active[size_t(ai)])];
    ActRow xs[16];
    const int n = int(std::min<int64_t>(G, int64_t(sl.size()) - G * g));
    for (int i = 0; i < n; ++i) xs[i] = act_row(sl[size_t(G * g + i)]);
    pack_group(isa, t, K, xs, n, p.base + p.off[size_t(ai)] + size_t(g) * p.group_bytes);
  });
}

}  // namespace

namespace quant {
static_assert(kDecodeMaxRows <= kRowGroup * kTokenBlock, "the one-token res buffers hold kDecodeMaxRows rows");
int64_t decode_task_rows(size_t row_bytes) {
  const int64_t knob = tuning().decode_rows.load(std::memory_order_relaxed);
  if (knob > 0) return std::min(knob, kDecodeMaxRows);
  const int64_t rows = int64_t(kDecodeTaskBytes / std::max<size_t>(row_bytes, 1)) / 16 * 16;
  return std::clamp(rows, kRowGroup, kDecodeMaxRows);
}
}  // namespace quant

int64_t quant_moe_default_chunk(QIsa) {
  // 2048 tokens (the engine's whole prefill step) on every ISA: each pass decodes every active expert's rows once, so a
  // longer pass reuses them over more tokens. AMX int8 tiles, T = 4096, Qwen3-30B-A3B Q4_K_M layer (AMX Xeon, 2 cores):
  // passes of 512 tokens 1073-1220 ms, 1024-4096 tokens 778-968 ms. AVX-512 VNNI and AVX2 (Zen 4, 2 cores), once the
  // pass's scratch stopped being allocated and zero-filled at every call (grown): bench-moe at T = 2048 1.3-1.9x
  // (VNNI) and 1.3-1.4x (AVX2) faster than with 256, and the 8-layer Q4_K_M file's 4096-token prefill 1.07-1.09x
  // (docs/BENCHMARKS.md "Prefill scratch kept"). Before, 256 had won on Zen 4 because every pass's fresh scratch
  // (~190 MB at 2048 tokens) cost more than the longer pass saved. `tessera-cli tune` measures it per CPU.
  return 2048;
}

int quant_gemm_min_tokens(QIsa isa, QType t) {
  switch (isa) {
    case QIsa::AMXInt8:
    case QIsa::AMXInt8Emu:
    case QIsa::AVX512VNNI: return vnni_gemm_min_tokens();
    case QIsa::AVX2: {
      const int64_t knob = tuning().avx2_gemm_min_tokens.load(std::memory_order_relaxed);  // 0: per type
      // Never below 2: decode (T = 1) keeps the row tiles (see avx2_gemm_min_tokens).
      return knob > 0 ? int(std::clamp<int64_t>(knob, 2, kTokenBlock + 1))
                      : quant::avx2_gemm_min_tokens(t, avx2_gemm_uses_avx_vnni());
    }
    default: return 0;
  }
}

void quant_matmul(QIsa isa, const QMatmulArgs& a, ThreadPool& pool) {
  const Kernels& kr = kernels_for(isa);
  const QMatvecPart part{a.type, a.w, a.row_bytes, a.N, a.out};
  if ((qisa_vnni(isa) || isa == QIsa::AVX2) && a.T >= quant_gemm_min_tokens(isa, a.type))
    return matmul_gemm_packed(isa, kr, a.x, a.T, a.K, &part, 1, pool);
  // One token on a direct-read kernel (the lm_head at decode): the decode mat-vec's ~256 KiB tasks and row streams,
  // not 32-row tasks (one stream each: the AMX Xeon's Q6_K lm_head read 11.5 GB/s that way). The same bits: each
  // row's dot_direct does not depend on the rows beside it.
  if (a.T == 1 && kr.dot_direct) return quant_matvec_multi(isa, a.x, a.K, &part, 1, pool);
  const bool wide = qtype_info(a.type).wide;
  thread_local Acts acts_of_thread;
  Acts& acts = acts_of_thread;  // the caller's (see matmul_gemm_packed)
  acts.resize(a.T, a.K);
  pool.parallel_for(a.T, [&](int64_t t, int) { acts.quantize(kr, t, a.x + t * a.K); });
  Tiles tiles(block_path(kr) ? 0 : pool.size(), a.K);  // the row tiles of Reference only (no scratch elsewhere)
  const QWeights w{a.type, a.w, a.row_bytes};
  const int64_t n_rg = (a.N + kRowGroup - 1) / kRowGroup, n_tb = (a.T + kTokenBlock - 1) / kTokenBlock;
  pool.parallel_for(n_rg * n_tb, [&](int64_t task, int ith) {
    const int64_t rg = task % n_rg, tb = task / n_rg;
    const int64_t t0 = tb * kTokenBlock, t1 = std::min(a.T, t0 + kTokenBlock);
    const int64_t n_end = std::min(a.N, (rg + 1) * kRowGroup);
    if (block_path(kr)) {
      ActRow xs[kTokenBlock];
      float res[kRowGroup * kTokenBlock];  // [row, token]
      const int nt = int(t1 - t0), R = int(n_end - rg * kRowGroup);
      for (int64_t t = t0; t < t1; ++t) xs[t - t0] = acts.row(t);
      dot_block(kr, a.type, a.w + rg * kRowGroup * a.row_bytes, a.row_bytes, R, a.K, xs, nt, res);
      for (int64_t t = t0; t < t1; ++t)  // token-major: each token's R outputs are contiguous
        for (int r = 0; r < R; ++r) a.out[t * a.N + rg * kRowGroup + r] = res[r * nt + (t - t0)];
      return;
    }
    Tile& tile = tiles[ith];
    float res[kTileRows];
    for (int64_t n0 = rg * kRowGroup; n0 < n_end; n0 += kTileRows) {
      const int R = int(std::min<int64_t>(kTileRows, a.N - n0));
      tile.unpack(kr, w, n0, R, a.K);
      for (int64_t t = t0; t < t1; ++t) {
        tile.dot(kr, R, a.K, acts.row(t), wide, res);
        for (int r = 0; r < R; ++r) a.out[t * a.N + n0 + r] = res[r];
      }
    }
  });
}

void quant_matmul_multi(QIsa isa, const float* x, int64_t T, int64_t K, const QMatvecPart* parts, int n_parts,
                        ThreadPool& pool) {
  if (T <= 0 || n_parts <= 0) return;
  bool gemm = qisa_vnni(isa) || isa == QIsa::AVX2;  // every part's tokens long enough for its GEMM
  for (int p = 0; p < n_parts; ++p) gemm = gemm && T >= quant_gemm_min_tokens(isa, parts[p].type);
  if (gemm) return matmul_gemm_packed(isa, kernels_for(isa), x, T, K, parts, n_parts, pool);
  if (T == 1) return quant_matvec_multi(isa, x, K, parts, n_parts, pool);  // quant_matmul at T = 1, bit for bit
  for (int p = 0; p < n_parts; ++p)  // the row paths: one call per weight
    quant_matmul(isa, {parts[p].type, parts[p].w, parts[p].row_bytes, parts[p].N, K, T, x, parts[p].out}, pool);
}

void quant_moe_forward(QIsa isa, const QMoeArgs& a, ThreadPool& pool) {
  prof::mark(prof::kMoeSetup);  // TESSERA_PROFILE inside a decode step (tessera/step_profile.h); else nothing
  const Kernels& kr = kernels_for(isa);
  const int64_t E = a.E, H = a.H, I = a.I, k = a.k;
  const bool wide_g = qtype_info(a.gate.type).wide, wide_u = qtype_info(a.up.type).wide,
             wide_d = qtype_info(a.down.type).wide;
  // Prefill on AVX-512 VNNI (and AMX) and on AVX2: an expert with at least its ISA's GEMM threshold of tokens takes
  // the packed GEMM (ExpertPacking: its tokens packed once, shared by its row groups and, where the packings agree, by
  // gate and up), and SiLU is the vector one; decode (T = 1) keeps the mat-vec and the scalar SiLU. AVX2's thresholds
  // are per type: gate and up take the GEMM from the larger of theirs (one packing), down from its own.
  const bool prefill_vnni = qisa_vnni(isa) && a.T > 1;
  const bool prefill_packed = (prefill_vnni || isa == QIsa::AVX2) && a.T > 1;
  // Read once: one call, one threshold per phase.
  const int64_t min_gu = std::max(quant_gemm_min_tokens(isa, a.gate.type), quant_gemm_min_tokens(isa, a.up.type));
  const int64_t min_d = quant_gemm_min_tokens(isa, a.down.type);
  auto is_gemm_gu = [&](int64_t n) { return prefill_packed && n >= min_gu; };
  auto is_gemm_d = [&](int64_t n) { return prefill_packed && n >= min_d; };
  const bool share_gu = same_packing(isa, a.gate.type, a.up.type);
  const int tile_threads = block_path(kr) ? 0 : pool.size();  // the row tiles of Reference only (no scratch elsewhere)
  Tiles tiles_g(tile_threads, H), tiles_u(tile_threads, H), tiles_d(tile_threads, I);
  // This pass's quantized x and hidden activations, act [slot, I] and y [slot, H]: the calling thread's grown
  // scratch, named by references, since a pool lambda naming a thread_local would get its own thread's instance.
  thread_local Acts xa_of_thread, ha_of_thread;
  thread_local SlotBuffer act_of_thread, y_of_thread;
  Acts &xa = xa_of_thread, &ha = ha_of_thread;
  float* act = nullptr;  // this pass's act_of_thread / y_of_thread storage (set per pass)
  float* y = nullptr;
  // Whether this pass writes act / y with streaming stores: when they are far larger than the caches, a plain store
  // first reads each line it overwrites (write-allocate), which doubles their memory traffic.
  bool stream_act = false, stream_y = false;
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));  // per expert: slots (t * k + j, t local to the chunk)
  thread_local std::vector<uint8_t> buf_g, buf_u, buf_d;  // packed tokens (grown on demand, kept for the next call)
  ExpertPacking pk_g, pk_u, pk_d;

  // g [R, nt] and u [R, nt] of slots sl[s0 ..] -> act[slot, i0 + r] = silu(g) * u.
  auto store_act = [&](float* g, const float* u, int R, int nt, const std::vector<int64_t>& sl, int64_t s0,
                       int64_t i0) {
    if (prefill_vnni) {
      quant::silu_mul_avx512(g, u, int64_t(R) * nt);
      float* dst[kGemmBlock];  // token-major: each slot's R outputs are contiguous
      for (int s = 0; s < nt; ++s) dst[s] = act + sl[size_t(s0 + s)] * I + i0;
      quant::rows_to_tokens_avx512(g, R, nt, dst, stream_act);
      return;
    }
    if (isa == QIsa::AVX2 && a.T > 1) {  // prefill on AVX2: the vector SiLU (decode keeps the scalar one)
      quant::silu_mul_avx2(g, u, int64_t(R) * nt);
      for (int s = 0; s < nt; ++s)
        for (int r = 0; r < R; ++r) act[size_t(sl[size_t(s0 + s)] * I + i0 + r)] = g[r * nt + s];
      return;
    }
    for (int s = 0; s < nt; ++s)
      for (int r = 0; r < R; ++r) act[size_t(sl[size_t(s0 + s)] * I + i0 + r)] = silu(g[r * nt + s]) * u[r * nt + s];
  };

  // Tokens per pass: a runtime knob (tessera/tuning.h quant_moe_chunk_tokens, measured by the calibration), 0 for the
  // ISA's default.
  const int64_t knob = tuning().quant_moe_chunk_tokens.load(std::memory_order_relaxed);
  const int64_t chunk = knob > 0 ? knob : quant_moe_default_chunk(isa);
  // Rows per task of each phase: kRowGroup, or at T = 1 on a direct-read kernel ~kDecodeTaskBytes of blocks
  // (decode_task_rows; the res buffers below hold kDecodeMaxRows rows at nt = 1).
  const bool decode_direct = a.T == 1 && kr.dot_direct;
  const int64_t rows_gu = decode_direct ? quant::decode_task_rows(a.gate.row_bytes) : kRowGroup;
  const int64_t rows_d = decode_direct ? quant::decode_task_rows(a.down.row_bytes) : kRowGroup;
  for (int64_t c0 = 0; c0 < a.T; c0 += chunk) {
    const int64_t T = std::min(chunk, a.T - c0);
    const int64_t* ids = a.ids + c0 * k;
    const float* x = a.x + c0 * H;
    for (auto& s : slots) s.clear();
    for (int64_t i = 0; i < T * k; ++i)
      if (ids[i] >= 0) slots[size_t(ids[i])].push_back(i);
    std::vector<int64_t> active;  // experts with work, and the task offsets of the gate/up and down phases
    for (int64_t e = 0; e < E; ++e)
      if (!slots[size_t(e)].empty()) active.push_back(e);

    stream_act = T * k * I * int64_t(sizeof(float)) >= kStreamMinBytes;
    stream_y = T * k * H * int64_t(sizeof(float)) >= kStreamMinBytes;
    prof::mark(prof::kMoeQuantX);
    xa.resize(T, H);
    pool.parallel_for(T, [&](int64_t t, int) { xa.quantize(kr, t, x + t * H); });
    if (prefill_packed) {
      auto x_row = [&](int64_t slot) { return xa.row(slot / k); };
      pack_experts(isa, a.gate.type, H, active, slots, is_gemm_gu, x_row, buf_g, pk_g, pool);
      if (!share_gu) pack_experts(isa, a.up.type, H, active, slots, is_gemm_gu, x_row, buf_u, pk_u, pool);
    }
    const ExpertPacking& pu = share_gu ? pk_g : pk_u;

    // Phase gate/up: act[slot, i] = silu(gate_e x_t)[i] * (up_e x_t)[i].
    prof::mark(prof::kMoeGateUp);
    act = act_of_thread.grow(size_t(T * k * I));
    auto block_gu = [&](int64_t e) {  // tokens per task, gate/up
      return is_gemm_gu(int64_t(slots[size_t(e)].size())) ? kGemmBlock : kTokenBlock;
    };
    auto block_d = [&](int64_t e) { return is_gemm_d(int64_t(slots[size_t(e)].size())) ? kGemmBlock : kTokenBlock; };
    auto tasks_of = [&](int64_t rows, int64_t rg_rows, int64_t e, int64_t tb) {
      return ((rows + rg_rows - 1) / rg_rows) * ((int64_t(slots[size_t(e)].size()) + tb - 1) / tb);
    };
    std::vector<int64_t> start(active.size() + 1, 0);
    for (size_t i = 0; i < active.size(); ++i)
      start[i + 1] = start[i] + tasks_of(I, rows_gu, active[i], block_gu(active[i]));
    pool.parallel_for(start.back(), [&](int64_t task, int ith) {
      const size_t ai = size_t(std::upper_bound(start.begin(), start.end(), task) - start.begin() - 1);
      const int64_t e = active[ai], local = task - start[ai], n_rg = (I + rows_gu - 1) / rows_gu;
      const int64_t rg = local % n_rg, tb = local / n_rg, blk = block_gu(e);
      const auto& sl = slots[size_t(e)];
      const int64_t s0 = tb * blk, s1 = std::min<int64_t>(int64_t(sl.size()), s0 + blk);
      const int nt = int(s1 - s0);
      const int64_t i0 = rg * rows_gu;
      const int R = int(std::min(I, i0 + rows_gu) - i0);
      if (prefill_packed && pk_g.off[ai] != ExpertPacking::kNone) {  // the packed GEMM
        float* g = task_buffer(0, size_t(kRowGroup * kGemmBlock));  // [row, token]
        float* u = task_buffer(1, size_t(kRowGroup * kGemmBlock));
        const int G = pack_group_tokens(isa);
        packed_gemm(isa, a.gate.type, a.gate.w + (e * I + i0) * a.gate.row_bytes, a.gate.row_bytes, R, H,
                    pk_g.base + pk_g.off[ai] + size_t(s0 / G) * pk_g.group_bytes, nt, g);
        packed_gemm(isa, a.up.type, a.up.w + (e * I + i0) * a.up.row_bytes, a.up.row_bytes, R, H,
                    pu.base + pu.off[ai] + size_t(s0 / G) * pu.group_bytes, nt, u);
        store_act(g, u, R, nt, sl, s0, i0);
        return;
      }
      if (block_path(kr)) {  // the blocks read directly
        ActRow xs[kTokenBlock];
        float g[kRowGroup * kTokenBlock], u[kRowGroup * kTokenBlock];  // [row, token]
        for (int64_t s = s0; s < s1; ++s) xs[s - s0] = xa.row(sl[size_t(s)] / k);
        dot_block(kr, a.gate.type, a.gate.w + (e * I + i0) * a.gate.row_bytes, a.gate.row_bytes, R, H, xs, nt, g);
        dot_block(kr, a.up.type, a.up.w + (e * I + i0) * a.up.row_bytes, a.up.row_bytes, R, H, xs, nt, u);
        store_act(g, u, R, nt, sl, s0, i0);
        return;
      }
      Tile &tg = tiles_g[ith], &tu = tiles_u[ith];
      float g[kTileRows], u[kTileRows];
      for (int64_t r0 = i0; r0 < i0 + R; r0 += kTileRows) {
        const int Rt = int(std::min<int64_t>(kTileRows, I - r0));
        tg.unpack(kr, a.gate, e * I + r0, Rt, H);
        tu.unpack(kr, a.up, e * I + r0, Rt, H);
        for (int64_t s = s0; s < s1; ++s) {
          const ActRow xr = xa.row(sl[size_t(s)] / k);
          tg.dot(kr, Rt, H, xr, wide_g, g);
          tu.dot(kr, Rt, H, xr, wide_u, u);
          float* dst = act + sl[size_t(s)] * I + r0;
          for (int r = 0; r < Rt; ++r) dst[r] = silu(g[r]) * u[r];
        }
      }
    });

    // Quantize the activations of the used slots.
    prof::mark(prof::kMoeQuantAct);
    std::vector<int64_t> used;
    for (int64_t i = 0; i < T * k; ++i)
      if (ids[i] >= 0) used.push_back(i);
    ha.resize(T * k, I);
    pool.parallel_for(int64_t(used.size()), [&](int64_t n, int) {
      ha.quantize(kr, used[size_t(n)], act + used[size_t(n)] * I);
    });
    if (prefill_packed)
      pack_experts(isa, a.down.type, I, active, slots, is_gemm_d, [&](int64_t slot) { return ha.row(slot); }, buf_d,
                   pk_d, pool);

    // Phase down: y[slot, h] = (down_e act_slot)[h].
    prof::mark(prof::kMoeDown);
    y = y_of_thread.grow(size_t(T * k * H));
    for (size_t i = 0; i < active.size(); ++i)
      start[i + 1] = start[i] + tasks_of(H, rows_d, active[i], block_d(active[i]));
    pool.parallel_for(start.back(), [&](int64_t task, int ith) {
      const size_t ai = size_t(std::upper_bound(start.begin(), start.end(), task) - start.begin() - 1);
      const int64_t e = active[ai], local = task - start[ai], n_rg = (H + rows_d - 1) / rows_d;
      const int64_t rg = local % n_rg, tb = local / n_rg, blk = block_d(e);
      const auto& sl = slots[size_t(e)];
      const int64_t s0 = tb * blk, s1 = std::min<int64_t>(int64_t(sl.size()), s0 + blk);
      const int nt = int(s1 - s0);
      const int64_t h0 = rg * rows_d;
      const int R = int(std::min(H, h0 + rows_d) - h0);
      if (prefill_packed && pk_d.off[ai] != ExpertPacking::kNone) {  // the packed GEMM
        float* res = task_buffer(0, size_t(kRowGroup * kGemmBlock));  // [row, token]
        packed_gemm(isa, a.down.type, a.down.w + (e * H + h0) * a.down.row_bytes, a.down.row_bytes, R, I,
                    pk_d.base + pk_d.off[ai] + size_t(s0 / pack_group_tokens(isa)) * pk_d.group_bytes, nt, res);
        float* dst[kGemmBlock];
        for (int s = 0; s < nt; ++s) dst[s] = y + sl[size_t(s0 + s)] * H + h0;
        rows_to_tokens(isa, res, R, nt, dst, stream_y);
        return;
      }
      if (block_path(kr)) {
        ActRow xs[kTokenBlock];
        float res[kRowGroup * kTokenBlock];  // [row, token]
        for (int64_t s = s0; s < s1; ++s) xs[s - s0] = ha.row(sl[size_t(s)]);
        dot_block(kr, a.down.type, a.down.w + (e * H + h0) * a.down.row_bytes, a.down.row_bytes, R, I, xs, nt, res);
        for (int64_t s = s0; s < s1; ++s)
          for (int r = 0; r < R; ++r) y[size_t(sl[size_t(s)] * H + h0 + r)] = res[r * nt + (s - s0)];
        return;
      }
      Tile& td = tiles_d[ith];
      float res[kTileRows];
      for (int64_t r0 = h0; r0 < h0 + R; r0 += kTileRows) {
        const int Rt = int(std::min<int64_t>(kTileRows, H - r0));
        td.unpack(kr, a.down, e * H + r0, Rt, I);
        for (int64_t s = s0; s < s1; ++s) {
          td.dot(kr, Rt, I, ha.row(sl[size_t(s)]), wide_d, res);
          float* dst = y + sl[size_t(s)] * H + r0;
          for (int r = 0; r < Rt; ++r) dst[r] = res[r];
        }
      }
    });

    // Reduce: out[t] = sum_j weights[t, j] * y[t * k + j] over the slots that ran here.
    prof::mark(prof::kMoeReduce);
    const float* wts = a.weights + c0 * k;
    float* out = a.out + c0 * H;
    pool.parallel_for(T, [&](int64_t t, int) {
      float* o = out + t * H;
      std::fill(o, o + H, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        if (ids[t * k + j] < 0) continue;
        const float wj = wts[t * k + j];
        const float* yr = y + (t * k + j) * H;
        for (int64_t h = 0; h < H; ++h) o[h] += wj * yr[h];
      }
    });
  }
}

namespace quant {
uint8_t* gemm_scratch(size_t bytes) {
  struct Buf {
    uint8_t* p = nullptr;
    size_t n = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf buf;
  if (buf.n < bytes) {
    std::free(buf.p);
    buf.n = (bytes + 4095) / 4096 * 4096;
    buf.p = static_cast<uint8_t*>(std::aligned_alloc(64, buf.n));
  }
  return buf.p;
}
}  // namespace quant

}  // namespace tessera
