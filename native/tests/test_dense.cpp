// C++ tests of the dense mat-vec (tessera/dense.h): every kernel this CPU can run (AVX512, AVX2, Reference) against a
// double-precision sum on shapes that are multiples of no vector or tile width, T = 1..5 and 9, bf16 and f16 weights in
// exactly-sized buffers (so ASan catches any read past a row or the matrix), NaN-prefilled outputs, pools of 1-3.
// Called from test_native.cpp's main (weak symbol), so it also runs under scripts/sanitize_native.sh.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tessera/bf16.h"
#include "tessera/cpu.h"
#include "tessera/dense.h"

using namespace tessera;

namespace {

uint16_t to_f16(float f) {  // f32 -> f16, round to nearest even
  // Normal range only (|f| in [2^-14, 65504)); enough for test data drawn from N(0, 1) and clamped.
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int exp = int((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffffu;
  if (exp <= 0) return uint16_t(sign);  // flush tiny values to zero
  uint32_t h = sign | uint32_t(exp) << 10 | (mant >> 13);
  if ((mant & 0x1fffu) > 0x1000u || ((mant & 0x1fffu) == 0x1000u && (h & 1u))) ++h;
  return uint16_t(h);
}

int run_case(const char* kernel, void (*fn)(const DenseArgs&, ThreadPool&), WeightType type, int64_t N, int64_t K,
             int64_t T, ThreadPool& pool, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> w(size_t(N * K));  // exactly N*K: an over-read is a heap overflow under ASan
  std::vector<float> wf(w.size()), x(size_t(T * K)), out(size_t(T * N), NAN);
  for (size_t i = 0; i < w.size(); ++i) {
    float v = std::fmax(-8.0f, std::fmin(8.0f, nd(rng)));
    w[i] = type == WeightType::BF16 ? f32_to_bf16(v) : to_f16(v);
    wf[i] = type == WeightType::BF16 ? bf16_to_f32(w[i]) : f16_to_f32(w[i]);
  }
  for (auto& v : x) v = nd(rng);
  fn(DenseArgs{type, w.data(), N, K, T, x.data(), out.data()}, pool);
  int bad = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        ref += double(wf[size_t(n * K + k)]) * double(x[size_t(t * K + k)]);
        mag += std::fabs(double(wf[size_t(n * K + k)]) * double(x[size_t(t * K + k)]));
      }
      double got = out[size_t(t * N + n)];
      if (!(std::fabs(got - ref) <= double(K) * 6e-8 * mag + 1e-30)) {
        if (bad++ == 0)
          std::fprintf(stderr, "FAIL dense %s %s N=%lld K=%lld T=%lld pool=%d: out[%lld,%lld] = %g, want %g\n", kernel,
                       type == WeightType::BF16 ? "bf16" : "f16", (long long)N, (long long)K, (long long)T, pool.size(),
                       (long long)t, (long long)n, got, ref);
      }
    }
  return bad ? 1 : 0;
}

}  // namespace

int tessera_dense_tests() {
  const CpuFeatures& c = cpu_features();
  struct Kernel {
    const char* name;
    void (*fn)(const DenseArgs&, ThreadPool&);
    bool runs;
  };
  const Kernel kernels[] = {
      {"Reference", dense_matvec_reference, true},
      {"AVX2", dense_isa::matvec_avx2, c.avx2 && c.fma && c.f16c && c.os_avx},
      {"AVX512", dense_isa::matvec_avx512, c.avx512f && c.os_avx512},
  };
  const int64_t shapes[][2] = {{1, 1}, {3, 5}, {37, 45}, {64, 32}, {17, 2049}, {1031, 257}};
  std::mt19937 rng(11);
  int failures = 0, cases = 0;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (const Kernel& k : kernels) {
      if (!k.runs) continue;
      for (WeightType type : {WeightType::BF16, WeightType::F16})
        for (const auto& s : shapes)
          for (int64_t T : {1, 2, 3, 4, 5, 9}) {
            failures += run_case(k.name, k.fn, type, s[0], s[1], T, pool, rng);
            ++cases;
          }
    }
  }
  // f32 rows (the router at decode): every ISA kernel gives the reference loop's bits, on row counts around the 4-row
  // blocks and K around the 16 lanes, in exactly-sized buffers; a NaN and an infinity stay where the reference puts them.
  using F32Rows = void (*)(const float*, int64_t, int64_t, const float*, float*);
  const std::pair<const char*, F32Rows> f32_kernels[] = {
      {"AVX2", c.avx2 && c.fma && c.os_avx ? dense_isa::matvec_f32_rows_avx2 : nullptr},
      {"AVX512", c.avx512f && c.os_avx512 ? dense_isa::matvec_f32_rows_avx512 : nullptr},
      {"dispatch", dense_matvec_f32_rows}};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t rows : {1, 3, 4, 5, 9, 128})
    for (int64_t K : {1, 15, 16, 17, 100, 2048, 2063}) {
      std::vector<float> w(static_cast<size_t>(rows * K)), x(static_cast<size_t>(K)), want(static_cast<size_t>(rows));
      for (auto& v : w) v = nd(rng);
      for (auto& v : x) v = nd(rng) * 4.0f;
      if (rows == 9 && K > 16) {
        w[size_t(2 * K + 5)] = NAN;
        w[size_t(6 * K + K - 1)] = INFINITY;
      }
      dense_matvec_f32_rows_reference(w.data(), rows, K, x.data(), want.data());
      for (const auto& [name, fn] : f32_kernels) {
        if (!fn) continue;
        std::vector<float> got(size_t(rows), -1.0f);
        fn(w.data(), rows, K, x.data(), got.data());
        ++cases;
        if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0) {
          ++failures;
          for (int64_t r = 0; r < rows; ++r)
            if (std::memcmp(&got[size_t(r)], &want[size_t(r)], sizeof(float)) != 0) {
              std::fprintf(stderr, "FAIL f32 rows %s rows=%lld K=%lld: out[%lld] = %.9g, reference %.9g\n", name,
                           (long long)rows, (long long)K, (long long)r, got[size_t(r)], want[size_t(r)]);
              break;
            }
        }
      }
    }
  std::printf("dense: %d cases, %d failed (dispatch picks %s)\n", cases, failures, dense_kernel_name());
  return failures;
}
