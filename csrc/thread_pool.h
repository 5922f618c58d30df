// A tiny fork-join pool for the verify kernel: the caller runs part 0, the workers the rest.
// Workers spin briefly before sleeping because a forward pass issues matmuls back to back
// (a condition-variable wake-up per call would cost more than a small matmul).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mlxspec {

class ForkJoinPool {
 public:
  explicit ForkJoinPool(int threads) : threads_(threads < 1 ? 1 : threads) {
    for (int i = 1; i < threads_; ++i) {
      workers_.emplace_back([this, i] { worker_loop(i); });
    }
  }

  ~ForkJoinPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  int threads() const { return threads_; }

  // Runs job(part) for part in [0, threads) and returns when all parts are done.
  void run(const std::function<void(int)>& job) {
    if (threads_ == 1) {
      job(0);
      return;
    }
    std::lock_guard<std::mutex> serial(run_mutex_);  // one fork-join at a time
    job_ = &job;
    pending_.store(threads_ - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    job(0);
    while (pending_.load(std::memory_order_acquire) > 0) {
      std::this_thread::yield();
    }
    job_ = nullptr;
  }

 private:
  void worker_loop(int part) {
    uint64_t seen = 0;
    while (true) {
      uint64_t now = generation_.load(std::memory_order_acquire);
      if (now == seen) {
        // Spin for a while: the next matmul of the forward pass usually follows soon.
        auto start = std::chrono::steady_clock::now();
        while ((now = generation_.load(std::memory_order_acquire)) == seen &&
               std::chrono::steady_clock::now() - start < std::chrono::microseconds(spin_us_)) {
          std::this_thread::yield();
        }
        if (now == seen) {
          std::unique_lock<std::mutex> lock(mutex_);
          wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
          now = generation_.load(std::memory_order_acquire);
        }
      }
      seen = now;
      if (stopping_) return;
      (*job_)(part);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  int threads_;
  int spin_us_ = 2000;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::mutex run_mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  const std::function<void(int)>* job_ = nullptr;
  bool stopping_ = false;
};

// The one pool every kernel of the extension shares (MLXSPEC_KERNEL_THREADS or one per hardware thread).
ForkJoinPool& kernel_pool();

}  // namespace mlxspec
