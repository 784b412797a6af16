// decode_layer_step (tessera/decode_layer.h): one decoder layer at T = 1 in one call. Portable: the heavy parts are the
// existing ISA kernels (quant_matvec_multi, dense_matvec, attention_bf16, quant_moe_forward or a packed backend's
// forward), each on the pool; what runs here on the caller's thread (norms, RoPE, the KV append, softmax / top-k) is
// O(H + nh*hd + E) scalar work.
#include "tessera/decode_layer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tessera/attention.h"
#include "tessera/attention_q8.h"
#include "tessera/bf16.h"
#include "tessera/dense.h"
#include "tessera/quant_decode.h"
#include "tessera/row_norm.h"
#include "tessera/step_profile.h"

namespace tessera {
namespace {

constexpr int64_t kF32Rows = 16;  // rows of an f32 weight per pool task

// out[n] = sum_j w[n, j] x[j], f32 weights: dense_matvec_f32_rows (one fixed summation order on every ISA).
void matvec_f32(const float* w, int64_t N, int64_t K, const float* x, float* out, ThreadPool& pool) {
  pool.parallel_for((N + kF32Rows - 1) / kF32Rows, [&](int64_t task, int) {
    const int64_t n0 = task * kF32Rows, n1 = std::min(N, n0 + kF32Rows);
    dense_matvec_f32_rows(w + n0 * K, n1 - n0, K, x, out + n0);
  });
}

// x [hd] in place: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x[half:], x[:half]) (engine.model.Rope.apply).
void rope(float* x, const float* cos, const float* sin, int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    const float lo_c = a * cos[i], lo_s = -b * sin[i], hi_c = b * cos[i + half], hi_s = a * sin[i + half];
    x[i] = lo_c + lo_s;
    x[i + half] = hi_c + hi_s;
  }
}

// probs = softmax(logits); ids/weights = the k largest, largest first (ties: the lower id), renormalised if asked.
void route(const float* logits, int64_t E, int64_t k, bool norm_topk, int64_t* ids, float* weights) {
  float mx = logits[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, logits[e]);
  std::vector<float> p(static_cast<size_t>(E));
  float sum = 0.0f;
  for (int64_t e = 0; e < E; ++e) sum += (p[size_t(e)] = std::exp(logits[e] - mx));
  for (int64_t e = 0; e < E; ++e) p[size_t(e)] /= sum;
  std::vector<char> taken(size_t(E), 0);
  float picked = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = 0;
    while (taken[size_t(best)]) ++best;  // k <= E: an untaken id exists, so ids stay in range even for NaN logits
    for (int64_t e = best + 1; e < E; ++e)
      if (!taken[size_t(e)] && p[size_t(e)] > p[size_t(best)]) best = e;
    taken[size_t(best)] = 1;
    ids[j] = best;
    weights[j] = p[size_t(best)];
    picked += weights[j];
  }
  if (norm_topk)
    for (int64_t j = 0; j < k; ++j) weights[j] /= picked;
}

// bf16 of one 16-bit weight kind as dense.h's WeightType.
WeightType dense_type(DecodeWeight::Kind kind) { return kind == DecodeWeight::Kind::F16 ? WeightType::F16 : WeightType::BF16; }

}  // namespace

void decode_matvec(const DecodeWeight& w, QIsa isa, const float* x, float* out, ThreadPool& pool) {
  switch (w.kind) {
    case DecodeWeight::Kind::Quant: {
      const QMatvecPart part{w.qtype, static_cast<const uint8_t*>(w.w), w.row_bytes, w.N, out};
      quant_matvec_multi(isa, x, w.K, &part, 1, pool);
      return;
    }
    case DecodeWeight::Kind::BF16:
    case DecodeWeight::Kind::F16:
      dense_matvec(DenseArgs{dense_type(w.kind), static_cast<const uint16_t*>(w.w), w.N, w.K, 1, x, out}, pool);
      return;
    case DecodeWeight::Kind::F32:
      matvec_f32(static_cast<const float*>(w.w), w.N, w.K, x, out, pool);
      return;
  }
}

void decode_layer_step(const DecodeLayerPlan& P, const DecodeStep& S, ThreadPool& pool) {
  prof::Recorder recorder(pool);  // TESSERA_PROFILE: phase timers (inactive inside decode_stack_step's)
  prof::mark(prof::kInputNorm);
  const int64_t H = P.H, nh = P.nh, nkv = P.nkv, hd = P.hd;
  const size_t nH = static_cast<size_t>(H), nq = static_cast<size_t>(nh * hd), nk = static_cast<size_t>(nkv * hd);
  std::vector<float> xn(nH), q(nq), k(nk), v(nk), att(nq), o(nH);
  rms_norm_row(S.x, P.input_norm, H, P.eps, xn.data());
  prof::mark(prof::kQkv);

  // q/k/v: the quantized ones in one dispatch with x quantized once (engine.dense.FusedMatvec), the 16-bit ones in
  // one dispatch too (dense_matvec_multi: bit-identical to one call each), f32 ones one by one.
  const DecodeWeight* qkv[3] = {&P.q, &P.k, &P.v};
  float* outs[3] = {q.data(), k.data(), v.data()};
  std::vector<QMatvecPart> parts;
  std::vector<DenseMatvecPart> parts16;
  for (int i = 0; i < 3; ++i) {
    const DecodeWeight& w = *qkv[i];
    if (w.kind == DecodeWeight::Kind::Quant)
      parts.push_back({w.qtype, static_cast<const uint8_t*>(w.w), w.row_bytes, w.N, outs[i]});
    else if (w.kind == DecodeWeight::Kind::F32)
      decode_matvec(w, P.isa, xn.data(), outs[i], pool);
    else
      parts16.push_back({dense_type(w.kind), static_cast<const uint16_t*>(w.w), w.N, outs[i]});
  }
  if (!parts.empty()) quant_matvec_multi(P.isa, xn.data(), H, parts.data(), int(parts.size()), pool);
  if (!parts16.empty()) dense_matvec_multi(parts16.data(), int(parts16.size()), xn.data(), H, pool);
  prof::mark(prof::kQkRopeKv);

  // Per-head q/k norms and RoPE; this position's K/V into the cache (bf16, nearest even, as torch's copy rounds; or
  // q8_0 blocks, as engine.kv_q8.quantize_q8_0 writes them).
  for (int64_t h = 0; h < nh; ++h) {
    float* qh = q.data() + h * hd;
    rms_norm_row(qh, P.q_norm, hd, P.eps, qh);
    rope(qh, S.cos, S.sin, hd);
  }
  const int64_t tiles = (S.C + 31) / 32, tile = S.start / 32, lane = S.start % 32;
  for (int64_t h = 0; h < nkv; ++h) {
    float* kh = k.data() + h * hd;
    rms_norm_row(kh, P.k_norm, hd, P.eps, kh);
    rope(kh, S.cos, S.sin, hd);
    if (S.k8) {
      write_q8_position(kh, v.data() + h * hd, h, S.start, hd, S.C, S.k8, S.ks, S.v8, S.vs);
      continue;
    }
    uint16_t* kdst = S.kt + ((h * tiles + tile) * hd) * 32 + lane;  // [h][tile][d][lane]
    uint16_t* vdst = S.v + (h * S.C + S.start) * hd;               // [h][start][d]
    for (int64_t d = 0; d < hd; ++d) {
      kdst[d * 32] = f32_to_bf16(kh[d]);
      vdst[d] = f32_to_bf16(v[size_t(h * hd + d)]);
    }
  }

  prof::mark(prof::kAttention);
  const float scale = float(std::pow(double(hd), -0.5));  // Python's hd**-0.5, then float as the binding takes it
  if (S.k8)
    attention_q8(AttentionQ8Args{q.data(), S.k8, S.ks, S.v8, S.vs, 1, nh, nkv, hd, S.C, S.start, scale, att.data()},
                 pool);
  else
    attention_bf16(AttentionArgs{q.data(), S.kt, S.v, 1, nh, nkv, hd, S.C, S.start, scale, att.data()}, pool);
  prof::mark(prof::kOProj);
  decode_matvec(P.o, P.isa, att.data(), o.data(), pool);
  prof::mark(prof::kPostNorm);
  for (int64_t i = 0; i < H; ++i) S.h[i] = S.x[i] + o[size_t(i)];
  rms_norm_row(S.h, P.post_norm, H, P.eps, S.normed);
  if (!P.has_router) return;

  const int64_t E = P.router.N;
  std::vector<float> logits(static_cast<size_t>(E));
  prof::mark(prof::kRouter);
  decode_matvec(P.router, P.isa, S.normed, logits.data(), pool);
  prof::mark(prof::kRoute);
  route(logits.data(), E, P.top_k, P.norm_topk, S.ids, S.weights);
  if (!S.experts) return;

  const DecodeExperts& X = *S.experts;
  std::vector<float> moe(static_cast<size_t>(H));
  if (X.packed_ops) {  // the backend's packed copy (a bf16 file's experts): its own T = 1 kernel
    prof::mark(prof::kMoePacked);
    X.packed_ops->forward(X.packed, 1, P.top_k, S.ids, S.weights, S.normed, moe.data(), pool);
  } else {
    const QMoeArgs a{X.E, H, X.I, 1, P.top_k, X.gate, X.up, X.down, S.ids, S.weights, S.normed, moe.data()};
    quant_moe_forward(X.isa, a, pool);  // marks its own phases (kMoeSetup ..)
  }
  prof::mark(prof::kResidual);
  for (int64_t i = 0; i < H; ++i) S.out[i] = S.h[i] + moe[size_t(i)];
  prof::mark(prof::kOther);
}

void decode_stack_step(const DecodeStackLayer* layers, int n, const float* x, const float* cos, const float* sin,
                       int64_t C, int64_t start, float* out, ThreadPool& pool) {
  if (n <= 0) return;
  prof::Recorder recorder(pool);  // TESSERA_PROFILE: phase timers over the whole stack
  const size_t nH = static_cast<size_t>(layers[0].plan->H);
  std::vector<float> h(nH), normed(nH), ping(nH), pong(nH);
  const float* cur = x;
  for (int i = 0; i < n; ++i) {
    const DecodeStackLayer& L = layers[i];
    DecodeStep s;
    s.x = cur;
    s.cos = cos;
    s.sin = sin;
    s.kt = L.kt;
    s.v = L.v;
    s.k8 = L.k8;
    s.ks = L.ks;
    s.v8 = L.v8;
    s.vs = L.vs;
    s.C = C;
    s.start = start;
    s.h = h.data();
    s.normed = normed.data();
    s.ids = L.ids;
    s.weights = L.weights;
    s.experts = L.experts;
    s.out = i == n - 1 ? out : (i % 2 ? pong.data() : ping.data());
    decode_layer_step(*L.plan, s, pool);
    std::fill(L.counts, L.counts + L.plan->router.N, int64_t(0));
    for (int64_t j = 0; j < L.plan->top_k; ++j) ++L.counts[L.ids[j]];
    cur = s.out;
  }
}

}  // namespace tessera
