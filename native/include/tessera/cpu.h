// What this CPU and OS allow: CPUID flags, XCR0 state bits, the Linux AMX permission request. Probed once.
#pragma once
#include <cstdint>
#include <string>

namespace tessera {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string brand;   // CPUID brand string
  // CPUID leaf 1 / 7 / 0xD flags (what the silicon implements).
  bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512cd = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx512_fp16 = false, avx_vnni = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
  // XCR0 (what the OS saves on context switch): bits 1-2 SSE/AVX, 5-7 AVX-512 opmask/ZMM, 17-18 AMX TILECFG/TILEDATA.
  uint64_t xcr0 = 0;
  bool os_avx = false, os_avx512 = false, os_amx = false;
  // Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA=18). Only requested when the CPU and XCR0 have AMX.
  bool amx_requested = false;
  int amx_perm_rc = -1;  // syscall return value (0 = granted), -1 when not requested
  int amx_perm_errno = 0;
  bool amx_permitted = false;
  std::string amx_reason;  // "granted", "CPU lacks amx_tile", "kernel refused XTILEDATA permission (errno 22)", ...
  int logical_cpus = 0;    // CPUs this process may run on
  int physical_cores = 0;  // distinct (package, core) pairs among them
};

// Probed on first call (thread-safe), then cached for the life of the process.
const CpuFeatures& cpu_features();

// Usable ISA levels, ordered; TESSERA_MAX_ISA=reference|avx2|avx512|amx caps dispatch (tests, bug reports).
enum class IsaLevel : int { Reference = 0, AVX2 = 1, AVX512 = 2, AMX = 3 };
const char* isa_level_name(IsaLevel level);
// The cap from TESSERA_MAX_ISA (read once; AMX = no cap when unset). Unknown values cap at Reference and are reported.
IsaLevel max_isa_cap();
const std::string& max_isa_cap_text();  // the env value as given, "" when unset

}  // namespace tessera
