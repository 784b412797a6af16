// Per-phase, per-thread timers inside the native one-call decode step (decode_layer_step / decode_stack_step), on with
// TESSERA_PROFILE (tessera/tuning.h), read by engine.native.decode_profile() (scripts/profile_decode.py --phases).
//
// Off (the default) it costs one thread_local pointer test per phase boundary and, in the pool, one bool test per job:
// no clock is read. On, the step's caller thread marks each phase boundary (prof::mark); a mark reads the clock and the
// pool's per-thread counters (ThreadPool::ThreadStats: time inside jobs, the wait for the other threads at the end of
// a job, workers' wake-up latency, sleeps) and adds the differences since the previous mark to the phase that ended.
// So per phase: the caller's wall time, and for each pool thread how much of it was spent working, waiting at the
// job's end (the caller) or not in a job at all (a worker: asleep, spinning, or late to wake).
#pragma once
#include <cstdint>

#include "tessera/pool.h"

namespace tessera {
namespace prof {

enum Phase : int {
  kOther = 0,      // the stack's own bookkeeping between layers, counts
  kInputNorm,      // input RMSNorm
  kQkv,            // q/k/v mat-vecs (activation quantization included)
  kQkRopeKv,       // per-head q/k norms, RoPE, the K/V append
  kAttention,      // attention over the cache
  kOProj,          // o_proj
  kPostNorm,       // residual + post-attention RMSNorm
  kRouter,         // the router mat-vec
  kRoute,          // softmax / top-k
  kMoeSetup,       // quant_moe_forward: scratch, routing slots
  kMoeQuantX,      // the experts' input row quantized
  kMoeGateUp,      // gate/up mat-vecs + SiLU
  kMoeQuantAct,    // the k activation rows quantized
  kMoeDown,        // down mat-vecs
  kMoeReduce,      // the weighted sum of the k rows
  kMoePacked,      // a backend's packed forward (bf16 files), one phase
  kResidual,       // the second residual
  kPhases
};

const char* phase_name(Phase p);

constexpr int kMaxThreads = 64;  // threads beyond are folded into the last slot

// Totals since the last reset (all steps of all pools that ran with a recorder).
struct PhaseTotals {
  uint64_t wall_ns = 0;       // the caller's wall time in the phase
  uint64_t marks = 0;         // how often the phase ran
  uint64_t dispatches = 0;    // pool jobs published (parallel_for / run with a worker to wake)
  uint64_t busy_ns[kMaxThreads] = {};  // per pool thread (0 = the caller): time inside jobs
  uint64_t tail_ns = 0;       // the caller: waiting for workers after its own share
  uint64_t wake_ns = 0;       // workers: publish -> job start, summed over the jobs they joined
  uint64_t joined = 0;        // workers: jobs joined
  uint64_t sleeps = 0;        // workers: times they fell asleep on the condition variable
};

struct Totals {
  uint64_t steps = 0;  // recorder lifetimes (one per decode_stack_step / decode_layer_step call)
  uint64_t step_ns = 0;
  int threads = 0;     // the largest pool size seen
  PhaseTotals phase[kPhases];
};

// The caller's recorder for one step on one pool: construct at the step's start (does nothing unless
// tuning().profile), mark() phase boundaries (any code on the same thread, via prof::mark), destroy at the end (merges
// into the process-wide totals under a mutex).
class Recorder {
 public:
  explicit Recorder(ThreadPool& pool);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  void mark(Phase next);

 private:
  void snapshot(uint64_t now);
  ThreadPool* pool_ = nullptr;
  Recorder* outer_ = nullptr;  // a nested recorder (decode_layer_step inside decode_stack_step) defers to the outer
  Phase cur_ = kOther;
  uint64_t start_ns_ = 0, last_ns_ = 0;
  ThreadPool::ThreadStats last_[kMaxThreads];
  Totals acc_;
};

extern thread_local Recorder* t_recorder;

// Ends the current phase on this thread's recorder and starts `next`; nothing without a recorder.
inline void mark(Phase next) {
  if (t_recorder) t_recorder->mark(next);
}

// A copy of the totals; reset: zero them after copying.
Totals totals(bool reset);

}  // namespace prof
}  // namespace tessera
