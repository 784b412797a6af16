// The one reader of TESSERA_* environment variables in the native module (tessera/tuning.h).
#include "tessera/tuning.h"

#include "tessera/cpu.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace tessera {
namespace {

// Every knob read goes through here, so Tuning::from_environment lists exactly the variables that were set.
std::string* g_seen = nullptr;
const char* env(const char* name) {
  const char* v = std::getenv(name);
  if (!(v && *v)) return nullptr;
  if (g_seen) *g_seen += std::string(name) + "\n";
  return v;
}

// A token count: a whole number >= 0; anything else is listed in t.invalid (engine.native.tuning names it).
void read_count(Tuning& t, const char* name, int64_t& field) {
  const char* v = env(name);
  if (!v) return;
  char* end = nullptr;
  long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < 0) t.invalid += std::string(name) + "=" + v + "\n";
  else field = n;
}

void read_environment(Tuning& t) {
  g_seen = &t.from_environment;
  if (const char* v = env("TESSERA_MAX_ISA")) t.max_isa = v;
  if (const char* v = env("TESSERA_INT8_GROUP")) {
    int64_t g = std::atoll(v);  // garbage reads as 0: per channel
    t.int8_group = g <= 0 ? 0 : (g + 3) / 4 * 4;
  }
  if (const char* v = env("TESSERA_PF")) t.prefetch_bytes = std::max<int64_t>(0, std::atoll(v));
  if (const char* v = env("TESSERA_SPIN_US")) t.spin_us = std::atoi(v);
  t.profile = std::getenv("TESSERA_PROFILE") != nullptr;
  if (t.profile) t.from_environment += "TESSERA_PROFILE\n";
  if (const char* v = env("TESSERA_AMX_TILE_MIN_ROWS")) t.amx_tile_min_rows = std::max<int64_t>(0, std::atoll(v));
  if (const char* v = env("TESSERA_AMX_INT8_BF16_MIN_ROWS"))
    t.amx_int8_bf16_min_rows = std::max<int64_t>(0, std::atoll(v));
  if (const char* v = env("TESSERA_QUANT_MOE_CHUNK_T")) {
    char* end = nullptr;
    long long n = std::strtoll(v, &end, 10);
    if (*end != '\0' || n < 0) t.invalid += std::string("TESSERA_QUANT_MOE_CHUNK_T=") + v + "\n";
    else t.quant_moe_chunk_tokens = n;
  }
  if (const char* v = env("TESSERA_VNNI_GEMM_MIN_T")) {
    char* end = nullptr;
    long long n = std::strtoll(v, &end, 10);
    if (*end != '\0' || n < 0) t.invalid += std::string("TESSERA_VNNI_GEMM_MIN_T=") + v + "\n";
    else t.vnni_gemm_min_tokens = n;
  }
  read_count(t, "TESSERA_DENSE_NATIVE_MAX_T", t.dense_native_max_tokens);
  read_count(t, "TESSERA_DENSE_QUANT_MAX_T", t.dense_quant_max_tokens);
  int64_t avx2_gemm_min_tokens = 0;
  read_count(t, "TESSERA_AVX2_GEMM_MIN_T", avx2_gemm_min_tokens);
  t.avx2_gemm_min_tokens = avx2_gemm_min_tokens;
  int64_t avx_vnni = 1;
  read_count(t, "TESSERA_AVX_VNNI", avx_vnni);
  t.avx_vnni = avx_vnni;
  int64_t decode_rows = 0;
  read_count(t, "TESSERA_DECODE_ROWS", decode_rows);
  t.decode_rows = decode_rows;
  int64_t decode_streams = 0;
  read_count(t, "TESSERA_DECODE_STREAMS", decode_streams);
  if (decode_streams > 2) t.invalid += "TESSERA_DECODE_STREAMS=" + std::to_string(decode_streams) + "\n";
  else t.decode_streams = decode_streams;
  g_seen = nullptr;
}

}  // namespace

int decode_streams() {
  const int64_t knob = tuning().decode_streams.load(std::memory_order_relaxed);
  if (knob > 0) return int(std::min<int64_t>(knob, 2));
  static const int by_vendor = cpu_features().vendor == "GenuineIntel" ? 2 : 1;
  return by_vendor;
}

Tuning& tuning() {
  static Tuning* t = [] {
    auto* p = new Tuning();  // never freed: pool threads may read it during static destruction
    read_environment(*p);
    return p;
  }();
  return *t;
}

}  // namespace tessera
