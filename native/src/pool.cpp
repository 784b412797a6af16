// ThreadPool: the only place threads are created. Workers spin a few tens of microseconds after a job (cheap hand-off
// between the back-to-back phases of a MoE layer), then sleep on a condition variable so they never compete with the
// caller's own work (torch attention between layers) on a small machine.
#include "tessera/pool.h"
#include "tessera/tuning.h"

#include <chrono>
#include <cstdlib>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TESSERA_PAUSE() _mm_pause()
#else
#define TESSERA_PAUSE() ((void)0)
#endif

namespace tessera {
namespace {

int spin_microseconds() { return tuning().spin_us.load(std::memory_order_relaxed); }

// TESSERA_PROFILE only (ThreadPool::stats): the clock, and a counter only its own thread writes.
uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch()).count());
}
void add(std::atomic<uint64_t>& a, uint64_t v) { a.store(a.load(std::memory_order_relaxed) + v, std::memory_order_relaxed); }

}  // namespace

ThreadPool::ThreadPool(int nthreads)
    : nthreads_(nthreads < 1 ? 1 : nthreads), profile_(tuning().profile), slots_(new StatSlot[size_t(nthreads_)]) {
  for (int i = 1; i < nthreads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(lead_mu_);
    lead_stop_ = true;
  }
  lead_cv_.notify_all();
  if (lead_.joinable()) lead_.join();
  stop_.store(true);
  generation_.fetch_add(2);
  {
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }
  for (auto& t : workers_) t.join();
}

// generation_ = (count << 1) | optional. A run()/ALL job needs every worker: the caller waits on pending_. An
// optional job (parallel_for) needs none: a worker joins only while open_ is set, and the caller, once the tasks are
// gone, closes it and waits only for workers that joined (entered_). So a worker the OS has not scheduled yet never
// holds the caller up, which on a shared 2-core machine is the difference between waiting microseconds and a time slice.
void ThreadPool::worker_loop(int ith) {
  uint64_t seen = 0;
  for (;;) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_microseconds());
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      TESSERA_PAUSE();
      if (++spins % 64 == 0 && std::chrono::steady_clock::now() > deadline) {
        if (profile_) add(slots_[size_t(ith)].sleeps, 1);
        sleepers_.fetch_add(1);
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return generation_.load() != seen; });
        sleepers_.fetch_sub(1);
        break;
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    const bool optional = seen & 1;
    if (optional) {
      entered_.fetch_add(1);
      if (!open_.load()) {  // closed already (or between jobs): nothing to do
        entered_.fetch_sub(1);
        continue;
      }
    }
    const uint64_t t0 = profile_ ? now_ns() : 0;
    try {
      (*job_)(ith, nthreads_);
    } catch (...) {
      std::lock_guard<std::mutex> lk(error_mu_);
      if (!run_error_) run_error_ = std::current_exception();
    }
    if (profile_) {
      StatSlot& st = slots_[size_t(ith)];
      const uint64_t t1 = now_ns(), pub = published_ns_.load(std::memory_order_relaxed);
      add(st.busy_ns, t1 - t0);
      add(st.wake_ns, t0 > pub ? t0 - pub : 0);
      add(st.joined, 1);
    }
    if (optional) {
      entered_.fetch_sub(1);
    } else {
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
}

void ThreadPool::publish(bool optional) {
  uint64_t g = generation_.load();
  generation_.store(((g >> 1) + 1) << 1 | uint64_t(optional));  // seq_cst: pairs with sleepers_ (no lost wake-up)
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (nthreads_ == 1) {
    const uint64_t t0 = profile_ ? now_ns() : 0;
    fn(0, 1);
    if (profile_) add(slots_[0].busy_ns, now_ns() - t0);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  job_ = &fn;
  run_error_ = nullptr;
  pending_.store(nthreads_ - 1, std::memory_order_relaxed);
  const uint64_t t0 = profile_ ? now_ns() : 0;
  if (profile_) published_ns_.store(t0, std::memory_order_relaxed);
  publish(false);
  std::exception_ptr mine;
  try {
    fn(0, nthreads_);
  } catch (...) {
    mine = std::current_exception();
  }
  const uint64_t t1 = profile_ ? now_ns() : 0;
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    TESSERA_PAUSE();
    if (++spins > 4096) std::this_thread::yield();
  }
  if (profile_) {
    add(slots_[0].busy_ns, t1 - t0);
    add(slots_[0].tail_ns, now_ns() - t1);
    add(slots_[0].dispatches, 1);
  }
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (run_error_) std::rethrow_exception(run_error_);
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t, int)>& fn) {
  if (n_tasks <= 0) return;
  std::atomic<int64_t> next{0};
  const std::function<void(int, int)> grab = [&](int ith, int) {
    for (int64_t t = next.fetch_add(1, std::memory_order_relaxed); t < n_tasks;
         t = next.fetch_add(1, std::memory_order_relaxed))
      fn(t, ith);
  };
  if (nthreads_ == 1 || n_tasks == 1) {
    const uint64_t t0 = profile_ ? now_ns() : 0;
    grab(0, nthreads_);
    if (profile_) add(slots_[0].busy_ns, now_ns() - t0);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  job_ = &grab;
  run_error_ = nullptr;
  open_.store(true);
  const uint64_t t0 = profile_ ? now_ns() : 0;
  if (profile_) published_ns_.store(t0, std::memory_order_relaxed);
  publish(true);
  std::exception_ptr mine;
  try {
    grab(0, nthreads_);
  } catch (...) {
    mine = std::current_exception();
  }
  const uint64_t t1 = profile_ ? now_ns() : 0;
  open_.store(false);  // seq_cst with entered_: a worker either sees the job closed or is counted below
  int spins = 0;
  while (entered_.load() != 0) {
    TESSERA_PAUSE();
    if (++spins > 4096) std::this_thread::yield();
  }
  if (profile_) {
    add(slots_[0].busy_ns, t1 - t0);
    add(slots_[0].tail_ns, now_ns() - t1);
    add(slots_[0].dispatches, 1);
  }
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (run_error_) std::rethrow_exception(run_error_);
}

ThreadPool::ThreadStats ThreadPool::stats(int ith) const {
  ThreadStats s;
  if (ith < 0 || ith >= nthreads_) return s;
  const StatSlot& st = slots_[size_t(ith)];
  s.busy_ns = st.busy_ns.load(std::memory_order_relaxed);
  s.tail_ns = st.tail_ns.load(std::memory_order_relaxed);
  s.wake_ns = st.wake_ns.load(std::memory_order_relaxed);
  s.joined = st.joined.load(std::memory_order_relaxed);
  s.sleeps = st.sleeps.load(std::memory_order_relaxed);
  s.dispatches = st.dispatches.load(std::memory_order_relaxed);
  return s;
}

void ThreadPool::lead_loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lk(lead_mu_);
      lead_cv_.wait(lk, [&] { return lead_has_job_ || lead_stop_; });
      if (lead_stop_ && !lead_has_job_) return;
      job = std::move(lead_job_);
      lead_has_job_ = false;
    }
    std::exception_ptr err;
    try {
      job();
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(lead_mu_);
      lead_error_ = err;
      lead_busy_ = false;
    }
    lead_cv_.notify_all();
  }
}

void ThreadPool::submit(std::function<void()> job) {
  std::unique_lock<std::mutex> lk(lead_mu_);
  if (lead_busy_) throw std::logic_error("ThreadPool::submit: a submitted job is still running; call sync() first");
  if (!lead_.joinable()) lead_ = std::thread([this] { lead_loop(); });
  lead_job_ = std::move(job);
  lead_has_job_ = true;
  lead_busy_ = true;
  lead_error_ = nullptr;
  lk.unlock();
  lead_cv_.notify_all();
}

void ThreadPool::sync() {
  std::unique_lock<std::mutex> lk(lead_mu_);
  lead_cv_.wait(lk, [&] { return !lead_busy_; });
  std::exception_ptr err = lead_error_;
  lead_error_ = nullptr;
  lk.unlock();
  if (err) std::rethrow_exception(err);
}

}  // namespace tessera
