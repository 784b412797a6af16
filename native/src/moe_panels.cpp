// Packing/unpacking of the bf16 pair-panel layout (moe_panels.h) and the routing sort; portable C++.
#include "moe_panels.h"

#include <cstring>

#include "tessera/bf16.h"

namespace tessera {
namespace {

uint16_t to_bf16(WeightType t, const void* base, size_t index) {
  if (t == WeightType::BF16) return static_cast<const uint16_t*>(base)[index];
  return f32_to_bf16(load_weight(t, base, index));
}

// W [N, K] of expert e (element (n, k) at base index e*N*K + n*K + k) -> panel b at dst.
void pack_panel(WeightType t, const void* W, int64_t e, int64_t N, int64_t K, int64_t b, uint8_t* dst) {
  uint16_t* out = reinterpret_cast<uint16_t*>(dst);
  const int64_t kp = (K + 1) / 2;
  if (t == WeightType::BF16 && K % 2 == 0) {  // fast path: each input pair is one 32-bit word, row by row
    uint32_t* out32 = reinterpret_cast<uint32_t*>(dst);
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t n = b * 16 + i;
      if (n >= N) {
        for (int64_t p = 0; p < kp; ++p) out32[p * 16 + i] = 0;
        continue;
      }
      const uint16_t* row = static_cast<const uint16_t*>(W) + size_t((e * N + n) * K);
      for (int64_t p = 0; p < kp; ++p) {
        uint32_t pair;
        std::memcpy(&pair, row + 2 * p, 4);
        out32[p * 16 + i] = pair;
      }
    }
    return;
  }
  for (int64_t p = 0; p < kp; ++p)
    for (int64_t i = 0; i < 16; ++i)
      for (int64_t q = 0; q < 2; ++q) {
        int64_t n = b * 16 + i, k = 2 * p + q;
        out[(p * 16 + i) * 2 + q] = (n < N && k < K) ? to_bf16(t, W, size_t((e * N + n) * K + k)) : 0;
      }
}

void unpack_panel(const uint8_t* src, int64_t N, int64_t K, int64_t b, float* W) {
  const uint16_t* in = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < 16 && b * 16 + i < N; ++i)
    for (int64_t k = 0; k < K; ++k) W[(b * 16 + i) * K + k] = bf16_to_f32(in[((k / 2) * 16 + i) * 2 + (k % 2)]);
}

}  // namespace

void pack_panels(const char* backend, const MoeDims& d, const WeightsIn& w, uint8_t* dst, ThreadPool& pool) {
  write_header(dst, backend, d, w.type);
  PanelLayout L(d);
  pool.parallel_for(d.E, [&](int64_t e, int) {
    for (int64_t b = 0; b < L.nbI; ++b) {
      pack_panel(w.type, w.gate, e, d.I, d.H, b, const_cast<uint8_t*>(L.gu(dst, e, 2 * b)));
      pack_panel(w.type, w.up, e, d.I, d.H, b, const_cast<uint8_t*>(L.gu(dst, e, 2 * b + 1)));
    }
    for (int64_t b = 0; b < L.nbH; ++b) pack_panel(w.type, w.down, e, d.H, d.I, b, const_cast<uint8_t*>(L.down(dst, e, b)));
  });
}

void unpack_panels(const char* backend, const uint8_t* packed, int64_t e, float* gate, float* up, float* down) {
  PanelLayout L(read_header(packed, backend));
  for (int64_t b = 0; b < L.nbI; ++b) {
    unpack_panel(L.gu(packed, e, 2 * b), L.I, L.H, b, gate);
    unpack_panel(L.gu(packed, e, 2 * b + 1), L.I, L.H, b, up);
  }
  for (int64_t b = 0; b < L.nbH; ++b) unpack_panel(L.down(packed, e, b), L.H, L.I, b, down);
}

void Routing::build(int64_t E, int64_t T, int64_t k, const int64_t* ids) {
  offset.assign(size_t(E + 1), 0);
  for (int64_t s = 0; s < T * k; ++s)
    if (ids[s] >= 0) ++offset[size_t(ids[s] + 1)];
  for (int64_t e = 0; e < E; ++e) offset[size_t(e + 1)] += offset[size_t(e)];
  rows.assign(size_t(offset[size_t(E)]), 0);
  row_of.assign(size_t(T * k), -1);
  std::vector<int64_t> fill(offset.begin(), offset.end() - 1);
  for (int64_t s = 0; s < T * k; ++s) {
    int64_t e = ids[s];
    if (e < 0) continue;
    int64_t r = fill[size_t(e)]++;
    rows[size_t(r)] = s;
    row_of[size_t(s)] = r;
  }
  active.clear();
  for (int64_t e = 0; e < E; ++e)
    if (offset[size_t(e + 1)] > offset[size_t(e)]) active.push_back(e);
}

}  // namespace tessera
