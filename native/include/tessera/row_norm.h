// RMSNorm and the residual add over activation rows [T, n] (engine.model's rms_norm and the decoder layer's two
// residual adds), one description for the decode step (decode_layer.cpp, one row) and prefill (every row, on the
// pool). Portable code: the work is a memory pass, not arithmetic.
#pragma once

#include <cstdint>

#include "tessera/pool.h"

namespace tessera {

// out[i] = weight[i] * (x[i] * r), r = 1 / sqrt(float(mean(x^2)) + eps), over n values; the squares summed in double
// (four running sums over i mod 4, added (s0 + s1) + (s2 + s3): the rounding of the mean is f32's, its sum is exact to
// ~1e-16). out may be x.
void rms_norm_row(const float* x, const float* weight, int64_t n, float eps, float* out);

// For every row t < T of x [T, n] (rows contiguous): x[t] += add[t] first when add is not null (f32 adds, in place:
// the residual stream), then out[t] = rms_norm_row(x[t]). Rows split over the pool.
void rms_norm_rows(float* x, const float* add, const float* weight, int64_t T, int64_t n, float eps, float* out,
                   ThreadPool& pool);

// dst[i] += src[i] for i < n (f32), split over the pool.
void add_rows(float* dst, const float* src, int64_t n, ThreadPool& pool);

}  // namespace tessera
