#pragma once
// Batch loaders.
//
// Loader is the interface the Trainer iterates; TensorLoader serves batches
// from a TensorDataset held in memory. The order of an epoch is a pure
// function of (seed, epoch), so a run resumed at batch k of epoch e sees
// exactly the batches an uninterrupted run would have seen.

#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "ember/data/dataset.h"

namespace ember::data {

/// One mini-batch. `input` and `target` are on the loader's device.
struct Batch {
  torch::Tensor input;
  torch::Tensor target;
  int64_t size() const { return input.defined() ? input.size(0) : 0; }
};

class Loader {
 public:
  virtual ~Loader() = default;
  /// Batches in one epoch.
  virtual int64_t num_batches() const = 0;
  /// Samples in one epoch (after drop_last).
  virtual int64_t num_samples() const = 0;
  /// Starts `epoch`, skipping its first `skip_batches` batches (for resume).
  virtual void start_epoch(int64_t epoch, int64_t skip_batches) = 0;
  /// The next batch of the current epoch, or nullopt at its end.
  virtual std::optional<Batch> next() = 0;
};

struct TensorLoaderOptions {
  /// Samples per batch.
  int64_t batch_size = 128;
  /// Shuffle each epoch (order from seed and epoch); off: dataset order.
  bool shuffle = true;
  /// Drop the last incomplete batch.
  bool drop_last = false;
  /// Seed of the shuffling order.
  uint64_t seed = 0;
  /// Batches prepared ahead by a background thread; 0 = prepared on demand in
  /// next(); -1 = 2 when `device` is CUDA, else 0. On the CPU the thread would
  /// compete with LibTorch's intra-op threads for the same cores (measured on
  /// 2 cores: an epoch 1.3x slower with it, see tools/bench/fashion_epoch.py).
  int64_t prefetch = -1;
  /// Where batches are delivered. With CUDA, batches are staged in pinned
  /// host memory and copied with non_blocking=true.
  torch::Device device = torch::kCPU;
  /// Runs on the host in the background thread, before the device copy
  /// (e.g. uint8 -> normalised float). Must not use the global RNG.
  std::function<Batch(Batch)> transform;

  TensorLoaderOptions& set_batch_size(int64_t v) { batch_size = v; return *this; }
  TensorLoaderOptions& set_shuffle(bool v) { shuffle = v; return *this; }
  TensorLoaderOptions& set_drop_last(bool v) { drop_last = v; return *this; }
  TensorLoaderOptions& set_seed(uint64_t v) { seed = v; return *this; }
  TensorLoaderOptions& set_prefetch(int64_t v) { prefetch = v; return *this; }
  TensorLoaderOptions& set_device(torch::Device v) { device = v; return *this; }
  TensorLoaderOptions& set_transform(std::function<Batch(Batch)> v) { transform = std::move(v); return *this; }
};

class TensorLoader : public Loader {
 public:
  TensorLoader(TensorDataset dataset, TensorLoaderOptions options);
  ~TensorLoader() override;
  TensorLoader(const TensorLoader&) = delete;
  TensorLoader& operator=(const TensorLoader&) = delete;

  int64_t num_batches() const override;
  int64_t num_samples() const override;
  void start_epoch(int64_t epoch, int64_t skip_batches) override;
  std::optional<Batch> next() override;

  /// Sample indices of `epoch` in the order they are served (int64 [N]).
  torch::Tensor epoch_order(int64_t epoch) const;
  const TensorDataset& dataset() const { return dataset_; }
  const TensorLoaderOptions& options() const { return options_; }

 private:
  Batch make_batch(int64_t batch_index) const;
  void stop_worker();
  void worker_loop();

  TensorDataset dataset_;
  TensorLoaderOptions options_;
  torch::Tensor order_;      // indices of the current epoch
  int64_t next_batch_ = 0;   // next batch index to hand out (synchronous mode)
  int64_t end_batch_ = 0;

  // Background prefetch: the worker fills `queue_` with batches in order.
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  int64_t produced_ = 0;     // batches the worker has produced this epoch
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace ember::data
