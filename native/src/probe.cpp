// Machine probes: multi-threaded memory read bandwidth and register-only FLOP peaks (benchmark, hardware wizard):
// vdpbf16ps, vpdpbusd, f32 FMA, and the AMX tiles' tdpbf16ps and tdpbssd.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "probe_isa.h"
#include "tessera/cpu.h"
#include "tessera/probe.h"

namespace tessera {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t read_sum_scalar(const uint8_t* p, size_t bytes) {
  const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i < bytes / 8; i += 4) {
    a ^= q[i];
    b ^= q[i + 1];
    c ^= q[i + 2];
    d ^= q[i + 3];
  }
  return a ^ b ^ c ^ d;
}

}  // namespace

double read_bandwidth_gbs(ThreadPool& pool, double buffer_mib, double seconds) {
  const CpuFeatures& cpu = cpu_features();
  bool avx512 = cpu.avx512f && cpu.os_avx512 && max_isa_cap() >= IsaLevel::AVX512;
  bool avx2 = cpu.avx2 && cpu.os_avx && max_isa_cap() >= IsaLevel::AVX2;
  const int nth = pool.size();
  size_t per_thread = size_t(buffer_mib * 1048576.0 / nth) / 4096 * 4096;
  if (per_thread < 4096) throw std::invalid_argument("buffer_mib: too small");
  std::vector<uint8_t*> bufs(size_t(nth), nullptr);
  // Each thread allocates and first-touches its own slice (NUMA-local pages).
  pool.run([&](int ith, int) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, per_thread) != 0) return;
    std::memset(p, ith + 1, per_thread);
    bufs[size_t(ith)] = static_cast<uint8_t*>(p);
  });
  for (auto* b : bufs)
    if (!b) throw std::bad_alloc();
  std::vector<uint64_t> sink(size_t(nth) * 8, 0);
  double best = 0.0, start = now_s();
  int passes = 0;
  while (passes < 2 || now_s() - start < seconds) {
    double t0 = now_s();
    pool.run([&](int ith, int) {
      const uint8_t* b = bufs[size_t(ith)];
      sink[size_t(ith) * 8] += avx512 ? read_sum_avx512(b, per_thread)
                               : avx2 ? read_sum_avx2(b, per_thread)
                                      : read_sum_scalar(b, per_thread);
    });
    double dt = now_s() - t0;
    best = std::max(best, double(per_thread) * nth / dt / 1e9);
    ++passes;
  }
  for (auto* b : bufs) std::free(b);
  volatile uint64_t keep = sink[0];
  (void)keep;
  return best;
}

double peak_gflops(ThreadPool& pool, const char* what, double seconds) {
  const CpuFeatures& cpu = cpu_features();
  bool avx512 = cpu.avx512f && cpu.os_avx512;
  std::string w = what;
  double (*loop)(int64_t) = nullptr;
  // Tiles only where the CPU, the OS (XCR0) and the kernel (XTILEDATA permission) all allow them: else SIGILL.
  bool amx = cpu.amx_tile && cpu.os_amx && cpu.amx_permitted;
  if (w == "bf16_dot") {
    if (avx512 && cpu.avx512_bf16) loop = bf16_dot_loop_avx512;
  } else if (w == "int8_dot") {
    if (avx512 && cpu.avx512bw && cpu.avx512_vnni) loop = int8_dot_loop_avx512_vnni;
  } else if (w == "fp32_fma") {
    if (avx512) loop = fma_loop_avx512;
    else if (cpu.avx2 && cpu.fma && cpu.os_avx) loop = fma_loop_avx2;
  } else if (w == "amx_bf16") {
    if (amx && cpu.amx_bf16) loop = amx_bf16_loop;
  } else if (w == "amx_int8") {
    if (amx && cpu.amx_int8) loop = amx_int8_loop;
  } else {
    throw std::invalid_argument("what: expected bf16_dot, int8_dot, fp32_fma, amx_bf16 or amx_int8, got " + w);
  }
  if (!loop) return -1.0;
  int64_t iters = 1 << 16;
  double best = 0.0, start = now_s();
  while (now_s() - start < seconds) {
    std::vector<double> flops(size_t(pool.size()), 0.0);
    double t0 = now_s();
    pool.run([&](int ith, int) { flops[size_t(ith)] = loop(iters); });
    double dt = now_s() - t0;
    double total = 0;
    for (double f : flops) total += f;
    best = std::max(best, total / dt / 1e9);
    if (dt < 0.02) iters *= 2;
  }
  return best;
}

AmxOverlapNs amx_overlap(int fma_blocks, int64_t items) {
  const CpuFeatures& cpu = cpu_features();
  if (!(cpu.amx_tile && cpu.amx_int8 && cpu.os_amx && cpu.amx_permitted && cpu.avx512f && cpu.os_avx512))
    throw std::runtime_error("amx_overlap: this CPU (or its OS) does not grant AMX int8 tiles and AVX-512");
  if (fma_blocks < 0 || items <= 0) throw std::invalid_argument("amx_overlap: fma_blocks >= 0 and items > 0");
  return amx_overlap_probe(fma_blocks, items);
}

}  // namespace tessera
