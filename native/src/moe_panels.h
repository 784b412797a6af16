// The bf16 "pair panel" layout shared by the AVX512 and AVX2 backends (one packing, two ISAs).
//
// A weight matrix W [N, K] (nn.Linear: N outputs, K inputs) becomes ceil(N/16) panels; a panel holds 16 outputs and
// Kp = ceil(K/2) rows of 64 bytes: row p = {W[n0,2p], W[n0,2p+1], W[n1,2p], W[n1,2p+1], ..., W[n15,2p+1]} in bf16.
// Read as 32-bit lanes, lane i is output i's pair: `lane << 16` is the even input's weight, `lane & 0xffff0000` the
// odd one (exact bf16 -> f32), and the same 64 bytes feed vdpbf16ps directly. Padding (n >= N, k >= K) is zero.
// Per expert: gate/up interleaved panel by panel (gate 0, up 0, gate 1, up 1, ...) so one task sees both halves of
// silu(gate) * up; then the down panels. The blob: header | experts' gate/up panels | experts' down panels.
#pragma once
#include <cstdint>
#include <vector>

#include "tessera/backend.h"
#include "tessera/tuning.h"

namespace tessera {

struct PanelLayout {
  int64_t E, H, I;
  int64_t kpH, kpI;          // pairs along H (gate/up input) and along I (down input)
  int64_t nbI, nbH;          // 16-output panels of gate (=up) and of down
  size_t panel_gu, panel_d;  // bytes per panel
  size_t expert_gu, expert_d;
  size_t off_gu, off_d, total;

  explicit PanelLayout(const MoeDims& d) : E(d.E), H(d.H), I(d.I) {
    kpH = (H + 1) / 2;
    kpI = (I + 1) / 2;
    nbI = (I + 15) / 16;
    nbH = (H + 15) / 16;
    panel_gu = size_t(kpH) * 64;
    panel_d = size_t(kpI) * 64;
    expert_gu = 2 * size_t(nbI) * panel_gu;
    expert_d = size_t(nbH) * panel_d;
    off_gu = sizeof(PackedHeader);
    off_d = off_gu + size_t(E) * expert_gu;
    total = off_d + size_t(E) * expert_d;
  }
  // Gate panel b of expert e is panel 2b, up panel b is 2b+1.
  const uint8_t* gu(const uint8_t* blob, int64_t e, int64_t panel) const {
    return blob + off_gu + size_t(e) * expert_gu + size_t(panel) * panel_gu;
  }
  const uint8_t* down(const uint8_t* blob, int64_t e, int64_t panel) const {
    return blob + off_d + size_t(e) * expert_d + size_t(panel) * panel_d;
  }
};

// Shared by AVX512 and AVX2 (moe_panels.cpp, portable): packing and unpacking of the layout above.
void pack_panels(const char* backend, const MoeDims& d, const WeightsIn& w, uint8_t* dst, ThreadPool& pool);
void unpack_panels(const char* backend, const uint8_t* packed, int64_t e, float* gate, float* up, float* down);

// Routing of one forward call: the (token, slot) pairs grouped by expert (counting sort), skipped slots dropped.
struct Routing {
  std::vector<int64_t> offset;  // [E + 1]: rows of expert e are rows[offset[e] .. offset[e+1])
  std::vector<int64_t> rows;    // [R]: slot index t * k + j
  std::vector<int64_t> row_of;  // [T * k]: slot -> row, -1 when skipped
  std::vector<int64_t> active;  // experts with at least one row
  void build(int64_t E, int64_t T, int64_t k, const int64_t* ids);
};

}  // namespace tessera

namespace tessera {
// A micro-tile over the pair-panel layout: C[m*ldc + n] (+)= A row m . W row n over 2*kp inputs, for m < mr,
// n < nb*16 (accumulate: add to C instead of overwriting). A[m] points to f32 values (f32 tiles) or bf16 pairs packed
// in uint32 (bf16 tiles); mr <= 8, nb <= 4. B lines `prefetch` bytes ahead are prefetched (the next K block).
using TileFn = void (*)(const uint8_t* B, size_t panel_bytes, int nb, int64_t kp, const void* const* A, int mr,
                        float* C, int ldc, bool accumulate, size_t prefetch);
// Prefill threshold: at or above this many tokens, backends with a bf16 tile round activations to bf16 pairs.
constexpr int64_t kBf16MinTokens = 16;
// Tokens per internal chunk of one forward call (bounds the scratch memory of long prompts).
constexpr int64_t kMaxChunkTokens = 1024;
}  // namespace tessera
