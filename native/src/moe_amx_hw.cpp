// AMXInt8 and AMXBF16: the AMX kernels (amx_moe.h) on the real tile instructions. Compiled with -mamx-tile
// -mamx-int8 -mamx-bf16; supported() admits them only when CPUID, XCR0 bits 17/18 and the Linux XTILEDATA permission
// all say yes, so no tile instruction can run (and SIGILL) anywhere else.
#include "amx_moe.h"
#include "amx_tile_hw.h"

namespace tessera::amx {
namespace {

constexpr const char* kInt8Name = "AMXInt8";
constexpr const char* kBF16Name = "AMXBF16";

bool amx_usable(const CpuFeatures& c, bool need_int8, bool need_bf16, std::string* why) {
  // The backend's own instruction set is named first ("backend AMXInt8: CPU lacks amx_int8").
  if (need_int8 && !c.amx_int8) return *why = "CPU lacks amx_int8", false;
  if (need_bf16 && !c.amx_bf16) return *why = "CPU lacks amx_bf16", false;
  if (!c.amx_tile) return *why = "CPU lacks amx_tile", false;
  if (!c.os_amx) return *why = "OS does not enable AMX state (XCR0 bits 17/18)", false;
  if (!c.amx_permitted)
    return *why = c.amx_reason.empty() ? "kernel refused XTILEDATA permission" : c.amx_reason, false;
  // The decode half runs AVX-512 VNNI / FMA on the same packing (every AMX CPU so far has them).
  if (!(c.os_avx512 && c.avx512f && c.avx512bw && c.avx512vl && c.avx512_vnni))
    return *why = "CPU lacks avx512_vnni for the decode path", false;
  // Named by its weights first, as every backend's reason is, so AMXInt8 and AMXBF16 never read alike.
  *why = need_int8 ? "int8 weights; AMX tile prefill, AVX-512 VNNI decode"
                    : "bf16 weights; AMX tile prefill, AVX-512 FMA decode";
  return true;
}
bool supported_int8(const CpuFeatures& c, std::string* why) { return amx_usable(c, true, false, why); }
bool supported_bf16(const CpuFeatures& c, std::string* why) { return amx_usable(c, false, true, why); }

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
  moe_forward<TileHw, WeightFormat::Int8>(kInt8Name, p, T, k, ids, w, x, out, pool);
}
void forward_bf16(const uint8_t* p, int64_t T, int64_t k, const int64_t* ids, const float* w, const float* x,
                  float* out, ThreadPool& pool) {
  moe_forward<TileHw, WeightFormat::BF16>(kBF16Name, p, T, k, ids, w, x, out, pool);
}

const BackendOps kAmxInt8 = {kInt8Name, IsaLevel::AMX, false, 35, "int8",
                             "AMX tiles, int8 weights (Sapphire Rapids and later)", supported_int8, bytes_int8,
                             pack_int8, unpack_int8, forward_int8};
const BackendOps kAmxBF16 = {kBF16Name, IsaLevel::AMX, false, 30, "bf16",
                             "AMX tiles, bf16 weights (Sapphire Rapids and later)", supported_bf16, bytes_bf16,
                             pack_bf16, unpack_bf16, forward_bf16};
TESSERA_REGISTER_BACKEND(kAmxInt8);
TESSERA_REGISTER_BACKEND(kAmxBF16);

}  // namespace
}  // namespace tessera::amx
