// GGUF block formats: the type table, exact dequantization (bit-identical to gguf.quants.dequantize: the same f32
// operations in the same order; this file is built with -ffp-contract=off so no multiply-add is fused), the scan for
// non-finite block scales, and which quantized-kernel ISAs this CPU runs. Portable: no ISA flags.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "quant_kernels.h"
#include "tessera/bf16.h"
#include "tessera/cpu.h"
#include "tessera/tuning.h"

namespace tessera {
namespace {

const QTypeInfo kTypes[] = {
    {QType::Q4_0, "Q4_0", 32, 18, false},    {QType::Q8_0, "Q8_0", 32, 34, true},
    {QType::Q4_K, "Q4_K", 256, 144, false},  {QType::Q5_K, "Q5_K", 256, 176, false},
    {QType::Q6_K, "Q6_K", 256, 210, false},  {QType::IQ4_XS, "IQ4_XS", 256, 136, true},
};

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

inline void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// One block -> its `block` f32 values, in gguf-py's order of operations.
void dequantize_block(QType t, const uint8_t* blk, float* y) {
  switch (t) {
    case QType::Q8_0: {
      const float d = f16_at(blk);
      for (int i = 0; i < 32; ++i) y[i] = float(int8_t(blk[2 + i])) * d;  // x * d
      break;
    }
    case QType::Q4_0: {
      const float d = f16_at(blk);
      for (int i = 0; i < 16; ++i) {
        y[i] = d * float(int(blk[2 + i] & 0xF) - 8);
        y[16 + i] = d * float(int(blk[2 + i] >> 4) - 8);
      }
      break;
    }
    case QType::Q4_K:
    case QType::Q5_K: {
      const bool five = t == QType::Q5_K;
      const float d = f16_at(blk), dmin = f16_at(blk + 2);
      const uint8_t* qh = blk + 16;
      const uint8_t* qs = blk + (five ? 48 : 16);
      for (int s = 0; s < 8; ++s) {
        int sc, m;
        scale_min_k4(s, blk + 4, &sc, &m);
        const float ds = d * float(sc), dm = dmin * float(m);
        for (int l = 0; l < 32; ++l) {
          int q = (s & 1) ? qs[32 * (s / 2) + l] >> 4 : qs[32 * (s / 2) + l] & 0xF;
          if (five) q |= ((qh[l] >> s) & 1) << 4;
          const float p = ds * float(q);
          y[32 * s + l] = p - dm;
        }
      }
      break;
    }
    case QType::Q6_K: {
      const uint8_t* ql = blk;
      const uint8_t* qh = blk + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      const float d = f16_at(blk + 208);
      for (int h = 0; h < 2; ++h)
        for (int s = 0; s < 2; ++s)
          for (int k = 0; k < 2; ++k) {
            const int g32 = 4 * h + 2 * s + k, shift = 2 * (2 * s + k);
            for (int l = 0; l < 32; ++l) {
              const int q = (((ql[64 * h + 32 * k + l] >> (4 * s)) & 0xF) | (((qh[32 * h + l] >> shift) & 3) << 4)) - 32;
              const int v = 32 * g32 + l;
              const float ds = d * float(sc[v / 16]);
              y[v] = ds * float(q);
            }
          }
      break;
    }
    case QType::IQ4_XS: {
      const float d = f16_at(blk);
      const unsigned scales_h = unsigned(blk[2]) | unsigned(blk[3]) << 8;
      for (int ib = 0; ib < 8; ++ib) {
        const int ls = ((blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
        const float dl = d * float(ls - 32);
        for (int j = 0; j < 16; ++j) {
          const uint8_t q = blk[8 + 16 * ib + j];
          y[32 * ib + j] = dl * float(quant::kIQ4Values[q & 0xF]);
          y[32 * ib + 16 + j] = dl * float(quant::kIQ4Values[q >> 4]);
        }
      }
      break;
    }
  }
}

// Offsets of the f16 scales a block must have finite: {offset, name}; Q4_K/Q5_K also dmin.
int scale_fields(QType t, int* offs, const char** names) {
  switch (t) {
    case QType::Q6_K: offs[0] = 208; names[0] = "d"; return 1;
    case QType::Q4_K:
    case QType::Q5_K: offs[0] = 0; names[0] = "d"; offs[1] = 2; names[1] = "dmin"; return 2;
    default: offs[0] = 0; names[0] = "d"; return 1;
  }
}

}  // namespace

const QTypeInfo* qtype_info(int32_t ggml_type) {
  for (const auto& t : kTypes)
    if (int32_t(t.type) == ggml_type) return &t;
  return nullptr;
}

const QTypeInfo& qtype_info(QType t) { return *qtype_info(int32_t(t)); }

const char* qtype_names() { return "Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS"; }

void quant_dequantize(QType t, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t K, float* out,
                      ThreadPool& pool) {
  const QTypeInfo& info = qtype_info(t);
  pool.parallel_for(rows, [&](int64_t r, int) {
    for (int64_t b = 0; b < K / info.block; ++b)
      dequantize_block(t, w + r * row_bytes + b * info.bytes, out + r * K + b * info.block);
  });
}

QBadBlock quant_find_nonfinite(QType t, const uint8_t* w, size_t row_bytes, int64_t rows, ThreadPool& pool) {
  const QTypeInfo& info = qtype_info(t);
  const int64_t nb = int64_t(row_bytes) / info.bytes;
  int offs[2];
  const char* names[2];
  const int nf = scale_fields(t, offs, names);
  std::vector<int64_t> first(size_t(pool.size()), -1);  // per thread: the smallest bad (row * nb + block) it saw
  std::vector<int> field(size_t(pool.size()), 0);
  const int64_t chunk = 256;
  pool.parallel_for((rows + chunk - 1) / chunk, [&](int64_t task, int ith) {
    for (int64_t r = task * chunk; r < std::min(rows, (task + 1) * chunk); ++r)
      for (int64_t b = 0; b < nb; ++b)
        for (int f = 0; f < nf; ++f) {
          uint16_t h;
          std::memcpy(&h, w + r * row_bytes + b * info.bytes + offs[f], 2);
          if ((h & 0x7c00u) == 0x7c00u) {  // exponent all ones: Inf or NaN
            const int64_t at = r * nb + b;
            if (first[ith] < 0 || at < first[ith]) {
              first[ith] = at;
              field[ith] = f;
            }
            goto next_row;
          }
        }
    next_row:;
  });
  QBadBlock bad;
  int64_t best = -1;
  for (size_t i = 0; i < first.size(); ++i)
    if (first[i] >= 0 && (best < 0 || first[i] < best)) {
      best = first[i];
      bad.field = names[field[i]];
    }
  if (best >= 0) {
    bad.row = best / nb;
    bad.block = best % nb;
  }
  return bad;
}

const char* qisa_name(QIsa isa) {
  switch (isa) {
    case QIsa::AMXInt8: return "amx_int8";
    case QIsa::AMXInt8Emu: return "amx_int8_emu";
    case QIsa::AVX512VNNI: return "avx512_vnni";
    case QIsa::AVX2: return "avx2";
    default: return "reference";
  }
}

bool qisa_available(QIsa isa, std::string* why) {
  const CpuFeatures& c = cpu_features();
  auto no = [&](const char* what) {
    if (why) *why = what;
    return false;
  };
  switch (isa) {
    case QIsa::AMXInt8:
      if (!(c.amx_tile && c.amx_int8)) return no("CPU lacks amx_tile/amx_int8");
      if (!c.os_amx) return no("OS does not enable AMX state (XCR0 bits 17/18)");
      if (!c.amx_permitted) return no(c.amx_reason.empty() ? "kernel refused XTILEDATA permission" : c.amx_reason.c_str());
      if (max_isa_cap() < IsaLevel::AMX) return no(("capped by TESSERA_MAX_ISA=" + max_isa_cap_text()).c_str());
      return qisa_available(QIsa::AVX512VNNI, why);  // its decode and the other types' GEMM
    case QIsa::AMXInt8Emu: return qisa_available(QIsa::AVX512VNNI, why);
    case QIsa::AVX512VNNI:
      if (!(c.avx512f && c.avx512bw && c.avx512vl && c.avx512dq)) return no("CPU lacks avx512f/bw/vl/dq");
      if (!c.avx512_vnni) return no("CPU lacks avx512_vnni");
      if (!c.os_avx512) return no("OS does not save AVX-512 state (XCR0)");
      if (max_isa_cap() < IsaLevel::AVX512) return no(("capped by TESSERA_MAX_ISA=" + max_isa_cap_text()).c_str());
      break;
    case QIsa::AVX2:
      if (!(c.avx2 && c.fma && c.f16c)) return no("CPU lacks avx2/fma/f16c");
      if (!c.os_avx) return no("OS does not save AVX state (XCR0)");
      if (max_isa_cap() < IsaLevel::AVX2) return no(("capped by TESSERA_MAX_ISA=" + max_isa_cap_text()).c_str());
      break;
    default: break;
  }
  if (why) *why = "available";
  return true;
}

bool avx2_gemm_uses_avx_vnni() {
  return cpu_features().avx_vnni && tuning().avx_vnni.load(std::memory_order_relaxed) != 0 &&
         qisa_available(QIsa::AVX2, nullptr);
}

QIsa qisa_best() {
  if (qisa_available(QIsa::AMXInt8, nullptr)) return QIsa::AMXInt8;
  if (qisa_available(QIsa::AVX512VNNI, nullptr)) return QIsa::AVX512VNNI;
  if (qisa_available(QIsa::AVX2, nullptr)) return QIsa::AVX2;
  return QIsa::Reference;
}

}  // namespace tessera
