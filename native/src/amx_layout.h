// The AMX backends' packed layout (AMXInt8, AMXBF16 and their emulated twins), shared by packing, kernels and tests.
//
// Letters: N output rows of a weight matrix W[N, K] (nn.Linear layout), K inputs, Np/Kp padded, nb/kb tile indices,
// g K-group, G group size. A weight matrix is cut into B tiles of 16 rows x 64 bytes, n-block major:
//   int8: tile (nb, kb) holds q(W[nb*16 + n][kb*64 + 4r + q]) + 128 at row r, byte 4n + q   (K quads, unsigned:
//         TDPBSUD's B operand and the u8 operand of VPDPBUSD; the +128 is taken back once per (row, group) with the
//         activations' sum, so no per-weight correction is stored or computed)
//   bf16: tile (nb, kb) holds W[nb*16 + n][kb*32 + 2r + q] at row r, bytes 4n + 2q (K pairs, TDPBF16PS's B operand)
// so one tile row is also one 512-bit vector of 16 output lanes for the AVX-512 VNNI / FMA decode on the same bytes.
// K and N are zero-padded to whole tiles (the padded K bytes meet zero-padded activations; padded N lanes are never
// stored). int8 matrices are followed by fp32 scales [Nb][ng][16] (4 bytes per 64 weights: decode streams 6 % more
// than the int8 bytes).
//
// Blob: PackedHeader (64 B) | AmxHeader (64 B) | gate[E] | up[E] | down[E]; every matrix starts 64-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::amx {

enum class WeightFormat : int32_t { Int8 = 1, BF16 = 2 };

constexpr int kTileN = 16;          // output lanes per tile / per 512-bit vector
constexpr int kTileKInt8 = 64;      // int8 K per tile row block (16 quads)
constexpr int kTileKBF16 = 32;      // bf16 K per tile (16 pairs)
constexpr size_t kBTileBytes = 1024;

inline int64_t ceil_to(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Geometry of one packed weight matrix W[N, K].
struct MatLayout {
  WeightFormat fmt = WeightFormat::Int8;
  int64_t N = 0, K = 0, Np = 0, Kp = 0;
  int64_t nblocks = 0, kblocks = 0;
  int64_t group = 0, ngroups = 1;  // int8 only: G (a multiple of 64) and Kp / G
  size_t tile_bytes = 0, scale_offset = 0, bytes = 0;

  static MatLayout make(WeightFormat fmt, int64_t N, int64_t K, int64_t group_size) {
    MatLayout m;
    m.fmt = fmt;
    m.N = N;
    m.K = K;
    const int64_t tk = fmt == WeightFormat::Int8 ? kTileKInt8 : kTileKBF16;
    m.Np = ceil_to(N, kTileN);
    m.Kp = ceil_to(K, tk);
    if (fmt == WeightFormat::Int8) {
      // group_size <= 0 or >= K: one group (symmetric per output channel); else rounded up to whole tiles.
      m.group = (group_size <= 0 || group_size >= m.Kp) ? m.Kp : ceil_to(group_size, tk);
      m.Kp = ceil_to(m.Kp, m.group);
      m.ngroups = m.Kp / m.group;
    }
    m.nblocks = m.Np / kTileN;
    m.kblocks = m.Kp / tk;
    m.tile_bytes = static_cast<size_t>(m.nblocks * m.kblocks) * kBTileBytes;
    m.scale_offset = m.tile_bytes;
    const size_t side = fmt == WeightFormat::Int8 ? static_cast<size_t>(m.Np * m.ngroups) * 4 : 0;
    m.bytes = m.scale_offset + side;  // multiple of 64: Np is a multiple of 16
    return m;
  }
  int64_t kblocks_per_group() const { return group / kTileKInt8; }
  const uint8_t* tile(const uint8_t* mat, int64_t nb, int64_t kb) const {
    return mat + static_cast<size_t>(nb * kblocks + kb) * kBTileBytes;
  }
  const float* scales(const uint8_t* mat, int64_t nb) const {  // [ngroups][16] of n-block nb
    return reinterpret_cast<const float*>(mat + scale_offset) + nb * ngroups * kTileN;
  }
};

constexpr char kAmxMagic[8] = "TESSAM3";

// Second 64 bytes of the blob.
struct AmxHeader {
  char magic[8];      // kAmxMagic: "TESSAMX" + the AMX layout revision (bump on any change to this file's layout)
  int32_t format;     // WeightFormat
  int32_t group;      // int8 group size as requested (0 = per output channel)
  int64_t E, H, I;
  uint64_t gate_offset, up_offset, down_offset;  // from the start of the blob
};
static_assert(sizeof(AmxHeader) == 64, "AmxHeader is one cache line");

// Geometry of a whole packed layer.
struct LayerLayout {
  WeightFormat fmt;
  int64_t E = 0, H = 0, I = 0;
  MatLayout gate_up;  // [I, H]
  MatLayout down;     // [H, I]
  size_t gate_offset = 0, up_offset = 0, down_offset = 0, bytes = 0;

  static LayerLayout make(WeightFormat fmt, int64_t E, int64_t H, int64_t I, int64_t group) {
    LayerLayout l;
    l.fmt = fmt;
    l.E = E;
    l.H = H;
    l.I = I;
    l.gate_up = MatLayout::make(fmt, I, H, group);
    l.down = MatLayout::make(fmt, H, I, group);
    l.gate_offset = 128;
    l.up_offset = l.gate_offset + static_cast<size_t>(E) * l.gate_up.bytes;
    l.down_offset = l.up_offset + static_cast<size_t>(E) * l.gate_up.bytes;
    l.bytes = l.down_offset + static_cast<size_t>(E) * l.down.bytes;
    return l;
  }
  const uint8_t* gate(const uint8_t* blob, int64_t e) const { return blob + gate_offset + e * gate_up.bytes; }
  const uint8_t* up(const uint8_t* blob, int64_t e) const { return blob + up_offset + e * gate_up.bytes; }
  const uint8_t* down_mat(const uint8_t* blob, int64_t e) const { return blob + down_offset + e * down.bytes; }
};

}  // namespace tessera::amx
