// The backend registry: filled by static registration from each backend's translation unit, then sorted and its
// availability computed once from CpuFeatures and the TESSERA_MAX_ISA cap. The only process-wide state besides the
// CPU probe.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "tessera/backend.h"
#include "tessera/bf16.h"

namespace tessera {
namespace {

std::vector<const BackendOps*>& registered() {
  static std::vector<const BackendOps*> ops;  // function-local: safe against static-init order
  return ops;
}

std::vector<BackendInfo> compute_backends() {
  std::vector<BackendInfo> out;
  const CpuFeatures& cpu = cpu_features();
  for (const BackendOps* ops : registered()) {
    BackendInfo info{ops, false, ""};
    std::string why;
    if (int(ops->level) > int(max_isa_cap())) {
      info.reason = std::string("capped by TESSERA_MAX_ISA=") + max_isa_cap_text();
    } else if (!ops->supported(cpu, &why)) {
      info.reason = why;
    } else {
      info.available = true;
      info.reason = why.empty() ? "available" : why;
    }
    out.push_back(info);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const BackendInfo& a, const BackendInfo& b) { return a.ops->priority > b.ops->priority; });
  return out;
}

}  // namespace

void register_backend(const BackendOps* ops) { registered().push_back(ops); }

const std::vector<BackendInfo>& backends() {
  static const std::vector<BackendInfo> table = compute_backends();
  return table;
}

const BackendInfo* find_backend(const std::string& name) {
  for (const auto& b : backends())
    if (name == b.ops->name) return &b;
  return nullptr;
}

const BackendInfo* auto_backend() {
  for (const auto& b : backends())
    if (b.available && !b.ops->emulated) return &b;
  return nullptr;
}

void write_header(uint8_t* dst, const char* backend, const MoeDims& dims, WeightType src) {
  PackedHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, "TESSPK1", 8);
  h.layout_version = kLayoutVersion;
  h.src_type = int32_t(src);
  std::strncpy(h.backend, backend, sizeof(h.backend) - 1);
  h.E = dims.E;
  h.H = dims.H;
  h.I = dims.I;
  std::memcpy(dst, &h, sizeof(h));
}

MoeDims read_header(const uint8_t* packed, const char* backend, WeightType* src) {
  PackedHeader h;
  std::memcpy(&h, packed, sizeof(h));
  if (std::memcmp(h.magic, "TESSPK1", 8) != 0) throw std::invalid_argument("packed: not a Tessera packed-weight blob");
  if (h.layout_version != kLayoutVersion)
    throw std::invalid_argument("packed: layout version " + std::to_string(h.layout_version) + ", expected " +
                                std::to_string(kLayoutVersion));
  if (std::strncmp(h.backend, backend, sizeof(h.backend)) != 0)
    throw std::invalid_argument(std::string("packed: packed for backend ") + h.backend + ", not " + backend);
  if (h.E <= 0 || h.H <= 0 || h.I <= 0) throw std::invalid_argument("packed: bad dimensions in header");
  if (src) *src = WeightType(h.src_type);
  return MoeDims{h.E, h.H, h.I};
}

float load_weight(WeightType type, const void* base, size_t index) {
  switch (type) {
    case WeightType::F32: return static_cast<const float*>(base)[index];
    case WeightType::F16: return f16_to_f32(static_cast<const uint16_t*>(base)[index]);
    case WeightType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[index]);
  }
  return 0.0f;
}

}  // namespace tessera
