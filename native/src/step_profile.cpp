// The decode step's phase timers (tessera/step_profile.h). Portable.
#include "tessera/step_profile.h"

#include <algorithm>
#include <chrono>
#include <mutex>

#include "tessera/tuning.h"

namespace tessera {
namespace prof {
namespace {

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch()).count());
}

std::mutex g_mu;
Totals g_totals;

}  // namespace

thread_local Recorder* t_recorder = nullptr;

const char* phase_name(Phase p) {
  static const char* const kNames[kPhases] = {
      "other",    "input_norm", "qkv",       "qk_rope_kv",  "attention", "o_proj",     "post_norm", "router",
      "route",    "moe_setup",  "moe_quant_x", "moe_gate_up", "moe_quant_act", "moe_down", "moe_reduce",
      "moe_packed", "residual"};
  return (p >= 0 && p < kPhases) ? kNames[p] : "?";
}

Recorder::Recorder(ThreadPool& pool) {
  // Only when profiling, only on a pool that keeps counters, and only the outermost recorder of this thread.
  if (!tuning().profile || !pool.profiling() || t_recorder) return;
  pool_ = &pool;
  t_recorder = this;
  acc_.threads = pool.size();
  start_ns_ = last_ns_ = now_ns();
  for (int i = 0; i < std::min(pool.size(), kMaxThreads); ++i) last_[i] = pool.stats(i);
}

void Recorder::snapshot(uint64_t now) {
  PhaseTotals& p = acc_.phase[cur_];
  p.wall_ns += now - last_ns_;
  p.marks += 1;
  last_ns_ = now;
  for (int i = 0; i < std::min(pool_->size(), kMaxThreads); ++i) {
    const ThreadPool::ThreadStats s = pool_->stats(i), &o = last_[i];
    p.busy_ns[i] += s.busy_ns - o.busy_ns;
    p.tail_ns += s.tail_ns - o.tail_ns;
    p.dispatches += s.dispatches - o.dispatches;
    p.wake_ns += s.wake_ns - o.wake_ns;
    p.joined += s.joined - o.joined;
    p.sleeps += s.sleeps - o.sleeps;
    last_[i] = s;
  }
}

void Recorder::mark(Phase next) {
  if (!pool_) return;
  snapshot(now_ns());
  cur_ = next;
}

Recorder::~Recorder() {
  if (!pool_) return;
  const uint64_t now = now_ns();
  snapshot(now);
  t_recorder = nullptr;
  std::lock_guard<std::mutex> lk(g_mu);
  g_totals.steps += 1;
  g_totals.step_ns += now - start_ns_;
  g_totals.threads = std::max(g_totals.threads, acc_.threads);
  for (int ph = 0; ph < kPhases; ++ph) {
    PhaseTotals &d = g_totals.phase[ph], &s = acc_.phase[ph];
    d.wall_ns += s.wall_ns;
    d.marks += s.marks;
    d.dispatches += s.dispatches;
    for (int i = 0; i < kMaxThreads; ++i) d.busy_ns[i] += s.busy_ns[i];
    d.tail_ns += s.tail_ns;
    d.wake_ns += s.wake_ns;
    d.joined += s.joined;
    d.sleeps += s.sleeps;
  }
}

Totals totals(bool reset) {
  std::lock_guard<std::mutex> lk(g_mu);
  Totals t = g_totals;
  if (reset) g_totals = Totals{};
  return t;
}

}  // namespace prof
}  // namespace tessera
