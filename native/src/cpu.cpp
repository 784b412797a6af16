// CPU feature probing: CPUID, XCR0, the Linux AMX permission request, core counts, the TESSERA_MAX_ISA cap.
// Portable code only (no ISA flags): xgetbv is emitted as raw bytes so this TU needs no -mxsave.
#include "tessera/cpu.h"
#include "tessera/tuning.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <cctype>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TESSERA_X86 1
#endif
#if defined(__linux__)
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace tessera {
namespace {

#ifdef TESSERA_X86
void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) { __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]); }

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));  // xgetbv with ecx = 0
  return (uint64_t(hi) << 32) | lo;
}
#endif

std::pair<int, int> count_cpus() {
  int logical = 0;
  std::set<std::pair<int, int>> cores;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (!CPU_ISSET(c, &set)) continue;
      ++logical;
      std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
      int pkg = -1, core = -1;
      std::ifstream(base + "physical_package_id") >> pkg;
      std::ifstream(base + "core_id") >> core;
      cores.insert(core < 0 ? std::make_pair(-1, c) : std::make_pair(pkg, core));
    }
  }
#endif
  if (logical == 0) {
    logical = 1;
  }
  int physical = cores.empty() ? logical : int(cores.size());
  return {logical, physical};
}

CpuFeatures probe() {
  CpuFeatures f;
  auto [logical, physical] = count_cpus();
  f.logical_cpus = logical;
  f.physical_cores = physical;
#ifdef TESSERA_X86
  unsigned r[4];
  cpuid(0, 0, r);
  unsigned max_leaf = r[0];
  char vendor[13] = {};
  std::memcpy(vendor, &r[1], 4);
  std::memcpy(vendor + 4, &r[3], 4);
  std::memcpy(vendor + 8, &r[2], 4);
  f.vendor = vendor;
  cpuid(0x80000000u, 0, r);
  if (r[0] >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      cpuid(0x80000002u + i, 0, r);
      std::memcpy(brand + 16 * i, r, 16);
    }
    f.brand = brand;
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
    size_t start = f.brand.find_first_not_of(' ');
    f.brand = start == std::string::npos ? "" : f.brand.substr(start);
  }
  bool osxsave = false;
  if (max_leaf >= 1) {
    cpuid(1, 0, r);
    f.sse42 = r[2] & (1u << 20);
    f.fma = r[2] & (1u << 12);
    osxsave = r[2] & (1u << 27);
    f.avx = r[2] & (1u << 28);
    f.f16c = r[2] & (1u << 29);
  }
  if (max_leaf >= 7) {
    cpuid(7, 0, r);
    f.avx2 = r[1] & (1u << 5);
    f.avx512f = r[1] & (1u << 16);
    f.avx512dq = r[1] & (1u << 17);
    f.avx512cd = r[1] & (1u << 28);
    f.avx512bw = r[1] & (1u << 30);
    f.avx512vl = r[1] & (1u << 31);
    f.avx512_vnni = r[2] & (1u << 11);
    f.amx_bf16 = r[3] & (1u << 22);
    f.avx512_fp16 = r[3] & (1u << 23);
    f.amx_tile = r[3] & (1u << 24);
    f.amx_int8 = r[3] & (1u << 25);
    cpuid(7, 1, r);
    f.avx_vnni = r[0] & (1u << 4);
    f.avx512_bf16 = r[0] & (1u << 5);
  }
  if (osxsave) {
    f.xcr0 = xgetbv0();
    f.os_avx = (f.xcr0 & 0x6) == 0x6;
    f.os_avx512 = f.os_avx && (f.xcr0 & 0xe0) == 0xe0;
    f.os_amx = (f.xcr0 & (3ull << 17)) == (3ull << 17);
  }
  if (!f.amx_tile) {
    f.amx_reason = "CPU lacks amx_tile";
  } else if (!f.os_amx) {
    f.amx_reason = "OS does not enable AMX state (XCR0 bits 17/18 clear)";
  } else {
#if defined(__linux__)
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    f.amx_requested = true;
    errno = 0;
    f.amx_perm_rc = int(syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata));
    f.amx_perm_errno = f.amx_perm_rc == 0 ? 0 : errno;
    f.amx_permitted = f.amx_perm_rc == 0;
    f.amx_reason = f.amx_permitted ? "granted"
                                   : "kernel refused XTILEDATA permission (errno " +
                                         std::to_string(f.amx_perm_errno) + ": " + std::strerror(f.amx_perm_errno) + ")";
#else
    f.amx_reason = "AMX permission request is Linux-only";
#endif
  }
#else
  f.amx_reason = "not an x86-64 CPU";
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = probe();
  return features;
}

const char* isa_level_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::Reference: return "reference";
    case IsaLevel::AVX2: return "avx2";
    case IsaLevel::AVX512: return "avx512";
    case IsaLevel::AMX: return "amx";
  }
  return "?";
}

const std::string& max_isa_cap_text() { return tuning().max_isa; }

IsaLevel max_isa_cap() {
  static const IsaLevel cap = [] {
    std::string v = max_isa_cap_text();
    for (auto& c : v) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (v.empty() || v == "amx") return IsaLevel::AMX;
    if (v == "avx512") return IsaLevel::AVX512;
    if (v == "avx2") return IsaLevel::AVX2;
    return IsaLevel::Reference;  // "reference" or anything unknown: the safe choice
  }();
  return cap;
}

}  // namespace tessera
