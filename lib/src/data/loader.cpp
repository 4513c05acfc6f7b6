#include "ember/data/loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include "core/check.h"
#include "core/staging.h"

namespace ember::data {
namespace {

// splitmix64: decorrelates (seed, epoch) pairs into generator seeds.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

TensorLoader::TensorLoader(TensorDataset dataset, TensorLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  EMBER_CHECK(dataset_.inputs.defined() && dataset_.targets.defined(),
              "[data::TensorLoader] the dataset has no inputs or targets");
  EMBER_CHECK(dataset_.inputs.size(0) == dataset_.targets.size(0),
              "[data::TensorLoader] {} inputs but {} targets", dataset_.inputs.size(0),
              dataset_.targets.size(0));
  EMBER_CHECK(options_.batch_size() > 0, "[data::TensorLoader] batch_size must be positive, got {}",
              options_.batch_size());
  EMBER_CHECK(options_.prefetch() >= -1,
              "[data::TensorLoader] prefetch must be >= 0, or -1 for automatic, got {}", options_.prefetch());
  EMBER_CHECK(
      !(options_.resident() && options_.transform()),
      "[data::TensorLoader] a host `transform` cannot run with resident=true (batches are gathered on "
      "the device, they never pass through the host); use device_transform, or resident=false");
  EMBER_CHECK(dataset_.inputs.device().is_cpu(), "[data::TensorLoader] the dataset must be on the CPU");
  EMBER_CHECK(options_.num_replicas() >= 1,
              "[data::TensorLoader] num_replicas must be >= 1 (the number of processes, WORLD_SIZE), got {}",
              options_.num_replicas());
  EMBER_CHECK(options_.rank() >= 0 && options_.rank() < options_.num_replicas(),
              "[data::TensorLoader] rank {} is outside [0, {}) for num_replicas={}; set rank to this "
              "process's RANK, below WORLD_SIZE",
              options_.rank(), options_.num_replicas(), options_.num_replicas());
  EMBER_CHECK(!options_.drop_uneven() || dataset_.size() >= options_.num_replicas(),
              "[data::TensorLoader] drop_uneven: {} samples cannot give each of {} replicas one (every "
              "shard would be empty); use drop_uneven=false to pad, or fewer replicas",
              dataset_.size(), options_.num_replicas());
  if (options_.num_replicas() == 1) {
    EMBER_CHECK(num_batches() > 0,
                "[data::TensorLoader] {} samples make no batch of {} with drop_last; lower the batch size",
                dataset_.size(), options_.batch_size());
  } else {
    EMBER_CHECK(num_batches() > 0,
                "[data::TensorLoader] rank {}'s shard of {} samples ({} over {} replicas) makes no batch "
                "of {} with drop_last; lower the batch size",
                options_.rank(), shard_size(), dataset_.size(), options_.num_replicas(),
                options_.batch_size());
  }
  if (options_.device().is_cuda() && !options_.device().has_index()) {
    // Pin "cuda" to the device current now: the worker thread's current device is its own.
    const c10::impl::VirtualGuardImpl impl(options_.device().type());
    options_.device() = impl.getDevice();
  }
  if (options_.resident()) {
    options_.prefetch() = 0;  // gathering is a device op: nothing for a thread to hide
  } else if (options_.prefetch() < 0) {
    options_.prefetch() = options_.device().is_cuda() ? 2 : 0;
  }

  if (options_.resident() && !options_.device().is_cpu()) {
    // Synchronous copies: the data is on the device before the first batch, whatever stream reads it.
    try {
      resident_.inputs = dataset_.inputs.to(options_.device());
      resident_.targets = dataset_.targets.to(options_.device());
    } catch (const c10::Error& e) {
      const double mb = static_cast<double>(dataset_.inputs.nbytes() + dataset_.targets.nbytes()) / 1e6;
      ember::detail::fail(
          "[data::TensorLoader] resident: copying the dataset ({:.0f} MB) to {} failed: {} "
          "(set resident=false to stream batches from the host instead)",
          mb, options_.device().str(), e.what_without_backtrace());
    }
  }
  if (options_.device().is_cuda() && options_.prefetch() > 0) {
    const c10::impl::VirtualGuardImpl impl(options_.device().type());
    copy_stream_ = impl.getStreamFromGlobalPool(options_.device());
  }
}

TensorLoader::~TensorLoader() {
  stop_worker();
}

int64_t TensorLoader::shard_size() const {
  const int64_t n = dataset_.size(), r = options_.num_replicas();
  return options_.drop_uneven() ? n / r : (n + r - 1) / r;
}

int64_t TensorLoader::num_batches() const {
  const int64_t n = shard_size(), b = options_.batch_size();
  return options_.drop_last() ? n / b : (n + b - 1) / b;
}

int64_t TensorLoader::num_samples() const {
  return options_.drop_last() ? num_batches() * options_.batch_size() : shard_size();
}

torch::Tensor TensorLoader::epoch_order(int64_t epoch) const {
  const int64_t n = dataset_.size();
  if (!options_.shuffle()) return torch::arange(n, torch::kInt64);
  auto gen =
      at::make_generator<at::CPUGeneratorImpl>(mix(options_.seed() ^ mix(static_cast<uint64_t>(epoch))));
  return torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kInt64));
}

torch::Tensor TensorLoader::shard_order(int64_t epoch) const {
  torch::Tensor order = epoch_order(epoch);
  const int64_t r = options_.num_replicas();
  if (r == 1) return order;
  // DistributedSampler's rule: the order padded to total = shard_size() * r holds order[p % N] at
  // position p (padding repeats the order from its start, several times over when N < r); with
  // drop_uneven total <= N and nothing wraps. This rank keeps positions rank, rank + r, ...
  const torch::Tensor positions =
      torch::arange(options_.rank(), shard_size() * r, r, torch::kInt64).remainder(order.size(0));
  return order.index_select(0, positions);
}

torch::Tensor TensorLoader::order_slice(int64_t batch_index) const {
  const int64_t begin = batch_index * options_.batch_size();
  return order_.narrow(0, begin, std::min(options_.batch_size(), order_.size(0) - begin));
}

Batch TensorLoader::gather(int64_t batch_index) const {
  const torch::Tensor idx = order_slice(batch_index);
  Batch batch;
  batch.input = dataset_.inputs.index_select(0, idx);
  batch.target = dataset_.targets.index_select(0, idx);
  batch.index = idx.clone();  // its own storage: the batch may outlive the epoch's order
  batch.epoch = epoch_;
  if (options_.transform()) {
    batch = options_.transform()(std::move(batch));
    EMBER_CHECK(
        batch.index.defined() && batch.index.dim() == 1 && batch.index.size(0) == batch.size(),
        "[data::TensorLoader] the transform returned a batch of {} samples with {} indices; return the "
        "Batch it is given, with its index and epoch",
        batch.size(), batch.index.defined() ? batch.index.numel() : 0);
  }
  return batch;
}

void TensorLoader::copy_to_device(Batch& batch) const {
  const auto copy = [&](torch::Tensor& t) {
    if (!t.defined() || t.device() == options_.device()) return;
    t = ember::detail::to_device_async(t, options_.device());
  };
  copy(batch.input);
  copy(batch.target);
}

Batch TensorLoader::gather_resident(int64_t batch_index) const {
  const torch::Tensor idx = order_slice(batch_index);  // pinned with CUDA (start_epoch)
  const torch::Tensor device_idx = idx.to(options_.device(), /*non_blocking=*/options_.device().is_cuda());
  Batch batch;
  batch.input = resident_.inputs.index_select(0, device_idx);
  batch.target = resident_.targets.index_select(0, device_idx);
  batch.index = idx.clone();
  batch.epoch = epoch_;
  return batch;
}

void TensorLoader::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  queue_.clear();
  error_ = nullptr;
}

void TensorLoader::worker_loop() {
  try {
    torch::NoGradGuard no_grad;  // batches never need autograd history
    // With CUDA, everything this thread enqueues goes to the side stream, so the
    // copies overlap the consumer's kernels; next() orders them through `ready`.
    std::optional<c10::StreamGuard> on_copy_stream;
    if (copy_stream_) on_copy_stream.emplace(*copy_stream_);
    for (int64_t b = next_batch_; b < end_batch_; ++b) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < options_.prefetch(); });
        if (stop_) return;
      }
      Staged staged{gather(b), std::nullopt};
      copy_to_device(staged.batch);
      if (copy_stream_) {
        staged.ready.emplace(options_.device().type());
        staged.ready->record(*copy_stream_);
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.push_back(std::move(staged));
        ++produced_;
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

void TensorLoader::start_epoch(int64_t epoch, int64_t skip_batches) {
  stop_worker();
  EMBER_CHECK(skip_batches >= 0 && skip_batches <= num_batches(),
              "[data::TensorLoader] cannot skip {} of {} batches", skip_batches, num_batches());
  order_ = shard_order(epoch);
  // Resident on CUDA: each batch's slice of the order is copied non_blocking, so from pinned memory.
  if (resident_.inputs.defined() && options_.device().is_cuda()) order_ = order_.pin_memory();
  epoch_ = epoch;
  next_batch_ = skip_batches;
  end_batch_ = num_batches();
  produced_ = 0;
  stop_ = false;
  if (options_.prefetch() > 0 && next_batch_ < end_batch_) worker_ = std::thread([this] { worker_loop(); });
}

std::optional<Batch> TensorLoader::take() {
  if (options_.prefetch() == 0) {
    if (next_batch_ >= end_batch_) return std::nullopt;
    const int64_t b = next_batch_++;
    if (resident_.inputs.defined()) return gather_resident(b);
    Batch batch = gather(b);
    copy_to_device(batch);  // on the current stream: nothing to order
    return batch;
  }
  Staged staged;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t remaining = end_batch_ - next_batch_;
    if (remaining <= 0) return std::nullopt;
    cv_.wait(lock, [&] { return !queue_.empty() || error_ != nullptr; });
    if (queue_.empty() && error_) std::rethrow_exception(error_);
    staged = std::move(queue_.front());
    queue_.pop_front();
    ++next_batch_;
  }
  cv_.notify_all();
  if (staged.ready) {
    // The current stream waits for the side stream's copies (no host sync), and the
    // allocator keeps the batch's memory until the current stream is done with it.
    const c10::impl::VirtualGuardImpl impl(options_.device().type());
    const c10::Stream current = impl.getStream(options_.device());
    staged.ready->block(current);
    for (torch::Tensor* t : {&staged.batch.input, &staged.batch.target}) {
      if (t->defined() && t->device() == options_.device()) t->record_stream(current);
    }
  }
  return std::move(staged.batch);
}

std::optional<Batch> TensorLoader::next() {
  torch::NoGradGuard no_grad;  // batches never need autograd history
  std::optional<Batch> batch = take();
  if (batch && options_.device_transform()) batch = options_.device_transform()(std::move(*batch));
  return batch;
}

TensorLoaderOptions with_batch_transform(TensorLoaderOptions options, std::function<Batch(Batch)> transform) {
  if (options.device().is_cpu() && !options.resident()) return options.transform(std::move(transform));
  return options.device_transform(std::move(transform));
}

SplitLoaders make_split_loaders(const TensorDataset& train, const TensorDataset& test,
                                const SplitLoaderOptions& options) {
  const int64_t val_size = options.val_size();
  EMBER_CHECK_KIND(kConfig, val_size >= 0 && val_size < train.size(),
                   "[data::make_split_loaders] data.val_size={} must be in [0, {}) (the training set's size)",
                   val_size, train.size());
  const TensorLoaderOptions& train_options = options.train();
  TensorLoaderOptions eval_options = options.eval();
  eval_options.shuffle(false).num_replicas(1).rank(0);
  const int64_t n_train = train.size() - val_size;
  const auto part = [&](int64_t begin, int64_t n) {
    return TensorDataset{train.inputs.narrow(0, begin, n), train.targets.narrow(0, begin, n)};
  };
  SplitLoaders l;
  l.train = std::make_unique<TensorLoader>(part(0, n_train), train_options);
  if (val_size > 0) l.val = std::make_unique<TensorLoader>(part(n_train, val_size), eval_options);
  l.test = std::make_unique<TensorLoader>(test, eval_options);
  return l;
}

}  // namespace ember::data
