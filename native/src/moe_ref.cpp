// Reference backend: plain scalar C++, weights kept as loaded (f32/f16/bf16), double accumulation. The correctness
// twin every other backend is tested against, and the fallback on any CPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tessera/backend.h"

namespace tessera {
namespace {

constexpr const char* kName = "Reference";

size_t elem_size(WeightType t) { return t == WeightType::F32 ? 4 : 2; }

struct RefLayout {
  size_t gate, up, down, total;  // byte offsets from the blob start
};

RefLayout layout(const MoeDims& d, WeightType t) {
  size_t mat = round_up(size_t(d.E * d.I * d.H) * elem_size(t), kAlign);
  RefLayout l;
  l.gate = sizeof(PackedHeader);
  l.up = l.gate + mat;
  l.down = l.up + mat;
  l.total = l.down + mat;
  return l;
}

bool supported(const CpuFeatures&, std::string* why) {
  *why = "portable scalar C++ (slow; the correctness twin)";
  return true;
}

size_t packed_bytes(const MoeDims& d, WeightType t) { return layout(d, t).total; }

void pack(const MoeDims& d, const WeightsIn& w, uint8_t* dst, ThreadPool&) {
  write_header(dst, kName, d, w.type);
  RefLayout l = layout(d, w.type);
  size_t n = size_t(d.E * d.I * d.H) * elem_size(w.type);
  std::memcpy(dst + l.gate, w.gate, n);
  std::memcpy(dst + l.up, w.up, n);
  std::memcpy(dst + l.down, w.down, n);
}

void unpack(const uint8_t* packed, int64_t e, float* gate, float* up, float* down) {
  WeightType t;
  MoeDims d = read_header(packed, kName, &t);
  RefLayout l = layout(d, t);
  size_t n = size_t(d.I * d.H), base = size_t(e) * n;
  for (size_t i = 0; i < n; ++i) {
    gate[i] = load_weight(t, packed + l.gate, base + i);
    up[i] = load_weight(t, packed + l.up, base + i);
    down[i] = load_weight(t, packed + l.down, base + i);
  }
}

void forward(const uint8_t* packed, int64_t T, int64_t k, const int64_t* ids, const float* weights, const float* x,
             float* out, ThreadPool& pool) {
  WeightType t;
  MoeDims d = read_header(packed, kName, &t);
  RefLayout l = layout(d, t);
  const int64_t H = d.H, I = d.I;
  std::vector<float> act(size_t(T * k * I));  // [T, k, I]: silu(gate x) * up x
  pool.parallel_for(T * k, [&](int64_t tj, int) {
    int64_t e = ids[tj];
    if (e < 0) return;
    const float* xt = x + (tj / k) * H;
    for (int64_t i = 0; i < I; ++i) {
      double g = 0, u = 0;
      size_t row = size_t((e * I + i) * H);
      for (int64_t h = 0; h < H; ++h) {
        g += double(load_weight(t, packed + l.gate, row + h)) * xt[h];
        u += double(load_weight(t, packed + l.up, row + h)) * xt[h];
      }
      act[size_t(tj * I + i)] = float(g / (1.0 + std::exp(-g)) * u);
    }
  });
  const int64_t chunk = 64, chunks = (H + chunk - 1) / chunk;  // (token, H chunk) tasks: one token uses every thread
  pool.parallel_for(T * chunks, [&](int64_t task, int) {
    const int64_t tok = task / chunks, h0 = (task % chunks) * chunk, h1 = std::min(H, h0 + chunk);
    for (int64_t h = h0; h < h1; ++h) {
      double acc = 0;
      for (int64_t j = 0; j < k; ++j) {
        int64_t e = ids[tok * k + j];
        if (e < 0) continue;
        const float* a = act.data() + (tok * k + j) * I;
        size_t row = size_t((e * H + h) * I);
        double y = 0;
        for (int64_t i = 0; i < I; ++i) y += double(load_weight(t, packed + l.down, row + i)) * a[i];
        acc += double(weights[tok * k + j]) * y;
      }
      out[tok * H + h] = float(acc);
    }
  });
}

const BackendOps kOps = {kName, IsaLevel::Reference, false, 0, "as loaded",
                         "scalar C++, double accumulation: the correctness twin of every kernel, runs anywhere", supported, packed_bytes, pack, unpack, forward};
TESSERA_REGISTER_BACKEND(kOps);

}  // namespace
}  // namespace tessera
