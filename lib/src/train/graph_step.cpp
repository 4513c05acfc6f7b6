#include "train/graph_step.h"

#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <iostream>
#include <optional>
#include <vector>

#include "core/check.h"
#include "core/message.h"
#include "ember/core/op_counter.h"
#include "ember/version.h"

#if EMBER_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ember::train {
namespace {

// Same shapes, dtypes and devices: the batch can go through the captured tensors.
bool same_layout(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() ||
         (a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && a.device() == b.device());
}

// An emulated replay writes its outputs where the captured step's are, as a real replay does.
void write_into(torch::Tensor& into, const torch::Tensor& from) {
  if (!into.defined() || !from.defined()) {
    into = from;
    return;
  }
  into.detach().copy_(from.detach());
}

[[noreturn]] void capture_failed(const std::exception& e) {
  ember::detail::fail(
      "[train::Trainer] trainer.cuda_graph: capturing the training step failed: {}. Something in the step "
      "reads the device or allocates outside the graph's memory (an .item() or a data-dependent shape in "
      "Task::training_step, a host-side random draw, a callback hook that syncs); run with "
      "trainer.cuda_graph=false",
      core::message_of(e).substr(0, 400));
}

}  // namespace

struct GraphStep::Impl {
  data::Batch statics;  // the captured inputs
  StepResult result;    // the captured outputs: rewritten by each replay
#if EMBER_WITH_CUDA_KERNELS
  std::optional<c10::cuda::CUDAStream> side;  // warm-up and capture; on the batch's device
  std::unique_ptr<at::cuda::CUDAGraph> graph;

  // Runs `f` on the side stream of the batch's device, ordered after and
  // before that device's current stream.
  template <typename F>
  void on_side_stream(const data::Batch& batch, F&& f) {
    const c10::DeviceIndex device = batch.input.device().index();
    // High priority: not the low-priority pool the loader's copy streams come from.
    if (!side) side = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device);
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(*side);
    // The batch's memory is used on the side stream: the allocator must know.
    for (const torch::Tensor* t : {&batch.input, &batch.target})
      if (t->defined() && t->is_cuda()) t->record_stream(*side);
    {
      const c10::cuda::CUDAStreamGuard guard(*side);  // (sets the device too)
      f();
    }
    at::cuda::CUDAEvent done;
    done.record(*side);
    done.block(current);
  }

  // Bytes the caching allocator holds from the device now.
  static int64_t reserved(c10::DeviceIndex device) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
    return stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
  }
#endif
};

#if EMBER_WITH_CUDA_KERNELS
namespace {
// Tensors made on the side stream and read on the current one: the allocator must not reuse them early.
void used_on_current_stream(const StepResult& r) {
  for (const torch::Tensor* t : {&r.out.loss, &r.out.output, &r.out.target, &r.skip_flag})
    if (t->defined() && t->is_cuda()) t->record_stream(c10::cuda::getCurrentCUDAStream(t->device().index()));
}
}  // namespace
#endif

GraphStep::GraphStep(GraphStepOptions options, std::vector<torch::Tensor> params)
    : impl_(std::make_unique<Impl>()), options_(std::move(options)), params_(std::move(params)) {
  EMBER_CHECK(options_.warmup_steps() >= 1,
              "[train::Trainer] CUDA graphs need at least one eager warm-up step, got {}",
              options_.warmup_steps());
  EMBER_CHECK(options_.zero_grad() != nullptr, "[train::GraphStep] options.zero_grad is required");
#if !EMBER_WITH_CUDA_KERNELS
  if (!options_.emulated())
    ember::detail::fail(
        ErrorKind::kConfig,
        "[train::Trainer] trainer.cuda_graph=true: this Ember was built without CUDA; set it to false");
#endif
}

GraphStep::~GraphStep() {
#if EMBER_WITH_CUDA_KERNELS
  // The graph's pool and the tensors made on the side stream go: let every replay finish first.
  if (impl_ && impl_->side) {
    try {
      impl_->side->synchronize();
      c10::cuda::getCurrentCUDAStream(impl_->side->device_index()).synchronize();
    } catch (...) {  // a destructor must not throw; a failed device reports itself elsewhere
    }
  }
#endif
}

StepResult GraphStep::eager_on_fresh_gradients(const data::Batch& batch, const StepFn& step) {
  options_.zero_grad()();  // the step must not accumulate into the graph's gradients
  StepResult r = step(batch);
  // The graph's gradients take this step's, and are the parameters' .grad again.
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& mine = graph_grads_[i];
    torch::Tensor& grad = params_[i].mutable_grad();
    if (mine.defined()) {
      if (grad.defined())
        mine.copy_(grad);
      else
        mine.zero_();
    }
    grad = mine;
  }
  return r;
}

StepResult GraphStep::run(const data::Batch& batch, const StepFn& step) {
  last_was_replay_ = false;
  EMBER_CHECK(
      options_.emulated() || (batch.input.defined() && batch.input.is_cuda()),
      "[train::Trainer] trainer.cuda_graph: the batch is not on a CUDA device (it is on {}); CUDA graphs "
      "need the model and data on the GPU",
      batch.input.defined() ? batch.input.device().str() : "nowhere");
#if EMBER_WITH_CUDA_KERNELS
  std::optional<c10::cuda::CUDAGuard> device_guard;
  if (batch.input.defined() && batch.input.is_cuda()) device_guard.emplace(batch.input.device());
#endif
  if (captured_) return replay(batch, step);
  // Warm-up: real steps (on the capture stream), at least warmup_steps, and
  // until a batch comes with the shape of the step before (never capture the
  // short last batch of an epoch, nor a shape no eager step has run).
  if (eager_steps_ < options_.warmup_steps() || batch.input.sizes().vec() != last_eager_shape_)
    return warm_up(batch, step);
  return capture(batch, step);
}

StepResult GraphStep::replay(const data::Batch& batch, const StepFn& step) {
  Impl& s = *impl_;
  const bool emulated = options_.emulated();
  if (!same_layout(batch.input, s.statics.input) || !same_layout(batch.target, s.statics.target))
    return eager_on_fresh_gradients(batch, step);  // another shape (a short last batch)
  s.statics.input.copy_(batch.input, /*non_blocking=*/true);
  if (batch.target.defined()) s.statics.target.copy_(batch.target, /*non_blocking=*/true);
  s.statics.index = batch.index;  // host data: never read inside the graph
  s.statics.epoch = batch.epoch;
  {
    RECORD_USER_SCOPE(core::OpCounter::kGraphReplayScope);
    if (emulated) {
      const StepResult r = eager_on_fresh_gradients(s.statics, step);
      torch::NoGradGuard no_grad;
      write_into(s.result.out.loss, r.out.loss);
      write_into(s.result.out.output, r.out.output);
      write_into(s.result.out.target, r.out.target);
      write_into(s.result.skip_flag, r.skip_flag);
    } else {
#if EMBER_WITH_CUDA_KERNELS
      s.graph->replay();
#endif
    }
  }
  ++replays_;
  last_was_replay_ = true;
  return s.result;
}

StepResult GraphStep::warm_up(const data::Batch& batch, const StepFn& step) {
  Impl& s = *impl_;
  const bool emulated = options_.emulated();
  (void)s;
  const std::vector<int64_t> shape = batch.input.sizes().vec();
  StepResult r;
#if EMBER_WITH_CUDA_KERNELS
  // The first step on the current stream: what it makes to keep (the loss
  // scale, optimizer state, the loop's sums) is then allocated there, not in
  // side-stream segments that the release before capture could not hand back.
  if (!emulated && eager_steps_ > 0) {
    s.on_side_stream(batch, [&] { r = step(batch); });
    used_on_current_stream(r);
  }
  if (!emulated && eager_steps_ == 0) r = step(batch);
#endif
  if (emulated) r = step(batch);
  options_.zero_grad()();
  ++eager_steps_;
  last_eager_shape_ = shape;
  if (eager_steps_ == 8 * options_.warmup_steps())
    std::cerr << fmt::format(
        "[train::Trainer] trainer.cuda_graph: no two steps in a row had batches of one shape in {} steps, "
        "so nothing was captured and every step runs eagerly (an epoch of few batches with a short last "
        "one?); another data.batch_size (or TensorLoaderOptions::drop_last) lets a graph capture\n",
        eager_steps_);
  return r;
}

void GraphStep::take_statics(const data::Batch& batch) {
  Impl& s = *impl_;
  s.statics.input = batch.input.clone();
  s.statics.target = batch.target.defined() ? batch.target.clone() : torch::Tensor();
  s.statics.index = batch.index;
  s.statics.epoch = batch.epoch;
}

// Capture, then replay once: the replay is this step.
StepResult GraphStep::capture(const data::Batch& batch, const StepFn& step) {
  Impl& s = *impl_;
  if (options_.before_capture()) options_.before_capture()();
  if (options_.emulated()) {
    take_statics(batch);
    options_.zero_grad()();
    RECORD_USER_SCOPE(core::OpCounter::kGraphReplayScope);
    s.result = step(s.statics);
  } else {
    capture_on_device(batch, step);
  }
  // Callbacks read the outputs, nothing differentiates them: the capture's autograd graph can go.
  for (torch::Tensor* t : {&s.result.out.loss, &s.result.out.output, &s.result.out.target})
    if (t->defined()) *t = t->detach();
  graph_grads_.clear();
  for (const auto& p : params_) graph_grads_.push_back(p.grad());
  captured_ = true;
  ++replays_;
  if (options_.after_capture()) options_.after_capture()();
  return s.result;
}

void GraphStep::capture_on_device(const data::Batch& batch, const StepFn& step) {
#if EMBER_WITH_CUDA_KERNELS
  Impl& s = *impl_;
  const c10::DeviceIndex device = batch.input.device().index();
  // The warm-up's blocks are cached for the side stream, where nothing will
  // use them again: the graph allocates from its own pool. Hand them back
  // (one sync) so that the run does not hold two steps' activations.
  c10::cuda::CUDACachingAllocator::emptyCache();
  int64_t reserved_before = 0;
  s.on_side_stream(batch, [&] {
    RECORD_USER_SCOPE(core::OpCounter::kGraphReplayScope);  // the capture's operators are the graph's
    take_statics(batch);
    // Backward then writes the gradients into the graph's pool, where every
    // replay rewrites them.
    options_.zero_grad()();
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    // A pool of known id: a failed capture must stop the allocator routing to it.
    const auto pool = at::cuda::graph_pool_handle();
    reserved_before = Impl::reserved(device);
    // Thread-local: the loader's thread keeps copying batches while this thread
    // captures. CUDAGraph registers the device's default generator (dropout's
    // Philox seed and offset), and each replay advances its offset.
    graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    const auto abandon = [&] {
      at::autocast::set_autocast_cache_enabled(cache);
      try {
        graph->capture_end();
      } catch (...) {  // capture was already invalid: the first error is the one to report
      }
      try {  // (capture_end may have thrown before it ended the allocator's routing)
        c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
      } catch (...) {  // it had: nothing routes to the pool any more
      }
    };
    try {
      s.result = step(s.statics);
      graph->capture_end();
    } catch (const c10::OutOfMemoryError&) {
      abandon();
      throw;  // as out of memory, unchanged: the batch-size search counts it as too large
    } catch (const Error& e) {
      abandon();
      if (e.kind() == ErrorKind::kConfig) throw;  // a part of the step that names its own cause
      capture_failed(e);
    } catch (const std::exception& e) {
      abandon();
      capture_failed(e);
    }
    at::autocast::set_autocast_cache_enabled(cache);
    graph->replay();  // capture only recorded; the statics hold this batch already
    s.graph = std::move(graph);
  });
  for (torch::Tensor* t : {&s.statics.input, &s.statics.target})
    if (t->defined()) t->record_stream(c10::cuda::getCurrentCUDAStream(t->device().index()));
  pool_bytes_ = std::max<int64_t>(Impl::reserved(device) - reserved_before, 0);
#else
  (void)batch;
  (void)step;
#endif
}

}  // namespace ember::train
