// Attention over a q8_0 KV cache (tessera/attention_q8.h): dispatch, and the scalar reference (double accumulation
// over the dequantized cache). Portable: no ISA flags.
#include "tessera/attention_q8.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/cpu.h"

namespace tessera {
namespace {

bool avx512_vnni_ok(int64_t hd) {
  static const bool cpu = [] {
    const CpuFeatures& c = cpu_features();
    return c.avx512f && c.avx512bw && c.avx512vl && c.avx512dq && c.avx512_vnni && c.os_avx512 &&
           max_isa_cap() >= IsaLevel::AVX512;
  }();
  return cpu && hd % 32 == 0 && hd <= 512;
}

// The AVX2 kernel (vpmaddubsw, F16C for the scales): attention.cpp's AVX2 check plus f16c, and the VNNI kernel's head
// dims. Chosen where the VNNI kernel is not (no AVX-512 VNNI, or TESSERA_MAX_ISA=avx2).
bool avx2_ok(int64_t hd) {
  static const bool cpu = [] {
    const CpuFeatures& c = cpu_features();
    return c.avx2 && c.fma && c.f16c && c.os_avx && max_isa_cap() >= IsaLevel::AVX2;
  }();
  return cpu && hd % 32 == 0 && hd <= 512;
}

}  // namespace

const char* attention_q8_kernel_name(int64_t hd) {
  if (avx512_vnni_ok(hd)) return "AVX512_VNNI";
  return avx2_ok(hd) ? "AVX2" : "Reference";
}

void attention_q8_reference(const AttentionQ8Args& a, ThreadPool& pool) {
  const int64_t g = a.nh / a.nkv, hd = a.hd, nb = hd / kQ8Block, tiles = a.C / kQ8Block;
  pool.parallel_for(a.nh * a.T, [&](int64_t task, int) {
    const int64_t hq = task / a.T, t = task % a.T, h = hq / g, S = a.start + t + 1;  // keys [0, S)
    const float* q = a.q + (hq * a.T + t) * hd;
    std::vector<double> s(size_t(S), 0.0), o(size_t(hd), 0.0);
    double mx = -INFINITY;
    for (int64_t j = 0; j < S; ++j) {
      const int64_t tile = h * tiles + j / kQ8Block, lane = j % kQ8Block;
      const int8_t* kt = a.k + tile * hd * kQ8Block;  // [hd/4][32][4]
      double d = 0.0;
      for (int64_t i = 0; i < hd; ++i) {
        const double scale = f16_to_f32(a.ks[(tile * nb + i / kQ8Block) * kQ8Block + lane]);
        d += double(q[i]) * double(kt[((i / 4) * kQ8Block + lane) * 4 + i % 4]) * scale;
      }
      s[size_t(j)] = d * double(a.scale);
      mx = std::max(mx, s[size_t(j)]);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < S; ++j) {
      const double p = std::exp(s[size_t(j)] - mx);
      sum += p;
      const int64_t tile = h * tiles + j / kQ8Block, lane = j % kQ8Block;
      const int8_t* vr = a.v + (h * a.C + (j / 4) * 4) * hd;  // [hd][4]
      for (int64_t i = 0; i < hd; ++i)
        o[size_t(i)] += p * double(vr[i * 4 + j % 4]) * double(f16_to_f32(a.vs[(tile * nb + i / kQ8Block) * kQ8Block + lane]));
    }
    float* out = a.out + (t * a.nh + hq) * hd;
    for (int64_t i = 0; i < hd; ++i) out[i] = float(o[size_t(i)] / sum);
  });
}

void attention_q8(const AttentionQ8Args& a, ThreadPool& pool) {
  if (avx512_vnni_ok(a.hd)) attention_isa::attention_q8_avx512_vnni(a, pool);
  else if (avx2_ok(a.hd)) attention_isa::attention_q8_avx2(a, pool);
  else attention_q8_reference(a, pool);
}

void attention_q8_with(const AttentionQ8Args& a, ThreadPool& pool, const std::string& kernel) {
  if (kernel == "Reference") return attention_q8_reference(a, pool);
  if (kernel == "AVX512_VNNI" && avx512_vnni_ok(a.hd)) return attention_isa::attention_q8_avx512_vnni(a, pool);
  if (kernel == "AVX2" && avx2_ok(a.hd)) return attention_isa::attention_q8_avx2(a, pool);
  throw std::invalid_argument("kernel: '" + kernel + "' is not a q8_0 attention kernel this CPU runs for head dim " +
                              std::to_string(a.hd) + " (AVX512_VNNI, AVX2 or Reference)");
}

}  // namespace tessera
