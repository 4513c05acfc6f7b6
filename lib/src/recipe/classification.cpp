// ClassificationTask and the batch glue between data/ and augment/.
#include "ember/recipe/classification.h"

#include <torch/torch.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "core/check.h"

namespace ember::recipe {

using core::Bounds;

namespace {

// Host output batches, reused once nothing else holds them. A float batch of
// 224 px images (77 MB at 128) is above glibc's largest mmap threshold, so a
// fresh one is mapped, zero-filled page by page and unmapped at every step: a
// fifth of a streamed run's CPU time on 2 cores. A batch the trainer or a
// prefetch queue still holds (its storage is shared) is never handed out
// again; at most kKeep are kept. This holds for consumers that keep the batch
// as a tensor (a view, a queue entry, autograd's saved input), as everything
// in Ember does; not for one that keeps only its data pointer.
class BatchBuffers {
 public:
  torch::Tensor take(const std::vector<int64_t>& shape, torch::ScalarType dtype) {
    std::lock_guard<std::mutex> lock(mutex_);
    torch::Tensor* reusable = nullptr;  // a free buffer of another shape, replaced when none fits
    for (torch::Tensor& t : kept_) {
      if (t.use_count() != 1 || t.storage().use_count() != 1) continue;
      if (t.sizes() == c10::IntArrayRef(shape) && t.scalar_type() == dtype) {
        // The counts are relaxed loads: order the last holder's reads before our writes.
        std::atomic_thread_fence(std::memory_order_acquire);
        return t.alias();
      }
      reusable = &t;
    }
    // A normal tensor even under InferenceMode: a transform copied into a
    // training loader may hand it out later.
    c10::InferenceMode normal(false);
    torch::Tensor fresh = torch::empty(shape, dtype);
    if (kept_.size() < kKeep)
      kept_.push_back(fresh);
    else if (reusable != nullptr)
      *reusable = fresh;
    return fresh.alias();
  }

 private:
  static constexpr size_t kKeep = 4;
  std::mutex mutex_;
  std::vector<torch::Tensor> kept_;
};

}  // namespace

std::function<data::Batch(data::Batch)> augment_transform(augment::AugmentOptions options, uint64_t seed) {
  auto buffers = std::make_shared<BatchBuffers>();
  return [options = std::move(options), seed, buffers](data::Batch b) {
    EMBER_CHECK(
        b.index.defined() && b.index.size(0) == b.size(),
        "[recipe::augment_transform] the batch has no sample indices (batch.index); use a loader that "
        "fills them (data::TensorLoader does)");
    torch::Tensor out;
    if (b.input.is_cpu()) out = buffers->take(augment::output_shape(b.input, options), options.dtype());
    b.input = augment::augment(b.input, b.index, options, seed, b.epoch, out).images;
    return b;
  };
}

augment::MixResult mix_batch(const data::Batch& batch, int64_t num_classes, const augment::MixOptions& mix,
                             uint64_t seed) {
  EMBER_CHECK(batch.index.defined() && batch.index.size(0) == batch.size(),
              "[recipe::mix_batch] the batch has no sample indices (batch.index)");
  if (augment::mixing(mix))
    return augment::mix(batch.input, batch.target, num_classes, batch.index, mix, seed, batch.epoch);
  // No mixing: the images as they are, the labels as (smoothed) one-hot rows.
  torch::Tensor params = torch::zeros({batch.size(), augment::kNumMixParams}, torch::kFloat32);
  params.select(1, augment::kMixLambda).fill_(1.0f);
  return {batch.input,
          augment::one_hot_targets(batch.target, num_classes, mix.label_smoothing(), batch.input.device()),
          params};
}

void declare_classification_keys(core::Config& c, const ClassificationOptions& d) {
  c.declare("data.batch_size", d.batch_size(), "training batch size", Bounds::between(1, 1 << 24));
  c.declare("data.eval_batch_size", d.eval_batch_size(), "validation/test batch size",
            Bounds::between(1, 1 << 24), core::OnResume::kMayChange);
  c.declare("data.train_subset", d.train_subset(), "use the first N training images (0 = all)",
            Bounds::at_least(0));
  c.declare("data.test_subset", d.test_subset(), "use the first N test images (0 = all)",
            Bounds::at_least(0));
  c.declare("data.val_size", d.val_size(), "hold out the last N training images for validation",
            Bounds::at_least(0));
  c.declare("data.prefetch", d.prefetch(),
            "batches prepared ahead by the loader thread (-1: 2 on CUDA, 0 on CPU)", Bounds::between(-1, 64),
            core::OnResume::kMayChange);
  c.declare("data.resident", d.resident(), "on a GPU, keep the uint8 dataset in device memory",
            core::OnResume::kMayChange);
  augment::declare_augment_keys(c, d.augment(), d.mix());
  declare_stream_keys(c);
  c.add_check([](const core::Config& config) { classification_options_from_config(config, RunContext()); });
}

ClassificationOptions classification_options_from_config(const core::Config& c, const RunContext& context) {
  ClassificationOptions o;
  o.device(context.device()).seed(context.seed()).world_size(context.world_size()).rank(context.rank());
  o.batch_size(train_batch_size(c, context))
      .eval_batch_size(c.get_int("data.eval_batch_size"))
      .train_subset(c.get_int("data.train_subset"))
      .test_subset(c.get_int("data.test_subset"))
      .val_size(c.get_int("data.val_size"))
      .prefetch(c.get_int("data.prefetch"))
      .resident(c.get_bool("data.resident"));
  EMBER_CHECK_KIND(kConfig, o.batch_size() >= 1 && o.eval_batch_size() >= 1,
                   "[recipe] data.batch_size={} and data.eval_batch_size={} must be >= 1", o.batch_size(),
                   o.eval_batch_size());
  EMBER_CHECK_KIND(kConfig, o.train_subset() >= 0 && o.test_subset() >= 0,
                   "[recipe] data.train_subset={} and data.test_subset={} must be >= 0 (0 = all)",
                   o.train_subset(), o.test_subset());
  return o.augment(augment::augment_options_from_config(c)).mix(augment::mix_options_from_config(c));
}

namespace {
// 0 (the config's "all") -> -1 (TensorDataset::head's "all").
int64_t all_if_zero(int64_t n) {
  return n > 0 ? n : -1;
}

// Every label in [0, classes): a bad one fails here, before training, not as
// LibTorch's "Target N is out of bounds" in the middle of an epoch.
void check_labels(const torch::Tensor& targets, int64_t classes, const char* split) {
  EMBER_CHECK_KIND(kData, targets.dim() == 1, "[recipe::ClassificationTask] {} labels must be [N], got {}",
                   split, fmt::join(targets.sizes(), "x"));
  const torch::Tensor t = targets.to(torch::kInt64);
  const torch::Tensor bad = ((t < 0) | (t >= classes)).nonzero();
  if (bad.numel() == 0) return;
  const int64_t at = bad.flatten()[0].item<int64_t>();
  throw Error(
      ErrorKind::kData,
      fmt::format("[recipe::ClassificationTask] {} sample {} has label {}, but the model has {} classes "
                  "(labels 0..{}); {} labels are out of range",
                  split, at, t[at].item<int64_t>(), classes, classes - 1, bad.size(0)));
}
}  // namespace

ClassificationTask::ClassificationTask(torch::nn::AnyModule model, ClassificationData d,
                                       const ClassificationOptions& o)
    : model_(std::move(model)), num_classes_(d.num_classes), mix_(o.mix()), seed_(o.seed()) {
  const torch::Device device = o.device();
  const uint64_t seed = o.seed();
  EMBER_CHECK(!model_.is_empty(), "[recipe::ClassificationTask] no model");
  EMBER_CHECK(d.num_classes >= 1, "[recipe::ClassificationTask] num_classes must be >= 1, got {}",
              d.num_classes);
  check_labels(d.train.targets, d.num_classes, "training");
  check_labels(d.test.targets, d.num_classes, "test");
  model_.ptr()->to(device);
  const auto train_options = data::TensorLoaderOptions()
                                 .batch_size(o.batch_size())
                                 .seed(seed)
                                 .prefetch(o.prefetch())
                                 .device(device)
                                 .num_replicas(o.world_size())  // data-parallel: this rank's shard
                                 .rank(o.rank())
                                 .resident(o.resident() && device.is_cuda());
  data::TensorLoaderOptions eval_options = train_options;
  eval_options.batch_size(o.eval_batch_size());
  data::SplitLoaders l = data::make_split_loaders(
      d.train.head(all_if_zero(o.train_subset())), d.test.head(all_if_zero(o.test_subset())),
      data::SplitLoaderOptions()
          .val_size(o.val_size())
          .train(data::with_batch_transform(train_options, augment_transform(o.augment(), seed)))
          .eval(data::with_batch_transform(eval_options,
                                           augment_transform(augment::eval_options(o.augment()), seed))));
  train_ = std::move(l.train), val_ = std::move(l.val), test_ = std::move(l.test);
}

std::unique_ptr<ClassificationTask> ClassificationTask::from_config(const core::Config& c,
                                                                    const RunContext& context,
                                                                    torch::nn::AnyModule model,
                                                                    ClassificationData data) {
  return std::make_unique<ClassificationTask>(std::move(model), std::move(data),
                                              classification_options_from_config(c, context));
}

std::string ClassificationTask::cuda_graph_blocker() const {
  if (!augment::mixing(mix_)) return {};
  return "augment.mix.* draws each batch's mixing parameters on the host (set augment.mix.p=0 or its alphas "
         "to 0)";
}

train::StepOutput ClassificationTask::training_step(const data::Batch& b) {
  if (!augment::mixing(mix_)) {
    if (mix_.label_smoothing() == 0) return evaluation_step(b);
    // Label smoothing alone: cross-entropy's own (the same loss as smoothed one-hot rows, in one kernel).
    torch::Tensor logits = model_.forward(b.input);
    namespace F = torch::nn::functional;
    return {F::cross_entropy(logits, b.target,
                             F::CrossEntropyFuncOptions().label_smoothing(mix_.label_smoothing())),
            logits, b.target};
  }
  // Mixup/CutMix: soft targets for the loss; accuracy against the sample's own label.
  const augment::MixResult m = mix_batch(b, num_classes_, mix_, seed_);
  torch::Tensor logits = model_.forward(m.images);
  return {torch::nn::functional::cross_entropy(logits, m.targets), logits, b.target};
}

train::StepOutput ClassificationTask::evaluation_step(const data::Batch& b) {
  torch::Tensor logits = model_.forward(b.input);
  return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
}

}  // namespace ember::recipe
