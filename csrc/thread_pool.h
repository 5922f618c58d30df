// A tiny fork-join pool for the verify kernel: the caller runs part 0, the workers the rest.
// Workers spin briefly before sleeping because a forward pass issues matmuls back to back
// (a condition-variable wake-up per call would cost more than a small matmul).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
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

// Below this many weight bytes a matmul's fork-join costs more than it saves.
constexpr int64_t kParallelBytes = 1 << 18;

// Columns [0, n) of a matmul over the pool's threads: run(begin, end) per range, each a multiple of `block`
// columns and depending on N only, never on M, so a row's bits do not depend on the split.
template <typename Run>
void split_columns(int64_t n, int64_t block, int64_t weight_bytes, Run&& run) {
  const int parts = weight_bytes < kParallelBytes ? 1 : kernel_pool().threads();
  if (parts == 1) {
    run(int64_t(0), n);
    return;
  }
  const int64_t per_part = (n + parts * block - 1) / (parts * block) * block;
  kernel_pool().run([&](int part) {
    const int64_t begin = std::min<int64_t>(n, part * per_part);
    const int64_t end = std::min<int64_t>(n, begin + per_part);
    if (begin < end) run(begin, end);
  });
}

// Rows [0, m) as few tiles of at most max_rows as fit, of near-equal size (7 rows: 4 + 3, not 6 + 1): tile(first,
// rows) per tile. Each weight chunk is unpacked once per tile; a row's products go in the same order in any tile.
template <typename Tile>
void split_rows(int64_t m, int max_rows, Tile&& tile) {
  const int64_t tiles = (m + max_rows - 1) / max_rows;
  for (int64_t t = 0, i = 0; t < tiles; ++t) {
    const int rows = int((m - i + (tiles - t) - 1) / (tiles - t));
    tile(i, rows);
    i += rows;
  }
}

}  // namespace mlxspec
