// The one thread pool. Persistent workers; the calling thread works as worker 0, so nothing spins beside the workers.
// Kernels receive (ith, nth) or task indices and never create threads (std::thread appears only in pool.cpp).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera {

class ThreadPool {
 public:
  // nthreads participants in total, the caller of run() included (nthreads - 1 worker threads are started).
  explicit ThreadPool(int nthreads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return nthreads_; }

  // Runs fn(ith, nth) on every participant (caller = ith 0) and returns when all are done. Not reentrant.
  void run(const std::function<void(int ith, int nth)>& fn);
  // Runs fn(task, ith) for task in [0, n_tasks), handed out dynamically (atomic counter), on all participants.
  void parallel_for(int64_t n_tasks, const std::function<void(int64_t task, int ith)>& fn);

  // Asynchronous: job runs on the pool's lead thread (which may call run()/parallel_for()); submit returns at once so
  // the caller can do other work (the GPU half); sync() waits for it and rethrows its exception. One job at a time.
  void submit(std::function<void()> job);
  void sync();

  // Per-thread counters, kept only under TESSERA_PROFILE (tessera/step_profile.h reads them at phase boundaries);
  // otherwise all zero. ith 0 is the caller of run()/parallel_for().
  struct ThreadStats {
    uint64_t busy_ns = 0;     // inside jobs (the caller: its own share, including jobs run inline)
    uint64_t tail_ns = 0;     // the caller: after its share, waiting for the workers that joined
    uint64_t wake_ns = 0;     // a worker: from the job's publication to its start, summed over the jobs it joined
    uint64_t joined = 0;      // a worker: jobs joined
    uint64_t sleeps = 0;      // a worker: times it fell asleep on the condition variable
    uint64_t dispatches = 0;  // the caller: jobs published to the workers
  };
  bool profiling() const { return profile_; }
  ThreadStats stats(int ith) const;

 private:
  void worker_loop(int ith);
  void publish(bool optional);
  void lead_loop();

  int nthreads_;
  std::vector<std::thread> workers_;
  // run() state: a generation counter the workers watch (spin briefly, then sleep on cv_).
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};   // run(): workers still to finish
  std::atomic<int> entered_{0};   // parallel_for(): workers inside the job
  std::atomic<bool> open_{false}; // parallel_for(): the job accepts workers
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;       // workers sleep here
  std::condition_variable done_cv_;  // run() sleeps here after its own share if workers are still busy
  std::atomic<int> sleepers_{0};
  std::mutex run_mu_;  // serialises run() between the caller and a submitted job
  std::exception_ptr run_error_;
  std::mutex error_mu_;
  bool lead_stop_ = false;
  // submit()/sync() state.
  std::thread lead_;
  std::mutex lead_mu_;
  std::condition_variable lead_cv_;
  std::function<void()> lead_job_;
  bool lead_has_job_ = false, lead_busy_ = false;
  std::exception_ptr lead_error_;
  // TESSERA_PROFILE counters (stats()): one cache line per thread, written by that thread only.
  struct alignas(64) StatSlot {
    std::atomic<uint64_t> busy_ns{0}, tail_ns{0}, wake_ns{0}, joined{0}, sleeps{0}, dispatches{0};
  };
  const bool profile_;
  std::unique_ptr<StatSlot[]> slots_;
  std::atomic<uint64_t> published_ns_{0};  // when the current job was published (profile_ only)
};

}  // namespace tessera
