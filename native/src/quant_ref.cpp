// Reference quantized kernels: scalar, the integer dots exact and the scales accumulated in double. The correctness
// oracle of the AVX2 and AVX-512 VNNI twins (same activations, same tile, only the f32 summation order differs) and
// the fallback on CPUs without AVX2. Portable: no ISA flags.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant_kernels.h"
#include "tessera/bf16.h"

namespace tessera {
namespace quant {
namespace {

#include "quant_body.inc"

void dot_rows_ref(const uint8_t* u, const float* a4, const float* b16, int R, int64_t K, const ActRow& x, bool,
                  float* out) {
  const int64_t Kp = padded_k(K), S16 = padded_s16(K);
  for (int r = 0; r < R; ++r) {
    const uint8_t* ur = u + r * Kp;
    const float* ar = a4 + r * (Kp / 4);
    const float* br = b16 + r * S16;
    double acc = 0.0;
    for (int64_t c = 0; c < Kp / 4; ++c) {
      int32_t s = 0;
      for (int i = 0; i < 4; ++i) s += int32_t(ur[4 * c + i]) * int32_t(x.q[4 * c + i]);
      acc += double(ar[c]) * double(x.d256[c / 64]) * double(s);
    }
    for (int64_t g = 0; g < S16; ++g) acc -= double(br[g]) * double(x.s16[g]);
    out[r] = float(acc);
  }
}

const Kernels kRef = {QIsa::Reference, quantize_row_body, unpack_rows_body, dot_rows_ref, nullptr};

}  // namespace

const Kernels& kernels_reference() { return kRef; }

}  // namespace quant
}  // namespace tessera
