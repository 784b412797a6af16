// How a flash attention kernel splits one call into pool tasks (attention_flash.inc's AVX-512 kernels,
// attention_q8_avx512_vnni.cpp, attention_q8_avx2.cpp, attention_avx2.cpp). Portable: included before a file's ISA region.
//
// A task is one KV head x one block of query tokens (the g query heads of that KV head each: about rows_per_task
// rows) x one range of keys. Key ranges are whole key blocks, at least min_split_blocks each, until there are
// tasks_per_thread tasks per thread (flash-decoding: decode's one query block still keeps every thread busy); each
// split task leaves a partial of `slot` floats (per row: m, l, then hd accumulators) for the merge.
#pragma once
#include <algorithm>
#include <cstdint>

namespace tessera {

struct AttentionTasks {
  int64_t T, nkv, g, tokens_per_task, blocks, units, splits, blocks_per_split, slot;

  struct Task {
    int64_t split, h, t0, t1, rows;  // key range, KV head, query tokens [t0, t1), rows = (t1 - t0) * g
  };
  // Unit u (KV head x query block, the longest (last) query blocks first) and its key range `split`.
  Task of_unit(int64_t u, int64_t split) const {
    const int64_t qb = blocks - 1 - u / nkv, t0 = qb * tokens_per_task, t1 = std::min(T, t0 + tokens_per_task);
    return {split, u % nkv, t0, t1, (t1 - t0) * g};
  }
  Task of_task(int64_t task) const { return of_unit(task / splits, task % splits); }

  AttentionTasks(int64_t T, int64_t nh, int64_t nkv, int64_t hd, int64_t start, int threads, int64_t rows_per_task,
                 int64_t keys_per_block, int64_t min_split_blocks, int64_t tasks_per_thread)
      : T(T), nkv(nkv), g(nh / nkv), tokens_per_task(std::max<int64_t>(1, rows_per_task / g)) {
    blocks = (T + tokens_per_task - 1) / tokens_per_task;
    units = blocks * nkv;
    const int64_t key_blocks = (start + T + keys_per_block - 1) / keys_per_block;
    const int64_t wanted = (tasks_per_thread * threads + units - 1) / units;
    splits = std::max<int64_t>(1, std::min(wanted, key_blocks / min_split_blocks));
    blocks_per_split = (key_blocks + splits - 1) / splits;
    splits = (key_blocks + blocks_per_split - 1) / blocks_per_split;
    slot = std::min(T, tokens_per_task) * g * (hd + 2);
  }
};

}  // namespace tessera
