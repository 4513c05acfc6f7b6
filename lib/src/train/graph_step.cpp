#include "train/graph_step.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <optional>
#include <vector>

#include "core/check.h"
#include "core/message.h"

#if EMBER_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
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

}  // namespace

#if EMBER_WITH_CUDA

struct GraphStep::Impl {
  std::optional<c10::cuda::CUDAStream> side;  // warm-up and capture; on the batch's device
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  data::Batch statics;                    // the captured inputs
  StepResult result;                      // the captured outputs: rewritten by each replay
  std::vector<int64_t> last_eager_shape;  // capture only a shape an eager step has run

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
};

namespace {
// Tensors made on the side stream and read on the current one: the allocator must not reuse them early.
void used_on_current_stream(const StepResult& r) {
  for (const torch::Tensor* t : {&r.out.loss, &r.out.output, &r.out.target, &r.skip_flag})
    if (t->defined() && t->is_cuda()) t->record_stream(c10::cuda::getCurrentCUDAStream(t->device().index()));
}
}  // namespace

GraphStep::GraphStep(int64_t warmup_steps, std::function<void()> before_graph)
    : impl_(std::make_unique<Impl>()), warmup_(warmup_steps), before_graph_(std::move(before_graph)) {
  EMBER_CHECK(warmup_ >= 1, "[train::Trainer] CUDA graphs need at least one eager warm-up step, got {}",
              warmup_);
}

GraphStep::~GraphStep() {
  // The graph's pool and the tensors made on the side stream go: let every replay finish first.
  if (impl_ && impl_->side) {
    try {
      impl_->side->synchronize();
      c10::cuda::getCurrentCUDAStream(impl_->side->device_index()).synchronize();
    } catch (...) {  // a destructor must not throw; a failed device reports itself elsewhere
    }
  }
}

bool GraphStep::captured() const {
  return impl_->graph != nullptr;
}

StepResult GraphStep::run(const data::Batch& batch, const StepFn& step,
                          const std::function<void()>& zero_grad) {
  Impl& s = *impl_;
  EMBER_CHECK(
      batch.input.defined() && batch.input.is_cuda(),
      "[train::Trainer] trainer.cuda_graph: the batch is not on a CUDA device (it is on {}); CUDA graphs "
      "need the model and data on the GPU",
      batch.input.defined() ? batch.input.device().str() : "nowhere");
  const c10::cuda::CUDAGuard device_guard(batch.input.device());
  if (s.graph) {
    if (!same_layout(batch.input, s.statics.input) || !same_layout(batch.target, s.statics.target)) {
      zero_grad();                 // the graph's gradients must not be accumulated into
      StepResult r = step(batch);  // another shape (a short last batch): eager, as any step
      zero_grad();
      return r;
    }
    s.statics.input.copy_(batch.input, /*non_blocking=*/true);
    if (batch.target.defined()) s.statics.target.copy_(batch.target, /*non_blocking=*/true);
    s.statics.index = batch.index;  // host data: never read inside the graph
    s.statics.epoch = batch.epoch;
    s.graph->replay();
    ++replays_;
    return s.result;
  }
  // Warm-up: real steps on the capture stream, at least `warmup_`, and until
  // a batch comes with the shape of the step before (never capture the short
  // last batch of an epoch, nor a shape no eager step has run).
  const std::vector<int64_t> shape = batch.input.sizes().vec();
  if (eager_steps_ < warmup_ || shape != s.last_eager_shape) {
    StepResult r;
    s.on_side_stream(batch, [&] { r = step(batch); });
    used_on_current_stream(r);
    zero_grad();
    ++eager_steps_;
    s.last_eager_shape = shape;
    return r;
  }
  // Capture, then replay once: the replay is this step.
  if (before_graph_) before_graph_();
  s.on_side_stream(batch, [&] {
    s.statics.input = batch.input.clone();
    s.statics.target = batch.target.defined() ? batch.target.clone() : torch::Tensor();
    s.statics.index = batch.index;
    s.statics.epoch = batch.epoch;
    // Backward then writes the gradients into the graph's pool, where every
    // replay rewrites them (they are not zeroed again in graph mode).
    zero_grad();
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    // Thread-local: the loader's thread keeps copying batches while this thread
    // captures. CUDAGraph registers the device's default generator (dropout's
    // Philox seed and offset), and each replay advances its offset.
    graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      s.result = step(s.statics);
      graph->capture_end();
    } catch (const std::exception& e) {
      at::autocast::set_autocast_cache_enabled(cache);
      try {
        graph->capture_end();
      } catch (...) {  // capture was already invalid: the first error is the one to report
      }
      detail::fail(
          "[train::Trainer] trainer.cuda_graph: capturing the training step failed: {}. Something in the "
          "step "
          "reads the device or allocates outside the graph's memory (an .item() or a data-dependent shape in "
          "Task::training_step, a host-side random draw, a callback hook that syncs); run with "
          "trainer.cuda_graph=false",
          core::message_of(e).substr(0, 400));
    }
    at::autocast::set_autocast_cache_enabled(cache);
    graph->replay();  // capture only recorded; the statics hold this batch already
    s.graph = std::move(graph);
  });
  for (torch::Tensor* t : {&s.statics.input, &s.statics.target})
    if (t->defined()) t->record_stream(c10::cuda::getCurrentCUDAStream(t->device().index()));
  ++replays_;
  return s.result;
}

#else  // !EMBER_WITH_CUDA

struct GraphStep::Impl {};

GraphStep::GraphStep(int64_t warmup_steps, std::function<void()> before_graph)
    : impl_(std::make_unique<Impl>()), warmup_(warmup_steps), before_graph_(std::move(before_graph)) {
  detail::fail(
      ErrorKind::kConfig,
      "[train::Trainer] trainer.cuda_graph=true: this Ember was built without CUDA; set it to false");
}
GraphStep::~GraphStep() = default;
bool GraphStep::captured() const {
  return false;
}
StepResult GraphStep::run(const data::Batch&, const StepFn&, const std::function<void()>&) {
  return {};
}

#endif

}  // namespace ember::train
