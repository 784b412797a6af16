// AMX tile emulator and AMX kernel tests: the emulator against scalar models of the SDM definitions (bit-exact), the
// real FTZ/DAZ arithmetic of this CPU where it has it, the AVX-512 vector half against its scalar twin, and the tile
// GEMMs against an independent scalar int8 reference built from unpacked weights. Runs in tessera_native_tests.
// tessera_amx_tests() is the entry point; this file also carries a weak main() so it runs on its own until a shared
// harness main() calls it.
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "../src/amx_moe.h"
#include "../src/amx_pack.h"
#include "../src/amx_tile_emu.h"
#include "../src/amx_vec.h"
#include "tessera/backend.h"
#include "tessera/bf16.h"
#include "tessera/cpu.h"
#include "tessera/pool.h"

using namespace tessera;
using namespace tessera::amx;

namespace {

int g_failures = 0;
#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                          \
    }                                                                        \
  } while (0)

template <class F>
bool faults(F&& f) {
  try {
    f();
  } catch (const TileFault&) {
    return true;
  }
  return false;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ------------------------------------------------------------------------------------------------ emulator: state

void test_ldtilecfg_validation() {
  TileConfig ok;
  ok.tile(0, 16, 64).tile(1, 3, 12);
  CHECK(!faults([&] { emu::ldtilecfg(ok); }));
  CHECK(emu::state().configured);
  TileConfig c = ok;
  c.palette_id = 2;
  CHECK(faults([&] { emu::ldtilecfg(c); }));
  c = ok;
  c.rows[1] = 17;
  CHECK(faults([&] { emu::ldtilecfg(c); }));
  c = ok;
  c.colsb[1] = 65;
  CHECK(faults([&] { emu::ldtilecfg(c); }));
  c = ok;
  c.colsb[2] = 8;  // colsb without rows
  CHECK(faults([&] { emu::ldtilecfg(c); }));
  c = ok;
  c.reserved0[3] = 1;
  CHECK(faults([&] { emu::ldtilecfg(c); }));
  c = ok;
  c.rows[9] = 1;  // beyond the 8 tiles of palette 1
  c.colsb[9] = 4;
  CHECK(faults([&] { emu::ldtilecfg(c); }));
  // palette 0 is the INIT state: tiles unconfigured, any tile op faults.
  TileConfig init;
  emu::ldtilecfg(init);
  CHECK(!emu::state().configured);
  CHECK(faults([] { emu::tilezero(0); }));
  emu::ldtilecfg(ok);
  CHECK(faults([] { emu::tilezero(2); }));  // tile 2 not configured
  emu::tilerelease();
  CHECK(!emu::state().configured);
}

void test_load_store_stride_and_zeroing() {
  std::mt19937 rng(1);
  TileConfig c;
  c.tile(0, 5, 12);
  emu::ldtilecfg(c);
  std::memset(emu::state().data[0], 0xAB, kTileBytes);  // junk the hardware would overwrite
  std::vector<uint8_t> src(5 * 100);
  for (auto& b : src) b = uint8_t(rng());
  emu::tileloadd(0, src.data(), 100);
  const uint8_t* t = emu::state().data[0];
  for (int r = 0; r < 16; ++r)
    for (int b = 0; b < 64; ++b) {
      const uint8_t want = (r < 5 && b < 12) ? src[r * 100 + b] : 0;
      CHECK(t[r * 64 + b] == want);
    }
  std::vector<uint8_t> dst(5 * 40, 0xEE);
  emu::tilestored(0, dst.data(), 40);
  for (int r = 0; r < 5; ++r)
    for (int b = 0; b < 40; ++b) CHECK(dst[r * 40 + b] == (b < 12 ? src[r * 100 + b] : 0xEE));
  // negative stride walks upwards
  emu::tileloadd(0, src.data() + 4 * 100, -100);
  for (int r = 0; r < 5; ++r) CHECK(std::memcmp(t + r * 64, src.data() + (4 - r) * 100, 12) == 0);
  emu::tilerelease();
}

// ------------------------------------------------------------------------------------------------ emulator: TDPBSSD

void test_tdpbssd_tdpbsud_match_definition_and_wrap() {
  std::mt19937 rng(2);
  for (int iter = 0; iter < 200; ++iter) {
    const bool b_signed = iter % 2 == 0;  // TDPBSSD, else TDPBSUD (tsrc2's bytes zero-extended)
    const int M = 1 + rng() % 16, Kq = 1 + rng() % 16, Nq = 1 + rng() % 16;
    TileConfig c;
    c.tile(0, M, 4 * Kq).tile(1, Kq, 4 * Nq).tile(2, M, 4 * Nq);
    emu::ldtilecfg(c);
    std::vector<int8_t> A(M * 64), B(Kq * 64);
    std::vector<int32_t> C(M * 16);
    for (auto& v : A) v = int8_t(rng());
    for (auto& v : B) v = int8_t(rng());
    for (auto& v : C) v = int32_t(rng());
    if (iter % 4 < 2)
      for (auto& v : C) v = INT32_MAX - int32_t(rng() % 1000);  // products push past INT32_MAX: must wrap
    emu::tileloadd(0, A.data(), 64);
    emu::tileloadd(1, B.data(), 64);
    emu::tileloadd(2, C.data(), 64);
    if (b_signed)
      emu::tdpbssd(2, 0, 1);
    else
      emu::tdpbsud(2, 0, 1);
    std::vector<int32_t> out(16 * 16, -1);
    c.tile(2, M, 4 * Nq);
    emu::tilestored(2, out.data(), 64);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < Nq; ++n) {
        int64_t acc = C[m * 16 + n];
        for (int k = 0; k < Kq; ++k)
          for (int q = 0; q < 4; ++q)
            acc += int64_t(A[m * 64 + 4 * k + q]) * (b_signed ? int64_t(B[k * 64 + 4 * n + q])
                                                              : int64_t(uint8_t(B[k * 64 + 4 * n + q])));
        CHECK(out[m * 16 + n] == int32_t(uint32_t(uint64_t(acc))));
      }
    // bytes beyond the C shape are zero after the instruction
    const uint8_t* t = emu::state().data[2];
    for (int r = 0; r < 16; ++r)
      for (int b = 0; b < 64; ++b)
        if (r >= M || b >= 4 * Nq) CHECK(t[r * 64 + b] == 0);
  }
  // shape rules (#UD on hardware)
  TileConfig c;
  c.tile(0, 4, 16).tile(1, 5, 16).tile(2, 4, 16);
  emu::ldtilecfg(c);
  CHECK(faults([] { emu::tdpbssd(2, 0, 1); }));  // A.colsb/4 != B.rows
  c.tile(1, 4, 16).tile(2, 3, 16);
  emu::ldtilecfg(c);
  CHECK(faults([] { emu::tdpbssd(2, 0, 1); }));  // C.rows != A.rows
  c.tile(2, 4, 8);
  emu::ldtilecfg(c);
  CHECK(faults([] { emu::tdpbssd(2, 0, 1); }));  // C.colsb != B.colsb
  c.tile(2, 4, 16);
  emu::ldtilecfg(c);
  CHECK(!faults([] { emu::tdpbssd(2, 0, 1); }));
  CHECK(faults([] { emu::tdpbssd(2, 2, 1); }));  // operands must be distinct
  emu::tilerelease();
}

// ------------------------------------------------------------------------------------------------ emulator: TDPBF16PS

uint16_t rand_bf16(std::mt19937& rng) {
  // mostly ordinary values, some tiny (denormal inputs and products that underflow), some zero
  const int kind = rng() % 8;
  float f = std::ldexp(float(int(rng() % 2001) - 1000) / 1000.0f, int(rng() % 20) - 10);
  if (kind == 0) f = std::ldexp(1.0f + float(rng() % 128) / 128.0f, -60 - int(rng() % 10));  // products ~2^-130
  if (kind == 1) f = 0.0f;
  uint16_t b;
  const uint32_t u = bits(f);
  b = uint16_t(u >> 16);
  if (kind == 2) b = uint16_t((rng() & 0x8000) | (1 + rng() % 0x7f));  // bf16 denormal input
  return b;
}

// The SDM pseudocode evaluated by this CPU's own FMA with MXCSR.DAZ|FTZ set: an independent model of the emulator.
#if defined(__x86_64__)
__attribute__((target("fma"))) void hw_model_dpbf16ps(int M, int Kp, int Nd, const uint16_t* A, const uint16_t* B,
                                                      float* C) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // FTZ | DAZ
  auto f32 = [](uint16_t h) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return _mm_set_ss(f);
  };
  for (int m = 0; m < M; ++m) {
    __m128 temp[32];
    for (int i = 0; i < 2 * Nd; ++i) temp[i] = _mm_setzero_ps();
    for (int k = 0; k < Kp; ++k)
      for (int n = 0; n < Nd; ++n) {
        temp[2 * n] = _mm_fmadd_ss(f32(A[m * 32 + 2 * k]), f32(B[k * 32 + 2 * n]), temp[2 * n]);
        temp[2 * n + 1] = _mm_fmadd_ss(f32(A[m * 32 + 2 * k + 1]), f32(B[k * 32 + 2 * n + 1]), temp[2 * n + 1]);
      }
    for (int n = 0; n < Nd; ++n) {
      const __m128 tmp = _mm_add_ss(temp[2 * n], temp[2 * n + 1]);
      C[m * 16 + n] = _mm_cvtss_f32(_mm_add_ss(_mm_set_ss(C[m * 16 + n]), tmp));
    }
  }
  _mm_setcsr(saved);
}
#endif

void test_tdpbf16ps_matches_ftz_daz_hardware_model() {
#if defined(__x86_64__)
  if (!cpu_features().fma) return;
  std::mt19937 rng(3);
  for (int iter = 0; iter < 100; ++iter) {
    const int M = 1 + rng() % 16, Kp = 1 + rng() % 16, Nd = 1 + rng() % 16;
    TileConfig c;
    c.tile(0, M, 4 * Kp).tile(1, Kp, 4 * Nd).tile(2, M, 4 * Nd);
    emu::ldtilecfg(c);
    std::vector<uint16_t> A(16 * 32), B(16 * 32);
    std::vector<float> C(16 * 16), want;
    for (auto& v : A) v = rand_bf16(rng);
    for (auto& v : B) v = rand_bf16(rng);
    for (auto& v : C) v = (rng() % 4 == 0) ? std::ldexp(float(rng() % 1000), -140) : float(int(rng() % 200) - 100);
    want = C;
    hw_model_dpbf16ps(M, Kp, Nd, A.data(), B.data(), want.data());
    emu::tileloadd(0, A.data(), 64);
    emu::tileloadd(1, B.data(), 64);
    emu::tileloadd(2, C.data(), 64);
    emu::tdpbf16ps(2, 0, 1);
    std::vector<float> out(16 * 16);
    emu::tilestored(2, out.data(), 64);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < Nd; ++n) CHECK(bits(out[m * 16 + n]) == bits(want[m * 16 + n]));
  }
  emu::tilerelease();
#endif
}

void test_fma_ftz_tininess_after_rounding() {
  // exact = FLT_MIN - 0.75 * 2^-150: rounds to FLT_MIN on the denormal grid but below it with an unbounded exponent,
  // so x86 (tininess after rounding) flushes it to zero; exact = FLT_MIN - 0.25 * 2^-150 stays FLT_MIN.
  CHECK(emu::fma_daz_ftz(-1.5f * std::ldexp(1.0f, -76), std::ldexp(1.0f, -75), FLT_MIN) == 0.0f);
  CHECK(emu::fma_daz_ftz(-std::ldexp(1.0f, -77), std::ldexp(1.0f, -75), FLT_MIN) == FLT_MIN);
  CHECK(emu::fma_daz_ftz(std::ldexp(1.0f, -70), std::ldexp(1.0f, -70), 0.0f) == 0.0f);  // 2^-140 flushed
  CHECK(std::signbit(emu::fma_daz_ftz(-std::ldexp(1.0f, -70), std::ldexp(1.0f, -70), 0.0f)));
  CHECK(emu::bf16_to_fp32_daz(0x0001) == 0.0f);  // denormal input treated as zero
  CHECK(emu::add_daz_ftz(std::ldexp(1.0f, -130), 0.0f) == 0.0f);
}

// ------------------------------------------------------------------------------------------------ vector half

void test_avx512_bf16_decode_matches_scalar_twin() {
  const VecKernels* v = vec_avx512();
  const CpuFeatures& c = cpu_features();
  if (!v || !(c.os_avx512 && c.avx512f && c.avx512bw && c.avx512vl && c.avx512_vnni)) return;
  std::mt19937 rng(4);
  // (N, M): n-block counts that leave remainders after the 4- and 2-block passes; 1, 2, 3, 4 token rows
  for (auto [N, M] : {std::pair<int64_t, int64_t>{37, 6}, {100, 1}, {100, 2}, {150, 7}}) {
    const int64_t K = 70;
    const MatLayout L = MatLayout::make(WeightFormat::BF16, N, K, 0);
    std::vector<float> w(N * K), x(M * K);
    for (auto& f : w) f = std::normal_distribution<float>()(rng);
    for (auto& f : x) f = std::normal_distribution<float>()(rng);
    x[5] = std::ldexp(1.0f, -130);  // a denormal activation: kept, not flushed
    std::vector<uint8_t> buf(L.bytes + 64);
    uint8_t* W = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
    pack_matrix(L, WeightType::F32, w.data(), W);
    std::vector<float> A(M * L.Kp);
    for (int64_t m = 0; m < M; ++m) pad_row_f32(L, x.data() + m * K, A.data() + m * L.Kp);
    std::vector<float> c1(M * N, NAN), c2(M * N, NAN);
    v->gemm_bf16(L, W, A.data(), L.Kp, M, 0, L.nblocks, c1.data(), N);
    vec_scalar().gemm_bf16(L, W, A.data(), L.Kp, M, 0, L.nblocks, c2.data(), N);
    for (int64_t i = 0; i < M * N; ++i) CHECK(bits(c1[i]) == bits(c2[i]));
  }
}

void test_silu_variants_agree_and_are_accurate() {
  std::mt19937 rng(8);
  const int64_t n = 4099;  // not a multiple of 16: the AVX-512 tail runs too
  std::vector<float> g(n), u(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), int(rng() % 9) - 2);  // |g| up to 64
    u[i] = std::normal_distribution<float>()(rng);
  }
  g[0] = 100.0f;  // beyond the clamp both ways
  g[1] = -100.0f;
  g[2] = 0.0f;
  std::vector<float> a = g, b = g;
  vec_scalar().silu_mul(a.data(), u.data(), n);
  if (const VecKernels* v = vec_avx512(); v && cpu_features().avx512f && cpu_features().os_avx512) {
    v->silu_mul(b.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) CHECK(bits(a[i]) == bits(b[i]));
  }
  for (int64_t i = 0; i < n; ++i) {
    const double want = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i];
    // below g = -88 the clamped exp leaves |g| * e^-88 * |u| (~1e-36) where silu is ~0 anyway
    CHECK(std::fabs(a[i] - want) <= 4e-7 * std::fabs(want) + 1e-35);
  }
}

void test_activation_conversions_agree() {
  const VecKernels* v = vec_avx512();
  if (!v || !(cpu_features().avx512f && cpu_features().avx512bw && cpu_features().os_avx512)) return;
  std::mt19937 rng(9);
  for (int64_t K : {1, 17, 64, 100, 200}) {
    for (int64_t group : {0, 64}) {
      const MatLayout L = MatLayout::make(WeightFormat::Int8, 16, K, group);
      const MatLayout B = MatLayout::make(WeightFormat::BF16, 16, K, 0);
      std::vector<float> x(K);
      for (auto& f : x) f = std::ldexp(std::normal_distribution<float>()(rng), int(rng() % 40) - 20);
      if (K > 30) x[30] = NAN;  // one NaN group
      if (K > 10) x[10] = 0x1.0101p-126f * 0.5f;  // a denormal
      std::vector<int8_t> q1(2 * L.Kp, 7), q2(2 * L.Kp, 9);
      std::vector<float> s1(L.ngroups), s2(L.ngroups);
      std::vector<int32_t> c1(L.ngroups), c2(L.ngroups);
      quantize_row_i8(L, x.data(), q1.data(), s1.data(), c1.data());
      v->quantize_i8(L, x.data(), q2.data(), s2.data(), c2.data());
      CHECK(q1 == q2 && c1 == c2);
      for (int64_t g = 0; g < L.ngroups; ++g) CHECK(bits(s1[g]) == bits(s2[g]));
      std::vector<uint16_t> b1(B.Kp, 1), b2(B.Kp, 2);
      convert_row_bf16(B, x.data(), b1.data());
      v->convert_bf16(B, x.data(), b2.data());
      CHECK(b1 == b2);
    }
  }
}

// Packing a bf16 matrix to int8 (every load of a BF16 file on AMXInt8): the AVX-512 row quantizer against the scalar
// one, and pack_matrix from bf16 (which takes the vector table's) against pack_matrix from the same values as f32
// (the portable rule), on tails, groups with no column, NaN, Inf, all-zero and denormal groups and exact ties.
void test_weight_packing_from_bf16_agrees() {
  std::mt19937 rng(12);
  for (int64_t K : {1, 17, 64, 100, 200, 2048}) {
    for (int64_t group : {0, 64}) {
      const int64_t N = 37;  // three n-blocks, the last partial
      const MatLayout L = MatLayout::make(WeightFormat::Int8, N, K, group);
      std::vector<uint16_t> w(N * K);
      for (auto& h : w) h = f32_to_bf16(std::ldexp(std::normal_distribution<float>()(rng), int(rng() % 30) - 15));
      if (K >= 64) {
        w[1 * K + 3] = 0x7fc0;                                       // row 1: a NaN group
        w[2 * K + 5] = 0x7f80;                                       // row 2: +Inf
        for (int64_t k = 0; k < std::min<int64_t>(K, 64); ++k) w[3 * K + k] = k % 2 ? 0x8000 : 0;  // row 3: +-0
        w[4 * K + 7] = 0x0003;                                       // row 4: a denormal
        for (int64_t k = 0; k < K; ++k) w[5 * K + k] = f32_to_bf16(float(k % 7) - 3.0f);
        w[5 * K + 0] = f32_to_bf16(127.0f);                          // row 5: amax 127, so scale 1 and
        w[5 * K + 1] = f32_to_bf16(2.5f);                            // 2.5 and -3.5 are exact ties
        w[5 * K + 2] = f32_to_bf16(-3.5f);
      }
      std::vector<float> wf(N * K);
      for (size_t i = 0; i < w.size(); ++i) wf[i] = bf16_to_f32(w[i]);
      if (const VecKernels* v = vec_avx512(); v && cpu_features().avx512f && cpu_features().avx512bw &&
                                                cpu_features().os_avx512) {
        for (int64_t n = 0; n < N; ++n) {
          std::vector<uint8_t> o1(L.Kp, 128), o2(L.Kp, 128);
          std::vector<float> s1(2 * L.ngroups, 5.0f), s2(2 * L.ngroups, 5.0f);
          quantize_weight_row_bf16(L, w.data() + n * K, o1.data(), s1.data(), 2);
          v->quantize_weight_bf16(L, w.data() + n * K, o2.data(), s2.data(), 2);
          CHECK(o1 == o2);
          for (size_t g = 0; g < s1.size(); ++g) CHECK(bits(s1[g]) == bits(s2[g]));
        }
      }
      std::vector<uint8_t> b1(L.bytes + 64), b2(L.bytes + 64);
      uint8_t* P1 = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(b1.data()) + 63) & ~uintptr_t(63));
      uint8_t* P2 = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(b2.data()) + 63) & ~uintptr_t(63));
      pack_matrix(L, WeightType::BF16, w.data(), P1);
      pack_matrix(L, WeightType::F32, wf.data(), P2);
      CHECK(std::memcmp(P1, P2, L.bytes) == 0);
      if (K >= 64) {
        std::vector<float> back(N * K);
        unpack_matrix(L, P1, back.data());
        CHECK(back[5 * K + 1] == 2.0f && back[5 * K + 2] == -4.0f);  // ties to even
        CHECK(std::isnan(back[1 * K]));                               // the NaN's group stays NaN
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------ tile GEMMs

struct Packed {
  MatLayout L;
  std::vector<uint8_t> buf;
  uint8_t* W;
};

Packed make_packed(WeightFormat fmt, int64_t N, int64_t K, int64_t group, std::mt19937& rng) {
  Packed p;
  p.L = MatLayout::make(fmt, N, K, group);
  std::vector<float> w(N * K);
  for (auto& f : w) f = std::normal_distribution<float>()(rng);
  p.buf.assign(p.L.bytes + 64, 0);
  p.W = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p.buf.data()) + 63) & ~uintptr_t(63));
  pack_matrix(p.L, WeightType::F32, w.data(), p.W);
  // round trip: int8 within half a step of the source, bf16 exact to bf16 rounding
  std::vector<float> back(N * K);
  unpack_matrix(p.L, p.W, back.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const float a = w[n * K + k], b = back[n * K + k];
      if (fmt == WeightFormat::BF16) {
        CHECK(std::fabs(a - b) <= std::fabs(a) * 0x1p-8f);
      } else {
        const float s = p.L.scales(p.W, n / 16)[(k / p.L.group) * 16 + n % 16];
        CHECK(std::fabs(a - b) <= 0.5f * s * 1.0001f);
      }
    }
  return p;
}

// Independent int8 reference from unpacked int8 values: exact int64 dots of 254 * hi + lo per group, then the
// documented epilogue (the +128 bias of the stored bytes is removed here per weight, not through the activation sums).
void ref_i8(const Packed& p, const int8_t* A, const float* as, int64_t M, float* C) {
  const MatLayout& L = p.L;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < L.N; ++n) {
      float facc = 0.0f;
      for (int64_t g = 0; g < L.ngroups; ++g) {
        int64_t acc = 0;
        for (int64_t k = g * L.group; k < (g + 1) * L.group && k < L.K; ++k) {
          const uint8_t* t = L.tile(p.W, n / 16, k / 64);
          const int64_t a = 254 * int64_t(A[m * 2 * L.Kp + k]) + A[m * 2 * L.Kp + L.Kp + k];
          acc += a * (int(t[((k % 64) / 4) * 64 + (n % 16) * 4 + k % 4]) - 128);
        }
        CHECK(acc == int64_t(int32_t(acc)));  // the int32 contract holds for groups <= kMaxInt8Group
        facc += (float(acc) * L.scales(p.W, n / 16)[g * 16 + n % 16]) * as[m * L.ngroups + g];
      }
      C[m * L.N + n] = facc;
    }
}

// vec.dequant_bf16 (int8 weights x their group scale, rounded to bf16 for the bf16 tiles): the scalar twin, the
// AVX-512 rounding and the VCVTNE2PS2BF16 one give the same bits, with scales that put products exactly at FLT_MIN,
// below it (flushed to a signed zero by every variant) and NaN.
void test_dequant_bf16_variants_agree() {
  const CpuFeatures& c = cpu_features();
  const bool avx512 = c.os_avx512 && c.avx512f && c.avx512bw && c.avx512vl && c.avx512_vnni;
  std::vector<const VecKernels*> variants;
  if (avx512 && vec_avx512()) variants.push_back(vec_avx512());
  if (avx512 && c.avx512_bf16 && vec_avx512_bf16()) variants.push_back(vec_avx512_bf16());
  std::mt19937 rng(12);
  int flushed = 0;
  for (int64_t K : {64, 200}) {
    for (int64_t group : {0, 64}) {
      const int64_t N = 37;
      const MatLayout L = MatLayout::make(WeightFormat::Int8, N, K, group);
      std::vector<float> w(N * K);
      for (auto& f : w) f = std::normal_distribution<float>()(rng);
      std::vector<uint8_t> buf(L.bytes + 64);
      uint8_t* W = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
      pack_matrix(L, WeightType::F32, w.data(), W);
      for (int64_t nb = 0; nb < L.nblocks; ++nb) {
        float* sc = const_cast<float*>(L.scales(W, nb));  // [ngroups][16]
        sc[0] = FLT_MIN;         // |q| = 1: exactly FLT_MIN, kept
        sc[1] = FLT_MIN / 2;     // |q| = 1: denormal, flushed; |q| = 2: FLT_MIN
        sc[2] = 1e-40f;          // a denormal scale: every product below FLT_MIN
        sc[3] = -FLT_MIN / 3;
        sc[4] = NAN;
        sc[5] = 3e-38f;          // |q| <= 127: ~3.8e-36 down to 3e-38
      }
      const int64_t per_block = L.Kp / 32 * 512;  // bf16 tiles of 32 K each
      std::vector<uint16_t> want(L.nblocks * per_block);
      for (int64_t nb = 0; nb < L.nblocks; ++nb) vec_scalar().dequant_bf16(L, W, nb, want.data() + nb * per_block);
      for (int64_t nb = 0; nb < L.nblocks; ++nb) {
        const float* sc = L.scales(W, nb);
        for (int64_t k = 0; k < L.Kp; ++k) {
          const uint8_t* t = L.tile(W, nb, k / kTileKInt8);
          const int64_t kk = k % kTileKInt8;
          for (int n = 0; n < 16; ++n) {
            const float v = float(int(t[(kk / 4) * 64 + n * 4 + kk % 4]) - 128) * sc[(k / L.group) * 16 + n];
            const uint16_t got = want[nb * per_block + (k / 32) * 512 + ((k % 32) / 2) * 32 + 2 * n + k % 2];
            if (v != 0.0f && std::fabs(v) < FLT_MIN) {
              CHECK((got & 0x7fff) == 0 && (got >> 15) == uint16_t(std::signbit(v)));  // a signed zero
              ++flushed;
            }
          }
        }
      }
      for (const VecKernels* v : variants) {
        std::vector<uint16_t> got(want.size(), 0xdead);
        for (int64_t nb = 0; nb < L.nblocks; ++nb) v->dequant_bf16(L, W, nb, got.data() + nb * per_block);
        for (size_t i = 0; i < want.size(); ++i)
          if (got[i] != want[i]) {
            std::fprintf(stderr, "dequant_bf16 %s: element %zu %04x, scalar %04x\n", v->name, i, got[i], want[i]);
            CHECK(got[i] == want[i]);
            break;
          }
      }
    }
  }
  CHECK(flushed > 100);  // the cases above really reached the denormal range
}

// quantize_row_i8's two digits reconstruct x within 1/254 of a one-digit step: |x - u (254 hi + lo)| <= u / 2 + slack.
void test_two_digit_activations_reconstruct() {
  std::mt19937 rng(10);
  for (int64_t K : {5, 64, 200}) {
    const MatLayout L = MatLayout::make(WeightFormat::Int8, 16, K, 64);
    std::vector<float> x(K);
    for (auto& f : x) f = std::ldexp(std::student_t_distribution<float>(3.0f)(rng), int(rng() % 6) - 3);
    std::vector<int8_t> q(2 * L.Kp, 5);
    std::vector<float> s(L.ngroups);
    std::vector<int32_t> c(L.ngroups);
    quantize_row_i8(L, x.data(), q.data(), s.data(), c.data());
    for (int64_t g = 0; g < L.ngroups; ++g) {
      int64_t sum = 0;
      for (int64_t k = g * 64; k < (g + 1) * 64; ++k) sum += 254 * int64_t(q[k]) + q[L.Kp + k];
      CHECK(c[g] == int32_t(128 * sum));
    }
    for (int64_t k = 0; k < L.Kp; ++k) {
      const float u = s[k / 64];
      const double back = double(u) * (254.0 * q[k] + q[L.Kp + k]);
      if (k < K) {
        CHECK(std::abs(int(q[L.Kp + k])) <= 127);
        CHECK(std::fabs(back - x[k]) <= 0.5 * u * 1.01 + 1e-12);
      } else {
        CHECK(q[k] == 0 && q[L.Kp + k] == 0);
      }
    }
  }
}

void test_tile_gemm_i8_edges_bit_exact() {
  std::mt19937 rng(5);
  const int64_t shapes[][3] = {{1, 16, 64},  {3, 17, 65},  {16, 32, 128}, {17, 33, 200},
                               {40, 50, 130}, {33, 16, 64}, {7, 150, 64},  {5, 100, 256}};
  for (int64_t group : {0, 64, 128}) {
    for (const auto& s : shapes) {
      const int64_t M = s[0], N = s[1], K = s[2];
      Packed p = make_packed(WeightFormat::Int8, N, K, group, rng);
      std::vector<float> x(M * K);
      for (auto& f : x) f = std::normal_distribution<float>()(rng);
      std::vector<int8_t> A(M * 2 * p.L.Kp);  // [M][hi Kp | lo Kp]
      std::vector<float> as(M * p.L.ngroups);
      std::vector<int32_t> cr(M * p.L.ngroups);
      for (int64_t m = 0; m < M; ++m)
        quantize_row_i8(p.L, x.data() + m * K, A.data() + m * 2 * p.L.Kp, as.data() + m * p.L.ngroups,
                        cr.data() + m * p.L.ngroups);
      std::vector<float> want(M * N), tiles(M * N, NAN), vs(M * N, NAN), vv(M * N, NAN);
      ref_i8(p, A.data(), as.data(), M, want.data());
      // the slab is split in two calls to cover nb0 > 0 and odd n-block counts
      const int64_t mid = p.L.nblocks / 2;
      for (auto [nb0, nb1] : {std::pair<int64_t, int64_t>{0, mid}, {mid, p.L.nblocks}}) {
        if (nb0 == nb1) continue;
        const int64_t lda = 2 * p.L.Kp;
        TileGemm<TileEmu>::i8(vec_best(), p.L, p.W, A.data(), lda, as.data(), cr.data(), M, nb0, nb1, tiles.data(), N);
        vec_scalar().gemm_i8(p.L, p.W, A.data(), lda, as.data(), cr.data(), M, nb0, nb1, vs.data(), N);
        vec_best().gemm_i8(p.L, p.W, A.data(), lda, as.data(), cr.data(), M, nb0, nb1, vv.data(), N);
      }
      for (int64_t i = 0; i < M * N; ++i) {
        CHECK(bits(tiles[i]) == bits(want[i]));
        CHECK(bits(vs[i]) == bits(want[i]));
        CHECK(bits(vv[i]) == bits(want[i]));
      }
    }
  }
}

void test_tile_gemm_bf16_edges() {
  std::mt19937 rng(6);
  const int64_t shapes[][3] = {{1, 16, 32}, {3, 17, 33}, {17, 33, 100}, {40, 50, 70}};
  for (const auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    Packed p = make_packed(WeightFormat::BF16, N, K, 0, rng);
    std::vector<float> x(M * K);
    for (auto& f : x) f = std::normal_distribution<float>()(rng);
    std::vector<uint16_t> A(M * p.L.Kp);
    std::vector<float> A32(M * p.L.Kp);
    for (int64_t m = 0; m < M; ++m) {
      convert_row_bf16(p.L, x.data() + m * K, A.data() + m * p.L.Kp);
      pad_row_f32(p.L, x.data() + m * K, A32.data() + m * p.L.Kp);
    }
    std::vector<float> tiles(M * N, NAN), vec(M * N, NAN);
    TileGemm<TileEmu>::bf16(p.L, p.W, A.data(), p.L.Kp, M, 0, p.L.nblocks, tiles.data(), N);
    vec_scalar().gemm_bf16(p.L, p.W, A32.data(), p.L.Kp, M, 0, p.L.nblocks, vec.data(), N);
    // each against its exact sum in double (tiles: bf16 activations; vectors: f32 ones), within fp32 accumulation
    std::vector<float> back(N * K);
    unpack_matrix(p.L, p.W, back.data());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double exact16 = 0, exact32 = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          uint32_t u = uint32_t(A[m * p.L.Kp + k]) << 16;
          float a;
          std::memcpy(&a, &u, 4);
          exact16 += double(a) * back[n * K + k];
          exact32 += double(x[m * K + k]) * back[n * K + k];
          mag += std::fabs(double(x[m * K + k]) * back[n * K + k]);
        }
        CHECK(std::fabs(tiles[m * N + n] - exact16) <= 1e-6 * mag + 1e-30);
        CHECK(std::fabs(vec[m * N + n] - exact32) <= 1e-6 * mag + 1e-30);
      }
  }
}

// ------------------------------------------------------------------------------------------------ whole layer

std::vector<float> run_layer(const char* backend, const MoeDims& d, const std::vector<float>& w3, int64_t T, int64_t k,
                             const std::vector<int64_t>& ids, const std::vector<float>& wt,
                             const std::vector<float>& x, ThreadPool& pool) {
  const BackendInfo* b = find_backend(backend);
  CHECK(b && b->available);
  if (!b || !b->available) return {};
  const size_t n = size_t(d.E * d.I * d.H);
  WeightsIn w{WeightType::F32, w3.data(), w3.data() + n, w3.data() + 2 * n};
  std::vector<uint8_t> buf(b->ops->packed_bytes(d, WeightType::F32) + 64);
  uint8_t* blob = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
  b->ops->pack(d, w, blob, pool);
  std::vector<float> out(size_t(T * d.H), NAN);
  b->ops->forward(blob, T, k, ids.data(), wt.data(), x.data(), out.data(), pool);
  return out;
}

void test_layer_forward_vs_reference() {
  std::mt19937 rng(7);
  const MoeDims d{6, 72, 40};
  const size_t n = size_t(d.E * d.I * d.H);
  std::vector<float> w3(3 * n);
  for (auto& f : w3) f = 0.1f * std::normal_distribution<float>()(rng);
  ThreadPool pool(2);
  for (auto [T, k] : {std::pair<int64_t, int64_t>{1, 2}, {3, 1}, {33, 3}, {70, 6}}) {
    std::vector<int64_t> ids(T * k);
    std::vector<float> wt(T * k), x(T * d.H);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) ids[t * k + j] = (t + 2 * j) % d.E;  // distinct experts per token
    ids[0] = -1;                                                          // a skipped slot
    for (auto& f : wt) f = std::uniform_real_distribution<float>()(rng);
    for (auto& f : x) f = std::normal_distribution<float>()(rng);
    const auto ref = run_layer("Reference", d, w3, T, k, ids, wt, x, pool);
    for (const char* name : {"AMXInt8-emulated", "AMXBF16-emulated"}) {
      const auto got = run_layer(name, d, w3, T, k, ids, wt, x, pool);
      if (got.size() != ref.size()) continue;
      double num = 0, den = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        CHECK(!std::isnan(got[i]));
        num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
        den += double(ref[i]) * ref[i];
      }
      CHECK(num / den <= (std::strstr(name, "Int8") ? 1e-3 : 1e-4));
    }
  }
}

}  // namespace

int tessera_amx_tests() {
  const std::pair<const char*, void (*)()> tests[] = {
      {"ldtilecfg_validation", test_ldtilecfg_validation},
      {"load_store_stride_and_zeroing", test_load_store_stride_and_zeroing},
      {"tdpbssd_tdpbsud_match_definition_and_wrap", test_tdpbssd_tdpbsud_match_definition_and_wrap},
      {"tdpbf16ps_matches_ftz_daz_hardware_model", test_tdpbf16ps_matches_ftz_daz_hardware_model},
      {"fma_ftz_tininess_after_rounding", test_fma_ftz_tininess_after_rounding},
      {"avx512_bf16_decode_matches_scalar_twin", test_avx512_bf16_decode_matches_scalar_twin},
      {"silu_variants_agree_and_are_accurate", test_silu_variants_agree_and_are_accurate},
      {"activation_conversions_agree", test_activation_conversions_agree},
      {"weight_packing_from_bf16_agrees", test_weight_packing_from_bf16_agrees},
      {"dequant_bf16_variants_agree", test_dequant_bf16_variants_agree},
      {"two_digit_activations_reconstruct", test_two_digit_activations_reconstruct},
      {"tile_gemm_i8_edges_bit_exact", test_tile_gemm_i8_edges_bit_exact},
      {"tile_gemm_bf16_edges", test_tile_gemm_bf16_edges},
      {"layer_forward_vs_reference", test_layer_forward_vs_reference},
  };
  int failed_tests = 0;
  for (const auto& [name, fn] : tests) {
    const int before = g_failures;
    fn();
    const bool ok = g_failures == before;
    failed_tests += !ok;
    std::printf("[%s] amx.%s\n", ok ? "PASS" : "FAIL", name);
  }
  return failed_tests;
}

__attribute__((weak)) int main() { return tessera_amx_tests() ? 1 : 0; }
