// quant_matvec_multi (tessera/quant_decode.h): a decode step's mat-vecs that share one activation row, in one pool
// dispatch. quant_matmul at T = 1 is this function with one part where the ISA has dot_direct; elsewhere (Reference's
// 4-row tiles) per row group exactly what quant_matmul does, so the outputs equal separate quant_matmul calls bit for
// bit; what it saves is two activation quantizations, two pool wake-ups and two Python calls per layer.
#include "tessera/quant_decode.h"

#include <algorithm>
#include <vector>

#include "quant_kernels.h"

namespace tessera {
namespace {

const quant::Kernels& decode_kernels(QIsa isa) {
  switch (isa) {
    case QIsa::AMXInt8:
    case QIsa::AMXInt8Emu:  // decode is the AVX-512 VNNI mat-vec on every AMX CPU
    case QIsa::AVX512VNNI: return quant::kernels_avx512_vnni();
    case QIsa::AVX2: return quant::kernels_avx2();
    default: return quant::kernels_reference();
  }
}

}  // namespace

void quant_matvec_multi(QIsa isa, const float* x, int64_t K, const QMatvecPart* parts, int n_parts, ThreadPool& pool) {
  using quant::kRowGroup;
  using quant::kTileRows;
  const quant::Kernels& kr = decode_kernels(isa);
  // The activation row, Q8_K-style (quant_kernels.h): q [Kq], d256 [Kq/256], bs16 [S16], s16 [S16].
  const int64_t Kq = quant::padded_k256(K), S16 = quant::padded_s16(K), Kp = quant::padded_k(K);
  std::vector<int8_t> q(static_cast<size_t>(Kq));
  std::vector<float> d256(static_cast<size_t>(Kq / 256)), s16(static_cast<size_t>(S16));
  std::vector<int16_t> bs16(static_cast<size_t>(S16));
  kr.quantize_row(x, K, q.data(), d256.data(), bs16.data(), s16.data());
  const quant::ActRow xr{q.data(), d256.data(), bs16.data(), s16.data()};

  // Rows per task, per part: kRowGroup, or with dot_direct ~kDecodeTaskBytes of blocks (quant::decode_task_rows).
  std::vector<int64_t> rows(static_cast<size_t>(n_parts));
  for (int p = 0; p < n_parts; ++p) rows[size_t(p)] = kr.dot_direct ? quant::decode_task_rows(parts[p].row_bytes) : kRowGroup;
  std::vector<int64_t> start(size_t(n_parts) + 1, 0);  // first task of each part
  for (int p = 0; p < n_parts; ++p)
    start[size_t(p) + 1] = start[size_t(p)] + (parts[p].N + rows[size_t(p)] - 1) / rows[size_t(p)];
  // The tile path's per-thread scratch (ISAs without dot_direct): codes, A per 4 values, B per 16.
  struct Tile {
    std::vector<uint8_t> u;
    std::vector<float> a4, b16;
  };
  std::vector<Tile> tiles(kr.dot_direct ? 0 : size_t(pool.size()));
  for (auto& t : tiles) {
    t.u.resize(size_t(kTileRows * Kp));
    t.a4.resize(size_t(kTileRows * Kp / 4));
    t.b16.resize(size_t(kTileRows * S16));
  }
  pool.parallel_for(start.back(), [&](int64_t task, int ith) {
    const size_t pi = size_t(std::upper_bound(start.begin(), start.end(), task) - start.begin() - 1);
    const QMatvecPart& P = parts[pi];
    const int64_t n0 = (task - start[pi]) * rows[pi], n1 = std::min(P.N, n0 + rows[pi]);
    if (kr.dot_direct) {
      float res[quant::kDecodeMaxRows];
      kr.dot_direct(P.type, P.w + n0 * P.row_bytes, P.row_bytes, int(n1 - n0), K, &xr, 1, res);
      std::copy(res, res + (n1 - n0), P.out + n0);
      return;
    }
    Tile& t = tiles[size_t(ith)];
    const bool wide = qtype_info(P.type).wide;
    for (int64_t r0 = n0; r0 < n1; r0 += kTileRows) {
      const int R = int(std::min<int64_t>(kTileRows, n1 - r0));
      kr.unpack_rows(P.type, P.w + r0 * P.row_bytes, P.row_bytes, R, K, t.u.data(), t.a4.data(), t.b16.data());
      kr.dot_rows(t.u.data(), t.a4.data(), t.b16.data(), R, K, xr, wide, P.out + r0);
    }
  });
}

}  // namespace tessera
