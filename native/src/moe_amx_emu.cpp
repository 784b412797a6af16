// AMXInt8-emulated and AMXBF16-emulated: the AMX kernels (amx_moe.h) on the portable tile emulator, so packing, tile
// loops and edge tiles run and are tested on any CPU. Never picked by Auto, never timed; not offered to users.
#include "amx_moe.h"
#include "amx_tile_emu.h"

namespace tessera::amx {
namespace {

constexpr const char* kInt8Name = "AMXInt8-emulated";
constexpr const char* kBF16Name = "AMXBF16-emulated";

bool supported(const CpuFeatures&, std::string* why) {
  *why = std::string("emulated AMX tiles (tests only); vector path: ") + vec_best().name;
  return true;
}

size_t bytes_int8(const MoeDims& d, WeightType) { return packed_bytes(WeightFormat::Int8, d); }
size_t bytes_bf16(const MoeDims& d, WeightType) { return packed_bytes(WeightFormat::BF16, d); }
void pack_int8(const MoeDims& d, const WeightsIn& w, uint8_t* dst, ThreadPool& pool) {
  pack_layer(WeightFormat::Int8, kInt8Name, d, w, dst, pool);
}
void pack_bf16(const MoeDims& d, const WeightsIn& w, uint8_t* dst, ThreadPool& pool) {
  pack_layer(WeightFormat::BF16, kBF16Name, d, w, dst, pool);
}
void unpack_int8(const uint8_t* p, int64_t e, float* g, float* u, float* dn) {
  unpack_expert(p, kInt8Name, WeightFormat::Int8, e, g, u, dn);
}
void unpack_bf16(const uint8_t* p, int64_t e, float* g, float* u, float* dn) {
  unpack_expert(p, kBF16Name, WeightFormat::BF16, e, g, u, dn);
}
void forward_int8(const uint8_t* p, int64_t T, int64_t k, const int64_t* ids, const float* w, const float* x,
                  float* out, ThreadPool& pool) {
  moe_forward<TileEmu, WeightFormat::Int8>(kInt8Name, p, T, k, ids, w, x, out, pool);
}
void forward_bf16(const uint8_t* p, int64_t T, int64_t k, const int64_t* ids, const float* w, const float* x,
                  float* out, ThreadPool& pool) {
  moe_forward<TileEmu, WeightFormat::BF16>(kBF16Name, p, T, k, ids, w, x, out, pool);
}

const BackendOps kAmxInt8Emu = {kInt8Name, IsaLevel::Reference, true, -10, "int8",
                                "AMXInt8 on a portable tile emulator: tests only", supported, bytes_int8,
                                pack_int8, unpack_int8, forward_int8};
const BackendOps kAmxBF16Emu = {kBF16Name, IsaLevel::Reference, true, -11, "bf16",
                                "AMXBF16 on a portable tile emulator: tests only", supported, bytes_bf16,
                                pack_bf16, unpack_bf16, forward_bf16};
TESSERA_REGISTER_BACKEND(kAmxInt8Emu);
TESSERA_REGISTER_BACKEND(kAmxBF16Emu);

}  // namespace
}  // namespace tessera::amx
