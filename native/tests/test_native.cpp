// C++ tests of the native core: thread pool, header checks, and every compiled + available backend against the
// Reference (NaN-prefilled outputs, NMSE per precision, shapes that are multiples of no tile or vector width, T = 1, 3,
// 64, 513, k = 1, 2, 8, idle experts, skipped slots, one expert with every token), pack/unpack round trips.
// One binary with the AMX tests (test_amx.cpp's tessera_amx_tests()); scripts/sanitize_native.sh runs it under ASan+UBSan.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/backend.h"
#include "tessera/bf16.h"
#include "tessera/cpu.h"
#include "tessera/pool.h"

using namespace tessera;

int tessera_amx_tests() __attribute__((weak));  // test_amx.cpp
int tessera_dense_tests() __attribute__((weak));  // test_dense.cpp

namespace {

int g_failures = 0;
#define CHECK(cond, ...)                                         \
  do {                                                           \
    if (!(cond)) {                                               \
      ++g_failures;                                              \
      std::fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                         \
      std::fprintf(stderr, "\n");                                \
    }                                                            \
  } while (0)

struct Aligned {  // 64-byte aligned byte buffer
  std::unique_ptr<uint8_t[]> raw;
  uint8_t* p;
  explicit Aligned(size_t n) : raw(new uint8_t[n + 64]) {
    p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw.get()) + 63) & ~uintptr_t(63));
  }
};

void test_pool() {
  for (int n : {1, 2, 3}) {
    ThreadPool pool(n);
    std::vector<int> seen(size_t(n), 0);
    for (int rep = 0; rep < 50; ++rep) pool.run([&](int ith, int nth) { seen[size_t(ith)] += nth == n; });
    for (int i = 0; i < n; ++i) CHECK(seen[size_t(i)] == 50, "pool(%d) thread %d ran %d of 50", n, i, seen[size_t(i)]);
    std::vector<std::atomic<int>> hits(1000);
    pool.parallel_for(1000, [&](int64_t t, int) { hits[size_t(t)]++; });
    for (auto& h : hits) CHECK(h.load() == 1, "parallel_for task ran %d times", h.load());
    bool threw = false;
    try {
      pool.run([&](int ith, int nth) {
        if (ith == nth - 1) throw std::runtime_error("boom");
      });
    } catch (const std::runtime_error&) {
      threw = true;
    }
    CHECK(threw, "exception from a pool thread is rethrown by run()");
    std::atomic<int> sum{0};
    pool.submit([&] { pool.parallel_for(100, [&](int64_t t, int) { sum += int(t); }); });
    pool.sync();
    CHECK(sum.load() == 4950, "submit/sync sum %d", sum.load());
    pool.submit([] { throw std::runtime_error("async boom"); });
    threw = false;
    try {
      pool.sync();
    } catch (const std::runtime_error&) {
      threw = true;
    }
    CHECK(threw, "exception from a submitted job is rethrown by sync()");
  }
}

// Mixed run()/parallel_for() back to back with uneven task times: parallel_for must not return while a worker still
// runs one of its tasks, and a late worker must never run a finished job (counts would be off, or ASan would see the
// job's stack frame reused).
void test_pool_stress() {
  ThreadPool pool(3);
  std::mt19937 rng(1);
  for (int rep = 0; rep < 300; ++rep) {
    const int64_t n = int64_t(rng() % 40);
    std::vector<int> hits(size_t(n), 0);
    if (rep % 3 == 0) {
      std::vector<int> seen(3, 0);
      pool.run([&](int ith, int) { seen[size_t(ith)]++; });
      CHECK(seen[0] == 1 && seen[1] == 1 && seen[2] == 1, "run() reaches every thread exactly once");
    }
    pool.parallel_for(n, [&](int64_t t, int) {
      if (t % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(t % 3 == 0 ? 200 : 5));
      hits[size_t(t)]++;
    });
    for (int64_t t = 0; t < n; ++t) CHECK(hits[size_t(t)] == 1, "rep %d task %lld ran %d times", rep, (long long)t, hits[size_t(t)]);
  }
}

void test_bf16_conversions() {
  CHECK(f32_to_bf16(1.0f) == 0x3f80, "1.0");
  CHECK(f32_to_bf16(1.00390625f) == 0x3f80, "tie rounds to even (down)");
  CHECK(f32_to_bf16(1.01171875f) == 0x3f82, "tie rounds to even (up)");
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))), "NaN stays NaN");
  CHECK(f16_to_f32(0x3c00) == 1.0f && f16_to_f32(0xc000) == -2.0f, "f16 normals");
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24), "f16 subnormal");
  CHECK(std::isinf(f16_to_f32(0x7c00)), "f16 inf");
}

bool f32_decode(const std::string& name) { return name == "AVX512" || name == "AVX2"; }

double tolerance(const std::string& name, int64_t T) {
  if (name.find("Int8") != std::string::npos) return 1e-3;
  if (f32_decode(name) && T < 16) return 1e-9;
  return 1e-4;
}

struct Case {
  int64_t E, H, I;
};

void test_backend(const BackendInfo& b, const BackendOps& ref, const Case& c, ThreadPool& pool) {
  std::mt19937 rng(unsigned(c.E * 1000 + c.H));
  std::normal_distribution<float> nd;
  const MoeDims d{c.E, c.H, c.I};
  std::vector<uint16_t> gate(size_t(c.E * c.I * c.H)), up(gate.size()), down(size_t(c.E * c.H * c.I));
  for (auto* v : {&gate, &up})
    for (auto& x : *v) x = f32_to_bf16(nd(rng) / std::sqrt(float(c.H)));
  for (auto& x : down) x = f32_to_bf16(nd(rng) / std::sqrt(float(c.I)));
  const WeightsIn w{WeightType::BF16, gate.data(), up.data(), down.data()};
  Aligned pk(b.ops->packed_bytes(d, w.type)), pr(ref.packed_bytes(d, w.type));
  std::memset(pk.p, 0xcd, b.ops->packed_bytes(d, w.type));
  b.ops->pack(d, w, pk.p, pool);
  ref.pack(d, w, pr.p, pool);
  const std::string name = b.ops->name;

  // Round trip: expert 1 back to f32 matches the input (bf16 layouts exactly, int8 to quantization error).
  std::vector<float> g(size_t(c.I * c.H)), u(g.size()), dn(size_t(c.H * c.I));
  b.ops->unpack(pk.p, 1, g.data(), u.data(), dn.data());
  double err = 0, tot = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    float want = bf16_to_f32(gate[size_t(c.I * c.H) + i]);
    err += double(g[i] - want) * (g[i] - want);
    tot += double(want) * want;
  }
  const bool lossy = name.find("Int8") != std::string::npos;
  CHECK(lossy ? err / tot < 1e-3 : err == 0.0, "%s unpack gate nmse %.3g", name.c_str(), err / tot);

  for (int64_t T : {1, 3, 64, 513}) {
    for (int64_t k : {1, 2, 8}) {
      if (k >= c.E) continue;
      std::vector<float> x(size_t(T * c.H)), wt(size_t(T * k));
      std::vector<int64_t> ids(size_t(T * k));
      for (auto& v : x) v = nd(rng);
      for (auto& v : wt) v = std::fabs(nd(rng));
      for (int64_t t = 0; t < T; ++t) {  // k distinct experts among 0..E-2 (E-1 stays idle); slot k-1 of token 0 skipped
        std::vector<int64_t> perm(size_t(c.E - 1));
        for (int64_t e = 0; e < c.E - 1; ++e) perm[size_t(e)] = e;
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int64_t j = 0; j < k; ++j) ids[size_t(t * k + j)] = perm[size_t(j)];
      }
      if (k > 1) ids[size_t(k - 1)] = -1;
      std::vector<float> y(x.size(), std::nanf("")), yr(x.size(), std::nanf(""));
      b.ops->forward(pk.p, T, k, ids.data(), wt.data(), x.data(), y.data(), pool);
      ref.forward(pr.p, T, k, ids.data(), wt.data(), x.data(), yr.data(), pool);
      double e2 = 0, r2 = 0;
      bool nan = false;
      for (size_t i = 0; i < y.size(); ++i) {
        nan |= std::isnan(y[i]);
        e2 += double(y[i] - yr[i]) * (y[i] - yr[i]);
        r2 += double(yr[i]) * yr[i];
      }
      CHECK(!nan, "%s E%lld H%lld I%lld T%lld k%lld: output has NaN (unwritten)", name.c_str(), (long long)c.E,
            (long long)c.H, (long long)c.I, (long long)T, (long long)k);
      CHECK(e2 / r2 <= tolerance(name, T), "%s E%lld H%lld I%lld T%lld k%lld: nmse %.3g", name.c_str(), (long long)c.E,
            (long long)c.H, (long long)c.I, (long long)T, (long long)k, e2 / r2);
    }
  }
  // One expert gets every token.
  const int64_t T = 70;
  std::vector<float> x(size_t(T * c.H)), wt(size_t(T), 0.5f), y(x.size(), std::nanf("")), yr(x.size());
  std::vector<int64_t> ids(size_t(T), c.E - 1);
  for (auto& v : x) v = nd(rng);
  b.ops->forward(pk.p, T, 1, ids.data(), wt.data(), x.data(), y.data(), pool);
  ref.forward(pr.p, T, 1, ids.data(), wt.data(), x.data(), yr.data(), pool);
  double e2 = 0, r2 = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    e2 += double(y[i] - yr[i]) * (y[i] - yr[i]);
    r2 += double(yr[i]) * yr[i];
  }
  CHECK(e2 / r2 <= tolerance(name, T), "%s one expert, all tokens: nmse %.3g", name.c_str(), e2 / r2);
}

void test_backends() {
  const BackendInfo* ref = find_backend("Reference");
  CHECK(ref && ref->available, "Reference is always available");
  if (!ref) return;
  CHECK(auto_backend() != nullptr && !auto_backend()->ops->emulated, "Auto picks a non-emulated backend");
  ThreadPool pool(2);
  int tested = 0;
  for (const BackendInfo& b : backends()) {
    CHECK(!b.reason.empty(), "%s has a reason", b.ops->name);
    if (!b.available || b.ops == ref->ops) continue;
    for (Case c : {Case{6, 37, 19}, Case{10, 130, 70}}) test_backend(b, *ref->ops, c, pool);
    std::printf("  backend %s ok\n", b.ops->name);
    ++tested;
  }
  std::printf("  %d backends tested against Reference\n", tested);
}

// An int8 backend packs bf16 weights (its own fast path) into the same bytes as the same values given as f32 (the
// portable rule): everything after the 64-byte header, whose source type differs. Odd K (group and quad tails), and
// NaN, Inf, all-zero, denormal and exactly-tied weights.
void test_int8_packing_from_bf16_equals_from_f32() {
  ThreadPool pool(2);
  const MoeDims d{3, 200, 70};  // gate/up rows of K = 200, down rows of K = 70
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> gate(size_t(d.E * d.I * d.H)), up(gate.size()), down(size_t(d.E * d.H * d.I));
  for (auto* v : {&gate, &up, &down})
    for (auto& x : *v) x = f32_to_bf16(std::ldexp(nd(rng), int(rng() % 20) - 10));
  gate[3] = 0x7fc0;                                                        // NaN (row 0)
  gate[size_t(d.H) + 9] = 0x7f80;                                          // +Inf (row 1)
  for (int64_t k = 0; k < d.H; ++k) up[size_t(2 * d.H + k)] = k % 2 ? 0x8000 : 0;  // +-0 (row 2)
  down[5] = 0x0001;                                                        // a denormal
  for (int64_t k = 0; k < d.H; ++k) gate[size_t(5 * d.H + k)] = f32_to_bf16(float(k % 5) - 2.0f);
  gate[size_t(5 * d.H)] = f32_to_bf16(127.0f);  // row 5: amax 127, so 2.5 and -0.5 are ties
  gate[size_t(5 * d.H + 1)] = f32_to_bf16(2.5f);
  gate[size_t(5 * d.H + 2)] = f32_to_bf16(-0.5f);
  const auto widen = [](const std::vector<uint16_t>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_f32(v[i]);
    return f;
  };
  const std::vector<float> gf = widen(gate), uf = widen(up), df = widen(down);
  int tested = 0;
  for (const BackendInfo& b : backends()) {
    if (!b.available || std::string(b.ops->weights) != "int8") continue;
    const size_t n = b.ops->packed_bytes(d, WeightType::BF16);
    CHECK(n == b.ops->packed_bytes(d, WeightType::F32), "%s: same size from bf16 and f32", b.ops->name);
    Aligned p16(n), p32(n);
    std::memset(p16.p, 0xcd, n);
    std::memset(p32.p, 0x5a, n);
    b.ops->pack(d, WeightsIn{WeightType::BF16, gate.data(), up.data(), down.data()}, p16.p, pool);
    b.ops->pack(d, WeightsIn{WeightType::F32, gf.data(), uf.data(), df.data()}, p32.p, pool);
    CHECK(std::memcmp(p16.p + 64, p32.p + 64, n - 64) == 0, "%s: bf16 and f32 sources pack to the same bytes",
          b.ops->name);
    ++tested;
  }
  CHECK(tested > 0, "an int8 backend runs here");
}

void test_header() {
  const MoeDims d{2, 8, 4};
  Aligned buf(256);
  write_header(buf.p, "AVX512", d, WeightType::F16);
  WeightType t;
  MoeDims got = read_header(buf.p, "AVX512", &t);
  CHECK(got.E == 2 && got.H == 8 && got.I == 4 && t == WeightType::F16, "header round trip");
  bool threw = false;
  try {
    read_header(buf.p, "AVX2");
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("packed for backend AVX512, not AVX2") != std::string::npos;
  }
  CHECK(threw, "a blob packed for another backend is refused by name");
  buf.p[8] ^= 0xff;  // layout version
  threw = false;
  try {
    read_header(buf.p, "AVX512");
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("layout version") != std::string::npos;
  }
  CHECK(threw, "a stale layout version is refused");
}

void test_cpu() {
  const CpuFeatures& f = cpu_features();
  CHECK(f.physical_cores >= 1 && f.logical_cpus >= f.physical_cores, "core counts");
  CHECK(!f.amx_reason.empty(), "AMX reason");
  CHECK(f.amx_permitted == (f.amx_perm_rc == 0), "permission matches the syscall result");
  CHECK(!(f.amx_permitted && !f.os_amx), "never permitted without XCR0 AMX state");
}

}  // namespace

int main() {
  std::printf("tessera native tests\n");
  test_cpu();
  test_bf16_conversions();
  test_header();
  test_pool();
  test_pool_stress();
  test_backends();
  test_int8_packing_from_bf16_equals_from_f32();
  if (tessera_dense_tests && tessera_dense_tests() != 0) ++g_failures;
  if (tessera_amx_tests) {
    std::printf("AMX tests\n");
    if (tessera_amx_tests() != 0) ++g_failures;
  }
  std::printf(g_failures ? "FAILED: %d checks\n" : "all passed\n", g_failures);
  return g_failures ? 1 : 0;
}
