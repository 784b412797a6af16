// tessera/row_norm.h: RMSNorm and residual adds over activation rows.
#include "tessera/row_norm.h"

#include <algorithm>
#include <cmath>

namespace tessera {

void rms_norm_row(const float* x, const float* weight, int64_t n, float eps, float* out) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};  // four chains: the sum's latency, not its adds, would bound one
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) s[j] += double(x[i + j]) * double(x[i + j]);
  for (; i < n; ++i) s[i % 4] += double(x[i]) * double(x[i]);
  const double ss = (s[0] + s[1]) + (s[2] + s[3]);
  const float r = 1.0f / std::sqrt(float(ss / double(n)) + eps);
  for (int64_t k = 0; k < n; ++k) out[k] = weight[k] * (x[k] * r);
}

namespace {
constexpr int64_t kRowsPerTask = 16;        // ~128 KB of a 2048-wide row block per task
constexpr int64_t kAddPerTask = 64 * 1024;  // floats per add task (256 KB)
}  // namespace

void rms_norm_rows(float* x, const float* add, const float* weight, int64_t T, int64_t n, float eps, float* out,
                   ThreadPool& pool) {
  pool.parallel_for((T + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t task, int) {
    for (int64_t t = task * kRowsPerTask; t < std::min(T, (task + 1) * kRowsPerTask); ++t) {
      float* row = x + t * n;
      if (add != nullptr)
        for (int64_t k = 0; k < n; ++k) row[k] += add[t * n + k];
      rms_norm_row(row, weight, n, eps, out + t * n);
    }
  });
}

void add_rows(float* dst, const float* src, int64_t n, ThreadPool& pool) {
  pool.parallel_for((n + kAddPerTask - 1) / kAddPerTask, [&](int64_t task, int) {
    for (int64_t i = task * kAddPerTask; i < std::min(n, (task + 1) * kAddPerTask); ++i) dst[i] += src[i];
  });
}

}  // namespace tessera
