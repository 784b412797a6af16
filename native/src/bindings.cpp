// The only file that includes nanobind: validates Python arguments (dtype, shape, contiguity, alignment) and converts
// them to pointers; every error names the argument. No kernel logic here.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <sys/mman.h>

#include "tessera/attention.h"  // attention over a bf16 KV cache (attention_bindings.inc)
#include "tessera/attention_q8.h"  // attention over a q8_0 KV cache (attention_q8_bindings.inc)
#include "tessera/backend.h"
#include "tessera/cpu.h"
#include "tessera/decode_layer.h"  // one decoder layer at T = 1 (decode_layer_bindings.inc)
#include "tessera/dense.h"
#include "tessera/pool.h"
#include "tessera/probe.h"
#include "tessera/quant.h"  // quantized GGUF kernels (quant_bindings.inc)
#include "tessera/quant_decode.h"  // fused decode mat-vecs (quant_decode_bindings.inc)
#include "tessera/row_norm.h"  // RMSNorm and residual adds over rows (row_norm_bindings.inc)
#include "tessera/step_profile.h"  // decode-step phase timers (decode_layer_bindings.inc)
#include "tessera/tuning.h"

namespace nb = nanobind;
using namespace tessera;

namespace {

using AnyArray = nb::ndarray<nb::device::cpu>;

std::string dtype_name(const nb::dlpack::dtype& dt) {
  const char* code = dt.code == uint8_t(nb::dlpack::dtype_code::Float)    ? "float"
                     : dt.code == uint8_t(nb::dlpack::dtype_code::Int)    ? "int"
                     : dt.code == uint8_t(nb::dlpack::dtype_code::UInt)   ? "uint"
                     : dt.code == uint8_t(nb::dlpack::dtype_code::Bfloat) ? "bfloat"
                                                                          : "other";
  return std::string(code) + std::to_string(int(dt.bits));
}

bool is(const AnyArray& a, nb::dlpack::dtype_code code, int bits) {
  return a.dtype().code == uint8_t(code) && a.dtype().bits == bits && a.dtype().lanes == 1;
}

void require_dtype(const char* arg, const AnyArray& a, nb::dlpack::dtype_code code, int bits, const char* want) {
  if (!is(a, code, bits)) throw nb::type_error((std::string(arg) + ": expected " + want + ", got " + dtype_name(a.dtype())).c_str());
}

void require_contiguous(const char* arg, const AnyArray& a) {
  int64_t expect = 1;
  for (int i = int(a.ndim()) - 1; i >= 0; --i) {
    if (a.shape(i) != 1 && a.stride(i) != expect)
      throw nb::value_error((std::string(arg) + ": must be C-contiguous").c_str());
    expect *= int64_t(a.shape(i));
  }
}

void require_shape(const char* arg, const AnyArray& a, std::initializer_list<int64_t> shape) {
  std::string want = "[", got = "[";
  bool ok = a.ndim() == shape.size();
  size_t i = 0;
  for (int64_t s : shape) {
    want += (i ? ", " : "") + (s < 0 ? std::string("*") : std::to_string(s));
    if (ok && s >= 0 && int64_t(a.shape(i)) != s) ok = false;
    ++i;
  }
  for (size_t j = 0; j < a.ndim(); ++j) got += (j ? ", " : "") + std::to_string(a.shape(j));
  if (!ok) throw nb::value_error((std::string(arg) + ": expected shape " + want + "], got " + got + "]").c_str());
}

void require_aligned(const char* arg, const void* p, size_t a) {
  if (reinterpret_cast<uintptr_t>(p) % a != 0)
    throw nb::value_error((std::string(arg) + ": must be " + std::to_string(a) + "-byte aligned").c_str());
}

// A backend handle: looked up by name once (engine.native keeps one per loaded model), so no call on it searches the
// registry again. Points into the registry, which lives as long as the process.
struct Backend {
  const BackendInfo* info;
  const BackendOps& ops() const { return *info->ops; }
};

Backend backend_named(const std::string& name) {
  const BackendInfo* b = find_backend(name);
  if (!b) throw nb::value_error(("backend: no backend named " + name + " is compiled in").c_str());
  return Backend{b};
}

WeightType dtype_named(const std::string& dtype) {
  if (dtype == "float32") return WeightType::F32;
  if (dtype == "float16") return WeightType::F16;
  if (dtype == "bfloat16") return WeightType::BF16;
  throw nb::value_error(("dtype: unknown " + dtype + " (expected float32, float16 or bfloat16)").c_str());
}

WeightType weight_type(const char* arg, const AnyArray& a) {
  if (is(a, nb::dlpack::dtype_code::Float, 32)) return WeightType::F32;
  if (is(a, nb::dlpack::dtype_code::Float, 16)) return WeightType::F16;
  if (is(a, nb::dlpack::dtype_code::Bfloat, 16)) return WeightType::BF16;
  throw nb::type_error((std::string(arg) + ": expected float32, float16 or bfloat16, got " + dtype_name(a.dtype())).c_str());
}

MoeDims packed_dims(const AnyArray& packed, const BackendOps& ops) {
  require_dtype("packed", packed, nb::dlpack::dtype_code::UInt, 8, "uint8");
  require_contiguous("packed", packed);
  require_aligned("packed", packed.data(), kAlign);
  if (packed.nbytes() < sizeof(PackedHeader)) throw nb::value_error("packed: too small to hold a header");
  WeightType src;
  MoeDims d = read_header(static_cast<const uint8_t*>(packed.data()), ops.name, &src);
  if (packed.nbytes() < ops.packed_bytes(d, src)) throw nb::value_error("packed: shorter than its header says");
  return d;
}

struct ForwardArgs {
  const BackendOps* ops;
  const uint8_t* packed;
  int64_t T, k;
  const int64_t* ids;
  const float* w;
  const float* x;
  float* out;
};

ForwardArgs check_forward(const Backend& b, const AnyArray& packed, const AnyArray& ids, const AnyArray& weights,
                          const AnyArray& x, const AnyArray& out) {
  if (!b.info->available) throw nb::value_error((std::string("backend ") + b.ops().name + ": " + b.info->reason).c_str());
  const BackendOps& ops = b.ops();
  MoeDims d = packed_dims(packed, ops);
  require_dtype("x", x, nb::dlpack::dtype_code::Float, 32, "float32");
  require_dtype("expert_ids", ids, nb::dlpack::dtype_code::Int, 64, "int64");
  require_dtype("weights", weights, nb::dlpack::dtype_code::Float, 32, "float32");
  require_dtype("out", out, nb::dlpack::dtype_code::Float, 32, "float32");
  require_shape("x", x, {-1, d.H});
  int64_t T = int64_t(x.shape(0));
  require_shape("expert_ids", ids, {T, -1});
  int64_t k = int64_t(ids.shape(1));
  require_shape("weights", weights, {T, k});
  require_shape("out", out, {T, d.H});
  for (auto [name, a] : {std::pair<const char*, const AnyArray*>{"x", &x}, {"expert_ids", &ids}, {"weights", &weights}, {"out", &out}}) {
    require_contiguous(name, *a);
    require_aligned(name, a->data(), 4);
  }
  const int64_t* p = static_cast<const int64_t*>(ids.data());
  for (int64_t i = 0; i < T * k; ++i)
    if (p[i] >= d.E) throw nb::value_error(("expert_ids: id " + std::to_string(p[i]) + " out of range for " + std::to_string(d.E) + " experts").c_str());
  return {&ops, static_cast<const uint8_t*>(packed.data()), T, k, p, static_cast<const float*>(weights.data()),
          static_cast<const float*>(x.data()), static_cast<float*>(out.data())};
}

// Dense mat-vec arguments: w [N, K] bf16/f16, x [T, K] f32, out [T, N] f32, all C-contiguous.
DenseArgs check_dense(const AnyArray& w, const AnyArray& x, const AnyArray& out) {
  WeightType t;
  if (is(w, nb::dlpack::dtype_code::Bfloat, 16)) t = WeightType::BF16;
  else if (is(w, nb::dlpack::dtype_code::Float, 16)) t = WeightType::F16;
  else throw nb::type_error(("w: expected bfloat16 or float16, got " + dtype_name(w.dtype())).c_str());
  if (w.ndim() != 2 || w.shape(0) == 0 || w.shape(1) == 0) throw nb::value_error("w: expected a non-empty 2-D [N, K] matrix");
  const int64_t N = int64_t(w.shape(0)), K = int64_t(w.shape(1));
  require_dtype("x", x, nb::dlpack::dtype_code::Float, 32, "float32");
  require_dtype("out", out, nb::dlpack::dtype_code::Float, 32, "float32");
  require_shape("x", x, {-1, K});
  const int64_t T = int64_t(x.shape(0));
  if (T == 0) throw nb::value_error("x: needs at least one row (token)");
  require_shape("out", out, {T, N});
  for (auto [name, a] : {std::pair<const char*, const AnyArray*>{"w", &w}, {"x", &x}, {"out", &out}}) {
    require_contiguous(name, *a);
    require_aligned(name, a->data(), name[0] == 'w' ? 2 : 4);
  }
  return {t, static_cast<const uint16_t*>(w.data()), N, K, T, static_cast<const float*>(x.data()), static_cast<float*>(out.data())};
}

nb::dict features_dict() {
  const CpuFeatures& f = cpu_features();
  nb::dict d;
  d["vendor"] = f.vendor;
  d["brand"] = f.brand;
  nb::dict flags;
#define FLAG(n) flags[#n] = f.n
  FLAG(sse42); FLAG(avx); FLAG(avx2); FLAG(fma); FLAG(f16c); FLAG(avx512f); FLAG(avx512bw); FLAG(avx512vl);
  FLAG(avx512dq); FLAG(avx512cd); FLAG(avx512_vnni); FLAG(avx512_bf16); FLAG(avx512_fp16); FLAG(avx_vnni);
  FLAG(amx_tile); FLAG(amx_int8); FLAG(amx_bf16);
#undef FLAG
  d["flags"] = flags;
  d["xcr0"] = f.xcr0;
  d["os_avx"] = f.os_avx;
  d["os_avx512"] = f.os_avx512;
  d["os_amx"] = f.os_amx;
  d["amx_requested"] = f.amx_requested;
  d["amx_perm_rc"] = f.amx_perm_rc;
  d["amx_perm_errno"] = f.amx_perm_errno;
  d["amx_permitted"] = f.amx_permitted;
  d["amx_reason"] = f.amx_reason;
  d["logical_cpus"] = f.logical_cpus;
  d["physical_cores"] = f.physical_cores;
  d["max_isa"] = max_isa_cap_text();
  return d;
}

nb::list backends_list() {
  nb::list out;
  for (const auto& b : backends()) {
    nb::dict d;
    d["name"] = b.ops->name;
    d["available"] = b.available;
    d["reason"] = b.reason;
    d["emulated"] = b.ops->emulated;
    d["isa_level"] = isa_level_name(b.ops->level);
    d["priority"] = b.ops->priority;
    d["weights"] = b.ops->weights;
    d["description"] = b.ops->description;
    out.append(d);
  }
  return out;
}

// A 64-byte (in fact 2 MiB for large blobs, for transparent huge pages) aligned uint8 buffer owned by a capsule.
nb::ndarray<nb::numpy, uint8_t> aligned_empty(size_t nbytes) {
  size_t align = nbytes >= (size_t(8) << 20) ? (size_t(2) << 20) : 4096;
  void* p = nullptr;
  if (posix_memalign(&p, align, nbytes ? nbytes : 1) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (align > 4096) madvise(p, nbytes, MADV_HUGEPAGE);
#endif
  nb::capsule owner(p, [](void* q) noexcept { std::free(q); });
  size_t shape[1] = {nbytes};
  return nb::ndarray<nb::numpy, uint8_t>(p, 1, shape, owner);
}

#include "quant_bindings.inc"  // quantized GGUF kernels: bind_quant(m)
#include "attention_bindings.inc"  // attention over a bf16 KV cache: bind_attention(m)
#include "attention_q8_bindings.inc"  // attention over a q8_0 KV cache: bind_attention_q8(m)
#include "quant_decode_bindings.inc"  // fused decode mat-vecs: bind_quant_decode(m)
#include "decode_layer_bindings.inc"  // one decoder layer at T = 1: bind_decode_layer(m)
#include "row_norm_bindings.inc"  // RMSNorm and residual adds over rows: bind_row_norm(m)

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "Tessera CPU kernels: MoE experts per backend, packing, CPU probe, thread pool";
  m.attr("LAYOUT_VERSION") = kLayoutVersion;
  m.attr("ALIGN") = kAlign;

  nb::class_<ThreadPool>(m, "Pool")
      .def(nb::init<int>(), nb::arg("threads"))
      .def_prop_ro("size", &ThreadPool::size)
      .def("sync", [](ThreadPool& p) {
        nb::gil_scoped_release nogil;
        p.sync();
      });

  m.def("cpu_features", &features_dict, "CPUID flags, XCR0 bits, the AMX permission request and its result, core counts.");
  m.def("backends", &backends_list, "Every compiled backend: name, available, reason, emulated, isa_level, priority.");
  m.def("auto_backend", []() -> nb::object {
    const BackendInfo* b = auto_backend();
    if (!b) return nb::none();
    return nb::make_tuple(std::string(b->ops->name), b->reason);
  });
  m.def("aligned_empty", &aligned_empty, nb::arg("nbytes"));

  nb::class_<Backend>(m, "Backend", "One compiled backend, looked up once by name with backend(name).")
      .def_prop_ro("name", [](const Backend& b) { return std::string(b.ops().name); })
      .def_prop_ro("available", [](const Backend& b) { return b.info->available; })
      .def_prop_ro("reason", [](const Backend& b) { return b.info->reason; })
      .def_prop_ro("emulated", [](const Backend& b) { return b.ops().emulated; })
      .def_prop_ro("weights", [](const Backend& b) { return std::string(b.ops().weights); })
      .def_prop_ro("description", [](const Backend& b) { return std::string(b.ops().description); })
      .def("packed_bytes", [](const Backend& b, int64_t E, int64_t H, int64_t I, const std::string& dtype) {
        WeightType t = dtype_named(dtype);
        if (E <= 0 || H <= 0 || I <= 0) throw nb::value_error("dims: E, H, I must be positive");
        return b.ops().packed_bytes(MoeDims{E, H, I}, t);
      }, nb::arg("E"), nb::arg("H"), nb::arg("I"), nb::arg("dtype"))
      .def("pack", [](const Backend& b, const AnyArray& gate, const AnyArray& up, const AnyArray& down,
                      const AnyArray& out, ThreadPool& pool) {
        const BackendOps& ops = b.ops();
        WeightType t = weight_type("gate", gate);
        if (weight_type("up", up) != t) throw nb::type_error("up: dtype differs from gate");
        if (weight_type("down", down) != t) throw nb::type_error("down: dtype differs from gate");
        if (gate.ndim() != 3) throw nb::value_error("gate: expected shape [E, I, H]");
        MoeDims d{int64_t(gate.shape(0)), int64_t(gate.shape(2)), int64_t(gate.shape(1))};
        require_shape("up", up, {d.E, d.I, d.H});
        require_shape("down", down, {d.E, d.H, d.I});
        for (auto [name, a] : {std::pair<const char*, const AnyArray*>{"gate", &gate}, {"up", &up}, {"down", &down}})
          require_contiguous(name, *a);
        require_dtype("out", out, nb::dlpack::dtype_code::UInt, 8, "uint8");
        require_contiguous("out", out);
        require_aligned("out", out.data(), kAlign);
        size_t need = ops.packed_bytes(d, t);
        if (out.nbytes() < need)
          throw nb::value_error(("out: needs " + std::to_string(need) + " bytes, got " + std::to_string(out.nbytes())).c_str());
        WeightsIn w{t, gate.data(), up.data(), down.data()};
        uint8_t* dst = static_cast<uint8_t*>(out.data());
        nb::gil_scoped_release nogil;
        ops.pack(d, w, dst, pool);
      }, nb::arg("gate"), nb::arg("up"), nb::arg("down"), nb::arg("out"), nb::arg("pool"))
      .def("packed_dims", [](const Backend& b, const AnyArray& packed) {
        MoeDims d = packed_dims(packed, b.ops());
        return std::make_tuple(d.E, d.H, d.I);
      }, nb::arg("packed"), "(E, H, I) from the blob's header, after checking it is this backend's and whole.")
      .def("unpack", [](const Backend& b, const AnyArray& packed, int64_t expert) {
        const BackendOps& ops = b.ops();
        MoeDims d = packed_dims(packed, ops);
        if (expert < 0 || expert >= d.E) throw nb::value_error(("expert: " + std::to_string(expert) + " out of range").c_str());
        auto make = [](size_t r, size_t c) {
          float* p = new float[r * c];
          nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<float*>(q); });
          size_t shape[2] = {r, c};
          return nb::ndarray<nb::numpy, float>(p, 2, shape, owner);
        };
        auto g = make(d.I, d.H), u = make(d.I, d.H), dn = make(d.H, d.I);
        ops.unpack(static_cast<const uint8_t*>(packed.data()), expert, g.data(), u.data(), dn.data());
        return std::make_tuple(g, u, dn);
      }, nb::arg("packed"), nb::arg("expert"))
      .def("forward", [](const Backend& b, const AnyArray& packed, const AnyArray& ids, const AnyArray& weights,
                         const AnyArray& x, const AnyArray& out, ThreadPool& pool) {
        ForwardArgs a = check_forward(b, packed, ids, weights, x, out);
        nb::gil_scoped_release nogil;
        a.ops->forward(a.packed, a.T, a.k, a.ids, a.w, a.x, a.out, pool);
      }, nb::arg("packed"), nb::arg("expert_ids"), nb::arg("weights"), nb::arg("x"), nb::arg("out"), nb::arg("pool"),
         "out[t] = sum_j weights[t,j] * expert_{expert_ids[t,j]}(x[t]); ids < 0 are skipped.")
      .def("forward_submit", [](const Backend& b, const AnyArray& packed, const AnyArray& ids, const AnyArray& weights,
                                const AnyArray& x, const AnyArray& out, ThreadPool& pool) {
        ForwardArgs a = check_forward(b, packed, ids, weights, x, out);
        ThreadPool* p = &pool;
        pool.submit([a, p] { a.ops->forward(a.packed, a.T, a.k, a.ids, a.w, a.x, a.out, *p); });
      }, nb::arg("packed"), nb::arg("expert_ids"), nb::arg("weights"), nb::arg("x"), nb::arg("out"), nb::arg("pool"),
         "As forward, but returns at once; pool.sync() waits. The caller keeps the arrays alive until then.");
  m.def("backend", &backend_named, nb::arg("name"), "The handle of a compiled backend; ValueError for an unknown name.");

  m.def("tuning", []() {
    const Tuning& t = tuning();
    nb::dict d;
    d["max_isa"] = t.max_isa;
    d["int8_group"] = t.int8_group;
    d["prefetch_bytes"] = t.prefetch_bytes.load();
    d["spin_us"] = t.spin_us.load();
    d["profile"] = t.profile;
    d["amx_tile_min_rows"] = t.amx_tile_min_rows.load();
    d["dense_native_max_tokens"] = t.dense_native_max_tokens;
    d["dense_quant_max_tokens"] = t.dense_quant_max_tokens;
    d["avx2_gemm_min_tokens"] = t.avx2_gemm_min_tokens.load();
    d["quant_moe_chunk_tokens"] = t.quant_moe_chunk_tokens.load();
    d["vnni_gemm_min_tokens"] = t.vnni_gemm_min_tokens.load();
    d["decode_rows"] = t.decode_rows.load();
    d["decode_streams"] = t.decode_streams.load();
    d["avx_vnni"] = t.avx_vnni.load();
    d["invalid"] = t.invalid;
    d["from_environment"] = t.from_environment;
    return d;
  }, "Every TESSERA_* tuning knob as the kernels use it (read once per process; tessera/tuning.h).");
  m.def("set_amx_tile_min_rows", [](int64_t rows) {
    if (rows < 0) throw nb::value_error("rows: must be >= 0 (0: the per-format default)");
    return tuning().amx_tile_min_rows.exchange(rows);
  }, nb::arg("rows"), "Tests: force the AMX tile path (1), the vector path (huge) or the per-format default (0); "
     "returns the previous value.");
  m.def("set_amx_int8_bf16_min_rows", [](int64_t rows) {
    if (rows < -1) throw nb::value_error("rows: must be >= -1 (-1: the kernel's default, 0: never)");
    return tuning().amx_int8_bf16_min_rows.exchange(rows);
  }, nb::arg("rows"), "Tests: AMXInt8 pieces with at least this many rows on bf16 tiles over dequantized weights "
     "(-1: the kernel's default, 0: never); returns the previous value.");
  m.def("set_tuning_knob", [](const std::string& name, int64_t value) -> int64_t {
    Tuning& t = tuning();
    if (name == "prefetch_bytes") {
      if (value < -1) throw nb::value_error("prefetch_bytes: must be >= 0 (or -1: the kernel's default)");
      return t.prefetch_bytes.exchange(value);
    }
    if (name == "spin_us") {
      if (value < 0 || value > 100000) throw nb::value_error("spin_us: must be 0..100000");
      return t.spin_us.exchange(int(value));
    }
    if (name == "amx_tile_min_rows") {
      if (value < 0) throw nb::value_error("amx_tile_min_rows: must be >= 0 (0: the per-format default)");
      return t.amx_tile_min_rows.exchange(value);
    }
    if (name == "quant_moe_chunk_tokens") {
      if (value < 0) throw nb::value_error("quant_moe_chunk_tokens: must be >= 0 (0: the kernels' default, 2048)");
      return t.quant_moe_chunk_tokens.exchange(value);
    }
    if (name == "vnni_gemm_min_tokens") {
      if (value < 0) throw nb::value_error("vnni_gemm_min_tokens: must be >= 0 (0: the kernels' default)");
      return t.vnni_gemm_min_tokens.exchange(value);
    }
    if (name == "decode_rows") {
      if (value < 0) throw nb::value_error("decode_rows: must be >= 0 (0: about 256 KiB of blocks a task)");
      return t.decode_rows.exchange(value);
    }
    if (name == "decode_streams") {
      if (value < 0 || value > 2)
        throw nb::value_error("decode_streams: must be 0 (the CPU's default), 1 or 2");
      return t.decode_streams.exchange(value);
    }
    if (name == "avx2_gemm_min_tokens") {
      if (value < 0) throw nb::value_error("avx2_gemm_min_tokens: must be >= 0 (0: the kernels' per-type default)");
      return t.avx2_gemm_min_tokens.exchange(value);
    }
    if (name == "avx_vnni") {
      if (value != 0 && value != 1) throw nb::value_error("avx_vnni: must be 0 (vpmaddubsw) or 1 (AVX-VNNI where present)");
      return t.avx_vnni.exchange(value);
    }
    throw nb::value_error(("set_tuning_knob: no runtime knob " + name +
                           " (prefetch_bytes, spin_us, amx_tile_min_rows, quant_moe_chunk_tokens, "
                           "vnni_gemm_min_tokens, decode_rows, decode_streams, avx2_gemm_min_tokens, avx_vnni)").c_str());
  }, nb::arg("name"), nb::arg("value"),
     "Calibration (tessera/engine/tuned.py): set one runtime knob, returns the previous value. Does not look at the "
     "environment: the caller skips the knobs tuning()['from_environment'] names.");

  m.def("dense_kernel", []() { return std::string(dense_kernel_name()); },
        "The dense mat-vec kernel this CPU runs under TESSERA_MAX_ISA: AVX512, AVX2 or Reference.");
  m.def("dense_matvec", [](const AnyArray& w, const AnyArray& x, const AnyArray& out, ThreadPool& pool, bool reference) {
    DenseArgs a = check_dense(w, x, out);
    nb::gil_scoped_release nogil;
    if (reference) dense_matvec_reference(a, pool); else dense_matvec(a, pool);
  }, nb::arg("w"), nb::arg("x"), nb::arg("out"), nb::arg("pool"), nb::arg("reference") = false,
     "out[T, N] = x[T, K] . w[N, K]^T; w bf16/f16 widened exactly, f32 accumulation (reference: scalar, double).");
  m.def("dense_matvec_multi", [](const std::vector<AnyArray>& ws, const AnyArray& x, const std::vector<AnyArray>& outs,
                                 ThreadPool& pool) {
    if (ws.empty()) throw nb::value_error("ws: needs at least one weight");
    if (ws.size() != outs.size())
      throw nb::value_error(("outs: one per weight: got " + std::to_string(outs.size()) + " outputs for " +
                             std::to_string(ws.size()) + " weights").c_str());
    std::vector<DenseMatvecPart> parts;
    for (size_t i = 0; i < ws.size(); ++i) {
      DenseArgs a = check_dense(ws[i], x, outs[i]);
      if (a.T != 1) throw nb::value_error("x: dense_matvec_multi takes one token, x [1, K]");
      parts.push_back({a.type, a.w, a.N, a.out});
    }
    const int64_t K = int64_t(x.shape(1));
    const float* xp = static_cast<const float*>(x.data());
    nb::gil_scoped_release nogil;
    dense_matvec_multi(parts.data(), int(parts.size()), xp, K, pool);
  }, nb::arg("ws"), nb::arg("x"), nb::arg("outs"), nb::arg("pool"),
     "One token through several bf16/f16 matrices in one dispatch: outs[i][1, N_i] = x[1, K] . ws[i][N_i, K]^T, "
     "bit-identical to dense_matvec on each.");
  m.def("dense_gemm_bf16_available", []() { return dense_gemm_bf16_available(); },
        "Whether dense_gemm_bf16 runs here: the CPU has avx512_bf16 and TESSERA_MAX_ISA allows AVX-512.");
  m.def("dense_gemm_bf16_amx_available", []() { return dense_gemm_bf16_amx_available(); },
        "Whether dense_gemm_bf16 runs its products on AMX bf16 tiles here (tiles='auto' takes them).");
  m.def("dense_gemm_bf16", [](const AnyArray& w, const AnyArray& x, const AnyArray& out, ThreadPool& pool,
                              const std::string& tiles) {
    DenseArgs a = check_dense(w, x, out);
    if (a.type != WeightType::BF16) throw nb::type_error("w: the bf16 GEMM takes bfloat16 weights, got float16");
    if (!dense_gemm_bf16_available())
      throw std::runtime_error("dense_gemm_bf16: this CPU (or TESSERA_MAX_ISA) has no avx512_bf16");
    DenseTiles mode;
    if (tiles == "auto") mode = DenseTiles::Auto;
    else if (tiles == "vector") mode = DenseTiles::Vector;
    else if (tiles == "amx") mode = DenseTiles::Amx;
    else if (tiles == "emulated") mode = DenseTiles::AmxEmulated;
    else throw nb::value_error(("tiles: 'auto', 'vector', 'amx' or 'emulated', got '" + tiles + "'").c_str());
    nb::gil_scoped_release nogil;
    dense_gemm_bf16(a, pool, mode);
  }, nb::arg("w"), nb::arg("x"), nb::arg("out"), nb::arg("pool"), nb::arg("tiles") = "auto",
     "Prefill: out[T, N] = bf16(x)[T, K] . w[N, K]^T; w bf16 as stored, f32 sums. tiles: 'auto' (AMX bf16 tiles "
     "where granted, else vdpbf16ps), 'vector' (vdpbf16ps), 'amx' (an error where not granted), 'emulated' (the tile "
     "emulator, the same bits as 'amx').");

  m.def("dense_gemm_f32_available", []() { return dense_gemm_f32_available(); },
        "Whether dense_gemm_f32 runs here: the CPU has avx2/fma/f16c and TESSERA_MAX_ISA allows AVX2.");
  m.def("dense_gemm_f32", [](const AnyArray& w, const AnyArray& x, const AnyArray& out, ThreadPool& pool) {
    DenseArgs a = check_dense(w, x, out);
    if (!dense_gemm_f32_available())
      throw std::runtime_error("dense_gemm_f32: this CPU (or TESSERA_MAX_ISA) has no AVX2");
    nb::gil_scoped_release nogil;
    dense_gemm_f32(a, pool);
  }, nb::arg("w"), nb::arg("x"), nb::arg("out"), nb::arg("pool"),
     "Prefill where the CPU has no avx512_bf16: out[T, N] = x[T, K] . w[N, K]^T; w bf16/f16 widened exactly to f32, x "
     "in f32, f32 FMA sums in K order.");

  bind_quant(m);  // quantized GGUF kernels (quant_bindings.inc)
  bind_attention(m);  // attention over a bf16 KV cache (attention_bindings.inc)
  bind_attention_q8(m);  // attention over a q8_0 KV cache (attention_q8_bindings.inc)
  bind_quant_decode(m);  // quant_matvec_multi (quant_decode_bindings.inc)
  bind_decode_layer(m);  // DecodeLayer, QuantMoeLayer (decode_layer_bindings.inc)
  bind_row_norm(m);  // rms_norm_rows, add_rows (row_norm_bindings.inc)

  m.def("read_bandwidth", [](ThreadPool& pool, double buffer_mib, double seconds) {
    nb::gil_scoped_release nogil;
    return read_bandwidth_gbs(pool, buffer_mib, seconds);
  }, nb::arg("pool"), nb::arg("buffer_mib") = 1024.0, nb::arg("seconds") = 1.0);
  m.def("peak_gflops", [](ThreadPool& pool, const std::string& what, double seconds) {
    nb::gil_scoped_release nogil;
    return peak_gflops(pool, what.c_str(), seconds);
  }, nb::arg("pool"), nb::arg("what"), nb::arg("seconds") = 0.5);
  m.def("amx_overlap", [](int fma_blocks, int64_t items) {
    AmxOverlapNs r;
    {
      nb::gil_scoped_release nogil;
      r = amx_overlap(fma_blocks, items);
    }
    nb::dict d;
    d["tiles_ns"] = r.tiles_ns;
    d["vector_ns"] = r.vector_ns;
    d["after_ns"] = r.after_ns;
    d["spread_ns"] = r.spread_ns;
    return d;
  }, nb::arg("fma_blocks"), nb::arg("items") = 20000);
}
