#include "ember/data/loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "core/check.h"

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
  EMBER_CHECK(options_.batch_size > 0, "[data::TensorLoader] batch_size must be positive, got {}",
              options_.batch_size);
  EMBER_CHECK(options_.prefetch >= -1, "[data::TensorLoader] prefetch must be >= 0, or -1 for automatic, got {}",
              options_.prefetch);
  if (options_.prefetch < 0) options_.prefetch = options_.device.is_cuda() ? 2 : 0;
  EMBER_CHECK(dataset_.inputs.device().is_cpu(), "[data::TensorLoader] the dataset must be on the CPU");
  EMBER_CHECK(num_batches() > 0,
              "[data::TensorLoader] {} samples make no batch of {} with drop_last; lower the batch size",
              dataset_.size(), options_.batch_size);
}

TensorLoader::~TensorLoader() { stop_worker(); }

int64_t TensorLoader::num_batches() const {
  const int64_t n = dataset_.size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

int64_t TensorLoader::num_samples() const {
  return options_.drop_last ? num_batches() * options_.batch_size : dataset_.size();
}

torch::Tensor TensorLoader::epoch_order(int64_t epoch) const {
  const int64_t n = dataset_.size();
  if (!options_.shuffle) return torch::arange(n, torch::kInt64);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(mix(options_.seed ^ mix(static_cast<uint64_t>(epoch))));
  return torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kInt64));
}

Batch TensorLoader::make_batch(int64_t batch_index) const {
  const int64_t begin = batch_index * options_.batch_size;
  const int64_t len = std::min(options_.batch_size, dataset_.size() - begin);
  Batch batch;
  const torch::Tensor idx = order_.narrow(0, begin, len);
  batch.input = dataset_.inputs.index_select(0, idx);
  batch.target = dataset_.targets.index_select(0, idx);
  if (options_.transform) batch = options_.transform(std::move(batch));
  if (options_.device.is_cuda()) {
    batch.input = batch.input.pin_memory().to(options_.device, /*non_blocking=*/true);
    batch.target = batch.target.pin_memory().to(options_.device, /*non_blocking=*/true);
  } else if (options_.device != batch.input.device()) {
    batch.input = batch.input.to(options_.device);
    batch.target = batch.target.to(options_.device);
  }
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
    for (int64_t b = next_batch_; b < end_batch_; ++b) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < options_.prefetch; });
        if (stop_) return;
      }
      Batch batch = make_batch(b);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.push_back(std::move(batch));
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
  order_ = epoch_order(epoch);
  next_batch_ = skip_batches;
  end_batch_ = num_batches();
  produced_ = 0;
  stop_ = false;
  if (options_.prefetch > 0 && next_batch_ < end_batch_) worker_ = std::thread([this] { worker_loop(); });
}

std::optional<Batch> TensorLoader::next() {
  if (options_.prefetch == 0) {
    if (next_batch_ >= end_batch_) return std::nullopt;
    torch::NoGradGuard no_grad;  // batches never need autograd history
    return make_batch(next_batch_++);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  const int64_t remaining = end_batch_ - next_batch_;
  if (remaining <= 0) return std::nullopt;
  cv_.wait(lock, [&] { return !queue_.empty() || error_ != nullptr; });
  if (queue_.empty() && error_) std::rethrow_exception(error_);
  Batch batch = std::move(queue_.front());
  queue_.pop_front();
  ++next_batch_;
  lock.unlock();
  cv_.notify_all();
  return batch;
}

}  // namespace ember::data
