// attention_prepare (tessera/attention.h): what engine.model.Attention does between its projections and the causal
// kernel, in one pass on the pool: per-head RMSNorm of q and k, RoPE (neox: rotate_half), k and v rounded to bf16 into
// the tiled cache. Before this, torch did it at one thread (a model step on native weights runs torch at one thread)
// in ~a dozen passes over [T, nh, hd] f32, plus an indexed scatter of k into the tiles. Portable: no ISA flags (the
// work is O(T * (nh + 2 nkv) * hd), a few ms at 4096 tokens beside the kernel's O(T^2)).
//
// Tasks are runs of <= 32 tokens that never cross a key tile, so each task owns the tile lanes it writes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/attention.h"
#include "tessera/bf16.h"
#include "tessera/row_norm.h"

namespace tessera {
namespace {

constexpr int64_t kTile = 32;  // positions per key tile ([nkv, ceil(C/32), hd, 32])

// y = rms_norm_row(x) (tessera/row_norm.h), then RoPE: out = y * cos + rotate_half(y) * sin, with
// rotate_half(y) = (-y[half:], y[:half]); as engine.model.rms_norm and Rope.apply (and decode_layer.cpp) compute them.
// x and out may be the same row.
void norm_rope(const float* x, const float* weight, const float* cos, const float* sin, int64_t hd, float eps,
               float* y, float* out) {
  rms_norm_row(x, weight, hd, eps, y);
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = y[i], b = y[i + half];
    out[i] = a * cos[i] + -b * sin[i];
    out[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

}  // namespace

void attention_prepare(const AttentionPrepareArgs& a, ThreadPool& pool) {
  const int64_t hd = a.hd, tiles = (a.C + kTile - 1) / kTile;
  const int64_t first_tile = a.start / kTile, last_tile = (a.start + a.T - 1) / kTile;
  pool.parallel_for(last_tile - first_tile + 1, [&](int64_t task, int) {
    const int64_t tile = first_tile + task;
    const int64_t p0 = std::max(a.start, tile * kTile), p1 = std::min(a.start + a.T, (tile + 1) * kTile);  // positions
    thread_local std::vector<float> y, row;
    y.resize(size_t(hd));
    row.resize(size_t(hd));
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t t = p - a.start;
      const float* cos = a.cos + t * hd;
      const float* sin = a.sin + t * hd;
      float* q = a.q + t * a.q_stride;  // [nh, hd], in place
      for (int64_t h = 0; h < a.nh; ++h) norm_rope(q + h * hd, a.q_norm, cos, sin, hd, a.eps, y.data(), q + h * hd);
      const float* k = a.k + t * a.k_stride;  // [nkv, hd]
      const float* v = a.v + t * a.v_stride;  // [nkv, hd]
      for (int64_t h = 0; h < a.nkv; ++h) {
        norm_rope(k + h * hd, a.k_norm, cos, sin, hd, a.eps, y.data(), row.data());
        uint16_t* kdst = a.kt + ((h * tiles + tile) * hd) * kTile + p % kTile;  // [h][tile][d][lane]
        uint16_t* vdst = a.vc + (h * a.C + p) * hd;                             // [h][p][d]
        for (int64_t d = 0; d < hd; ++d) {
          kdst[d * kTile] = f32_to_bf16(row[size_t(d)]);
          vdst[d] = f32_to_bf16(v[h * hd + d]);
        }
      }
    }
  });
}

}  // namespace tessera
