// The narrow backend interface (KTransformers' forward(qlen, k, expert_ids, weights, input, output)), as a plain
// table of function pointers per backend, plus the registry that dispatch.cpp fills once.
//
// Letters: E experts in the layer, H hidden size, I intermediate size, T tokens (qlen), k experts per token.
// Weights arrive in the Hugging Face nn.Linear layout, contiguous: gate, up [E, I, H]; down [E, H, I].
// A packed layer is ONE flat byte blob, 64-byte aligned, starting with a 64-byte PackedHeader; it holds no pointers,
// so it can be written to disk and memory-mapped back (the packed-weight cache).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/cpu.h"
#include "tessera/pool.h"

namespace tessera {

constexpr uint32_t kLayoutVersion = 1;  // bump when any backend's packed layout changes (invalidates disk caches)
constexpr size_t kAlign = 64;

enum class WeightType : int32_t { F32 = 0, F16 = 1, BF16 = 2 };

struct MoeDims {
  int64_t E = 0, H = 0, I = 0;
};

struct WeightsIn {  // one layer's experts as loaded
  WeightType type = WeightType::F32;
  const void* gate = nullptr;  // [E, I, H]
  const void* up = nullptr;    // [E, I, H]
  const void* down = nullptr;  // [E, H, I]
};

struct PackedHeader {  // first 64 bytes of every packed blob
  char magic[8];       // "TESSPK1\0"
  uint32_t layout_version;
  int32_t src_type;    // WeightType the layer was packed from
  char backend[24];    // backend name, NUL-padded
  int64_t E, H, I;
};
static_assert(sizeof(PackedHeader) == 64, "PackedHeader must be one cache line");

struct BackendOps {
  const char* name;  // "AVX512", "AMXInt8", ...
  IsaLevel level;    // for the TESSERA_MAX_ISA cap
  bool emulated;     // runs an emulator of instructions this CPU lacks: tested, never picked by Auto, never timed
  int priority;      // Auto picks the highest-priority available backend
  const char* weights;      // how the packed expert weights are stored: "int8", "bf16" or "as loaded"
  const char* description;  // one line for people: settings, `tessera-cli check`, --help
  // CPU/OS support; on false, *why says what is missing ("CPU lacks amx_int8"). Called once per process.
  bool (*supported)(const CpuFeatures& cpu, std::string* why);
  // Total blob size including the header (a multiple of 64).
  size_t (*packed_bytes)(const MoeDims& dims, WeightType src);
  // Fills dst (packed_bytes long, 64-byte aligned): header (use write_header) then weights. Splits experts over pool.
  void (*pack)(const MoeDims& dims, const WeightsIn& w, uint8_t* dst, ThreadPool& pool);
  // Back to f32 in the HF layout for one expert (tests: pack/unpack round trip): gate, up [I, H]; down [H, I].
  void (*unpack)(const uint8_t* packed, int64_t expert, float* gate, float* up, float* down);
  // out[t, :] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t, :]), expert(v) = down(silu(gate v) * up v).
  // x [T, H] f32, ids [T, k] (id < 0 = skip this slot, e.g. served by the GPU), weights [T, k] f32, out [T, H]
  // (overwritten). Preconditions (checked at the binding): shapes, contiguity, 0 <= ids < E or negative.
  void (*forward)(const uint8_t* packed, int64_t qlen, int64_t k, const int64_t* ids, const float* weights,
                  const float* x, float* out, ThreadPool& pool);
};

// Registry. Backends register from their own translation unit with TESSERA_REGISTER_BACKEND(ops) (a static object; all
// native sources are linked as objects, never through a static archive, so registration cannot be dropped).
void register_backend(const BackendOps* ops);
struct BackendRegistrar {
  explicit BackendRegistrar(const BackendOps* ops) { register_backend(ops); }
};
#define TESSERA_REGISTER_BACKEND(ops) static ::tessera::BackendRegistrar tessera_registrar_##ops(&ops)

struct BackendInfo {
  const BackendOps* ops;
  bool available;
  std::string reason;  // why it is (un)available: "CPU lacks avx512_bf16: fp32 FMA decode", "capped by ..."
};
// All registered backends, sorted by priority (highest first), availability computed once.
const std::vector<BackendInfo>& backends();
const BackendInfo* find_backend(const std::string& name);  // nullptr if no such backend is compiled in
const BackendInfo* auto_backend();                         // best available, never emulated

// Header helpers shared by all backends.
void write_header(uint8_t* dst, const char* backend, const MoeDims& dims, WeightType src);
// Validates magic/version/backend name; returns the dims. Throws std::invalid_argument naming the problem.
MoeDims read_header(const uint8_t* packed, const char* backend, WeightType* src = nullptr);

inline size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Element access to loaded weights of any WeightType (packing only; not for hot loops).
float load_weight(WeightType type, const void* base, size_t index);

}  // namespace tessera
