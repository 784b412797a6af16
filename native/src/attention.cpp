// Attention over a bf16 KV cache: dispatch, and the scalar reference (double accumulation). Portable: no ISA flags.
#include "tessera/attention.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/bf16.h"
#include "tessera/cpu.h"

namespace tessera {
namespace {

bool avx512_ok(int64_t hd) {
  static const bool cpu = [] {
    const CpuFeatures& c = cpu_features();
    return c.avx512f && c.os_avx512 && max_isa_cap() >= IsaLevel::AVX512;
  }();
  return cpu && hd % 32 == 0 && hd <= 512;
}

bool avx2_ok(int64_t hd) {
  static const bool cpu = [] {
    const CpuFeatures& c = cpu_features();
    return c.avx2 && c.fma && c.os_avx && max_isa_cap() >= IsaLevel::AVX2;
  }();
  return cpu && hd % 8 == 0 && hd <= 512;
}

bool avx512_bf16_ok(int64_t hd) {
  static const bool cpu = [] {
    const CpuFeatures& c = cpu_features();
    return c.avx512bw && c.avx512vl && c.avx512dq && c.avx512_bf16;
  }();
  return cpu && avx512_ok(hd);
}

// AMX tiles for both block products: the CPU has AMX-BF16, the OS enables the tile state, Linux granted XTILEDATA, and
// TESSERA_MAX_ISA does not cap below AMX.
bool amx_bf16_ok(int64_t hd) {
  static const bool cpu = [] {
    const CpuFeatures& c = cpu_features();
    return c.amx_tile && c.amx_bf16 && c.os_amx && c.amx_permitted && max_isa_cap() >= IsaLevel::AMX;
  }();
  return cpu && avx512_bf16_ok(hd);
}

}  // namespace

const char* attention_kernel_name(int64_t hd) {
  if (avx512_ok(hd)) return "AVX512";
  return avx2_ok(hd) ? "AVX2" : "Reference";
}

const char* attention_prefill_kernel_name(int64_t hd) {
  if (amx_bf16_ok(hd)) return "AMX_BF16";
  return avx512_bf16_ok(hd) ? "AVX512_BF16" : attention_kernel_name(hd);
}

void attention_bf16_reference(const AttentionArgs& a, ThreadPool& pool) {
  const int64_t g = a.nh / a.nkv;
  pool.parallel_for(a.nh * a.T, [&](int64_t task, int) {
    const int64_t hq = task / a.T, t = task % a.T, h = hq / g, S = a.start + t + 1;  // keys [0, S)
    const float* q = a.q + (a.q_token_major ? t * a.nh + hq : hq * a.T + t) * a.hd;
    const uint16_t* kt = a.kt + h * ((a.C + 31) / 32) * 32 * a.hd;  // [ceil(C/32), hd, 32]
    const uint16_t* v = a.v + h * a.C * a.hd;
    std::vector<double> s(size_t(S), 0.0), o(size_t(a.hd), 0.0);
    double mx = -INFINITY;
    for (int64_t j = 0; j < S; ++j) {
      double d = 0.0;
      for (int64_t i = 0; i < a.hd; ++i) d += double(q[i]) * double(bf16_to_f32(kt[(j / 32) * a.hd * 32 + i * 32 + j % 32]));
      s[size_t(j)] = d * double(a.scale);
      mx = std::max(mx, s[size_t(j)]);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < S; ++j) {
      const double p = std::exp(s[size_t(j)] - mx);
      sum += p;
      for (int64_t i = 0; i < a.hd; ++i) o[size_t(i)] += p * double(bf16_to_f32(v[j * a.hd + i]));
    }
    float* out = a.out + (t * a.nh + hq) * a.hd;
    for (int64_t i = 0; i < a.hd; ++i) out[i] = float(o[size_t(i)] / sum);
  });
}

// Decode (T = 1) runs the exact f32 kernel: on Zen 4 the vdpbf16ps one, which rounds q and the probabilities to bf16,
// measured no faster there reading the cache from memory (both ~0.9-1.0 ms a layer at 8k); on an AMX Xeon the f32
// kernel was the fastest of the three at 8k from memory (2 threads: 0.99-1.00 ms, vdpbf16ps 1.11, AMX tiles 1.32-1.37;
// docs/BENCHMARKS.md, session 15). Prefill (T > 1) is compute bound and runs the vdpbf16ps kernel where the CPU has it:
// 1.75-1.8x the f32 kernel's speed on Zen 4 at 512-4096 tokens (docs/BENCHMARKS.md, "Attention prefill"), with errors
// of the size the bf16 cache already adds (as llama.cpp's f16 cache and f16 flash attention do).
void attention_bf16(const AttentionArgs& a, ThreadPool& pool) {
  if (a.T > 1 && amx_bf16_ok(a.hd)) attention_isa::attention_amx_bf16(a, pool, false);
  else if (a.T > 1 && avx512_bf16_ok(a.hd)) attention_isa::attention_avx512_bf16(a, pool);
  else if (avx512_ok(a.hd)) attention_isa::attention_avx512(a, pool);
  else if (avx2_ok(a.hd)) attention_isa::attention_avx2(a, pool);
  else attention_bf16_reference(a, pool);
}

void attention_bf16_with(const AttentionArgs& a, ThreadPool& pool, const std::string& kernel) {
  if (kernel == "Reference") return attention_bf16_reference(a, pool);
  if (kernel == "AVX512" && avx512_ok(a.hd)) return attention_isa::attention_avx512(a, pool);
  if (kernel == "AVX2" && avx2_ok(a.hd)) return attention_isa::attention_avx2(a, pool);
  if (kernel == "AVX512_BF16" && avx512_bf16_ok(a.hd)) return attention_isa::attention_avx512_bf16(a, pool);
  if (kernel == "AMX_BF16" && amx_bf16_ok(a.hd)) return attention_isa::attention_amx_bf16(a, pool, false);
  if (kernel == "AMX_BF16-emulated" && avx512_bf16_ok(a.hd)) return attention_isa::attention_amx_bf16(a, pool, true);
  throw std::invalid_argument("kernel: '" + kernel + "' is not an attention kernel this CPU runs for head dim " +
                              std::to_string(a.hd) +
                              " (AMX_BF16, AMX_BF16-emulated, AVX512_BF16, AVX512, AVX2 or Reference)");
}

}  // namespace tessera
