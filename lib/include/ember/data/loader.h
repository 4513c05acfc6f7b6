#pragma once
// Batch loaders.
//
// Loader is the interface the Trainer iterates; TensorLoader serves batches
// from a TensorDataset held in memory. The order of an epoch is a pure
// function of (seed, epoch), so a run resumed at batch k of epoch e sees
// exactly the batches an uninterrupted run would have seen.
//
// Distributed data parallel: with num_replicas = R and rank = r, each process
// serves its shard of the epoch, as torch.utils.data.DistributedSampler does:
// every rank computes the same epoch order (same seed), pads it with its first
// samples to a multiple of R (or drops its tail, with drop_uneven), and keeps
// every R-th sample from r on. Batching, drop_last, prefetch and resume apply
// to the shard.

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/arg.h>
#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "ember/data/dataset.h"

namespace ember::data {

/// One mini-batch. `input` and `target` are on the loader's device; `index`
/// and `epoch` key per-sample random augmentation (Philox on (seed, sample
/// index, epoch)), so they are the same on resume and with or without prefetch.
struct Batch {
  torch::Tensor input;   ///< [B, ...] on the loader's device
  torch::Tensor target;  ///< [B] or [B, ...] on the loader's device
  /// Dataset index of each sample, int64 [B] on the CPU: the batch's slice of
  /// TensorLoader::shard_order(epoch) (= epoch_order(epoch) unsharded).
  torch::Tensor index;
  /// The epoch the batch belongs to.
  int64_t epoch = 0;
  int64_t size() const { return input.defined() ? input.size(0) : 0; }
};

class Loader {
 public:
  virtual ~Loader() = default;
  /// Batches in one epoch (of this process's shard, when sharded).
  virtual int64_t num_batches() const = 0;
  /// Samples in one epoch (of this process's shard, when sharded; after drop_last).
  virtual int64_t num_samples() const = 0;
  /// Starts `epoch`, skipping its first `skip_batches` batches (for resume).
  virtual void start_epoch(int64_t epoch, int64_t skip_batches) = 0;
  /// The next batch of the current epoch (with its `index` and `epoch`), or
  /// nullopt at its end.
  virtual std::optional<Batch> next() = 0;
};

/// Options of TensorLoader. A batch goes through, in this order:
///   1. gather: the batch's samples, picked by index_select from the dataset;
///   2. `transform` (host): in the background thread when prefetch > 0, else
///      in next();
///   3. copy to `device`;
///   4. `device_transform`: on the consumer thread, in next(), on the current
///      stream.
/// With `resident`, 1 runs on the device in next() and 2-3 do not exist.
struct TensorLoaderOptions {
  /// Samples per batch.
  TORCH_ARG(int64_t, batch_size) = 128;
  /// Shuffle each epoch (order from seed and epoch); off: dataset order.
  TORCH_ARG(bool, shuffle) = true;
  /// Drop the last incomplete batch.
  TORCH_ARG(bool, drop_last) = false;
  /// Seed of the shuffling order.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Batches prepared ahead by a background thread; 0 = prepared on demand in
  /// next(); -1 = 2 when `device` is CUDA, else 0. On the CPU the thread would
  /// compete with LibTorch's intra-op threads for the same cores (measured on
  /// 2 cores: an epoch 1.3x slower with it, see tools/bench/fashion_epoch.py).
  /// Ignored (reads 0) with `resident`: gathering there is a device op, queued
  /// on the stream in microseconds, so a thread would have nothing to hide.
  TORCH_ARG(int64_t, prefetch) = -1;
  /// Where batches are delivered; "cuda" without an index means the current
  /// device at construction. With CUDA, batches are staged in pinned host
  /// memory and copied with non_blocking=true; with prefetch > 0 the
  /// background thread issues the copies on a side stream from the pool, and
  /// next() makes the current stream wait on them (an event, no host sync),
  /// so the next batch's copy overlaps the current step.
  TORCH_ARG(torch::Device, device) = torch::kCPU;
  /// Runs on the host before the device copy (e.g. uint8 -> normalised
  /// float). Must not use the global RNG; must return the Batch it is given
  /// with `index` and `epoch` kept (one index per sample). Not with `resident`.
  TORCH_ARG(std::function<Batch(Batch)>, transform);
  /// Runs in next(), on the consumer thread, once the batch is on `device`
  /// (with CUDA: on the current stream, e.g. GPU augmentation kernels keyed on
  /// batch.index and batch.epoch). Runs without autograd.
  TORCH_ARG(std::function<Batch(Batch)>, device_transform);
  /// Copy the whole dataset to `device` once, in the constructor, in its own
  /// dtype (uint8 images stay uint8: CIFAR-10 is 150 MB), and gather batches
  /// there with index_select (the batch's index is copied to the device
  /// non_blocking from pinned memory). No background thread, no per-batch
  /// host work beyond slicing the order. Off by default. With the CPU as
  /// `device` it is the same as not resident. `transform` is an error with it:
  /// use `device_transform`.
  TORCH_ARG(bool, resident) = false;
  /// Processes the epoch is split between (DDP: WORLD_SIZE); 1 = not sharded.
  /// Every replica must use the same dataset, seed and shuffle.
  TORCH_ARG(int64_t, num_replicas) = 1;
  /// This process's shard, in [0, num_replicas) (DDP: RANK): it serves
  /// positions rank, rank + num_replicas, ... of the (padded) epoch order.
  TORCH_ARG(int64_t, rank) = 0;
  /// How shards are made equal when num_replicas does not divide the N
  /// samples, as DistributedSampler's drop_last: false (default) pads the
  /// order with its own first samples to ceil(N / num_replicas) per rank
  /// (a few samples served twice per epoch); true drops the order's tail,
  /// floor(N / num_replicas) per rank (a few samples skipped per epoch, a
  /// different few each shuffled epoch). Unrelated to drop_last, which then
  /// applies to the shard's batches.
  TORCH_ARG(bool, drop_uneven) = false;
};

/// `options` with `transform` set where it belongs: as the host `transform`
/// (on the loader's thread, before the copy) when batches are delivered to
/// the CPU from host memory, else as the `device_transform` (after the copy
/// or the resident gather; e.g. a fused augmentation kernel on the GPU).
TensorLoaderOptions with_batch_transform(TensorLoaderOptions options, std::function<Batch(Batch)> transform);

class TensorLoader;

/// The loaders of a labelled dataset with a held-out part.
struct SplitLoaders {
  std::unique_ptr<TensorLoader> train;  ///< the first train.size() - val_size training samples
  std::unique_ptr<TensorLoader> val;    ///< the last val_size training samples; null when 0
  std::unique_ptr<TensorLoader> test;
};
struct SplitLoaderOptions {
  /// Training samples held out for validation (the last ones), in [0, train.size()).
  TORCH_ARG(int64_t, val_size) = 0;
  /// The training loader (shuffled and sharded as it says).
  TORCH_ARG(TensorLoaderOptions, train);
  /// The validation and test loaders, always unshuffled and unsharded (every
  /// rank evaluates everything: exact metrics, no padding).
  TORCH_ARG(TensorLoaderOptions, eval);
};
/// Splits `train` into training and validation samples and builds the three loaders.
SplitLoaders make_split_loaders(const TensorDataset& train, const TensorDataset& test,
                                const SplitLoaderOptions& options);

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

  /// Sample indices of `epoch`, all N of them, in the global order every
  /// rank shares (int64 [N]): shuffled from (seed, epoch), or 0..N-1. Unsharded,
  /// the order batches are served in.
  torch::Tensor epoch_order(int64_t epoch) const;
  /// The dataset indices this rank serves in `epoch`, in order (int64
  /// [shard_size()]): epoch_order(epoch) padded cyclically with its own
  /// first samples to ceil(N / R) * R (or cut to floor(N / R) * R with
  /// drop_uneven), then positions rank, rank + R, ... (R = num_replicas).
  /// Equal to epoch_order(epoch) when num_replicas is 1.
  torch::Tensor shard_order(int64_t epoch) const;
  /// Samples in this rank's shard of an epoch, before drop_last.
  int64_t shard_size() const;
  const TensorDataset& dataset() const { return dataset_; }
  const TensorLoaderOptions& options() const { return options_; }

 private:
  /// A batch on its way to the consumer; `ready` is recorded on the copy
  /// stream after its device copies (CUDA with prefetch > 0 only).
  struct Staged {
    Batch batch;
    std::optional<c10::Event> ready;
  };

  torch::Tensor order_slice(int64_t batch_index) const;  // the batch's dataset indices
  Batch gather(int64_t batch_index) const;               // steps 1-2, on the host
  void copy_to_device(Batch& batch) const;               // step 3, current stream
  Batch gather_resident(int64_t batch_index) const;      // step 1 on the device
  std::optional<Batch> take();                           // steps 1-3 for next()
  void stop_worker();
  void worker_loop();

  TensorDataset dataset_;
  TensorLoaderOptions options_;
  TensorDataset resident_;                  // the dataset on options_.device (resident on a device only)
  std::optional<c10::Stream> copy_stream_;  // side stream of the worker's copies (CUDA, prefetch > 0)
  torch::Tensor order_;                     // shard_order of the current epoch (pinned for resident CUDA)
  int64_t epoch_ = 0;                       // the current epoch
  int64_t next_batch_ = 0;                  // next batch index to hand out
  int64_t end_batch_ = 0;

  // Background prefetch: the worker fills `queue_` with batches in order.
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Staged> queue_;
  int64_t produced_ = 0;  // batches the worker has produced this epoch
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace ember::data
