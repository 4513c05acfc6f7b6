#pragma once
// ClassificationTask: image classification on any labelled dataset with any
// model, the data.* and augment.* keys, and soft targets for Mixup/CutMix.
// The image recipes (fashion_mnist, cifar_resnet, image_folder,
// prune_finetune) are a dataset and a model handed to it:
//
//   spec.declare = [](ember::core::Config& c) {
//     c.declare("data.root", "/usr/share/datasets/fashion-mnist", "...");
//     ember::recipe::declare_classification_keys(c, ember::recipe::ClassificationOptions().batch_size(128));
//   };
//   spec.make_task = [](const ember::core::Config& c, const ember::recipe::RunContext& ctx) {
//     ember::models::FashionNet net;
//     const std::string root = c.get_string("data.root");
//     return ember::recipe::ClassificationTask::from_config(
//         c, ctx, torch::nn::AnyModule(net),
//         {ember::data::load_mnist(root, ember::data::Split::kTrain),
//          ember::data::load_mnist(root, ember::data::Split::kTest), 10});
//   };
//
// Batches: uint8 images are augmented (training) or only normalised and cast
// (validation, test) by augment::augment, on the loader's thread before the
// copy on the CPU, by the fused kernel after it on a GPU; training batches
// are then mixed (augment.mix.*) into soft targets when the keys ask for it.
// Accuracy is always measured against each sample's own label.

#include <torch/arg.h>
#include <torch/nn/modules/container/any.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "ember/augment/augment.h"
#include "ember/augment/decode.h"
#include "ember/augment/keys.h"
#include "ember/augment/mix.h"
#include "ember/core/config.h"
#include "ember/data/loader.h"
#include "ember/data/shard_cache.h"
#include "ember/data/shard_loader.h"
#include "ember/recipe/run_context.h"
#include "ember/train/task.h"

namespace ember::recipe {

/// A loader transform: batch.input (uint8 [B, H, W, C], [B, H, W] or
/// [B, 1, H, W]) -> augmented images, random per sample from (seed,
/// batch.index, batch.epoch), so a resumed run sees the same augmentations.
/// Runs on the batch's device. On the CPU the output batches are reused once
/// nothing else holds them (up to 4 kept; the transform's copies share them).
std::function<data::Batch(data::Batch)> augment_transform(augment::AugmentOptions options, uint64_t seed);

/// The images and soft targets a classification step trains on: Mixup/CutMix
/// of `batch` (keyed on batch.index and batch.epoch) when `mix` asks for it,
/// else the batch's images with its labels as (smoothed) one-hot rows. Train
/// with cross_entropy(model(r.images), r.targets) in both cases; measure
/// accuracy against batch.target.
augment::MixResult mix_batch(const data::Batch& batch, int64_t num_classes, const augment::MixOptions& mix,
                             uint64_t seed);

/// The data side of a classification recipe (the data.* and augment.* keys).
struct ClassificationOptions {
  /// Training batch size.
  TORCH_ARG(int64_t, batch_size) = 128;
  /// Validation and test batch size.
  TORCH_ARG(int64_t, eval_batch_size) = 1000;
  /// Train on the first N training samples / test on the first N test samples (0 = all).
  TORCH_ARG(int64_t, train_subset) = 0;
  TORCH_ARG(int64_t, test_subset) = 0;
  /// Hold out the last N training samples for validation (0 = none).
  TORCH_ARG(int64_t, val_size) = 0;
  /// Batches prepared ahead by the loader thread (-1: 2 on CUDA, 0 on CPU).
  TORCH_ARG(int64_t, prefetch) = -1;
  /// On a GPU, keep the uint8 dataset in device memory (data::TensorLoaderOptions::resident).
  TORCH_ARG(bool, resident) = false;
  /// Training augmentation; validation and test apply augment::eval_options of it.
  TORCH_ARG(augment::AugmentOptions, augment);
  /// Mixup/CutMix and label smoothing of the training targets.
  TORCH_ARG(augment::MixOptions, mix);
  /// Where batches go (the model is moved there too).
  TORCH_ARG(torch::Device, device) = torch::kCPU;
  /// Seed of shuffling, augmentation and mixing (RunContext::seed: trainer.seed).
  TORCH_ARG(uint64_t, seed) = 0;
  /// Training is sharded over `world_size` processes, this one being `rank`
  /// (RunContext::world_size, rank); validation and test are not.
  TORCH_ARG(int64_t, world_size) = 1;
  TORCH_ARG(int64_t, rank) = 0;
};

/// Declares data.{batch_size, eval_batch_size, train_subset, test_subset,
/// val_size, prefetch, resident}, the augment.* keys with `defaults`, and
/// the streaming keys (declare_stream_keys).
void declare_classification_keys(core::Config& config, const ClassificationOptions& defaults);
/// ClassificationOptions from those keys and the run's context: its device,
/// seed, rank and world size, and train_batch_size (a tool's batch, else
/// data.batch_size). Bad values are config errors.
ClassificationOptions classification_options_from_config(const core::Config& config,
                                                         const RunContext& context);

/// A labelled dataset: uint8 images, int64 labels in [0, num_classes).
struct ClassificationData {
  data::TensorDataset train;
  data::TensorDataset test;
  int64_t num_classes = 0;
};

/// A streamed labelled dataset: WebDataset shards (docs/data.md) whose samples
/// hold an image (KEY.jpg, .jpeg or .png: decoded straight into the augmented
/// crop, augment/decode.h) or a raw uint8 tensor (KEY.npy: augmented whole, as
/// in memory), and a label (StreamOptions::label). Shards with their sample
/// counts known (a manifest, or data::count_samples).
struct ClassificationShards {
  std::vector<data::ShardInfo> train;
  std::vector<data::ShardInfo> val;  ///< empty: no validation
  std::vector<data::ShardInfo> test;
  int64_t num_classes = 0;
};

/// How shards are streamed and decoded (the data.stream.* keys).
struct StreamOptions {
  /// The loaders' options: order (streams, shuffle_block), readers, decode
  /// threads, read_ahead, on_error, max_member_bytes. Batch size, seed,
  /// ranks, device and transforms are set by the task.
  TORCH_ARG(data::ShardLoaderOptions, loader);
  /// Retries of http(s):// shards.
  TORCH_ARG(data::HttpOptions, http);
  /// JPEG/PNG decoding: DCT scaling, max_pixels, the evaluation resize.
  TORCH_ARG(augment::DecodeOptions, decode);
  /// Where a sample's label is: "cls" (KEY.cls, an integer as text) or
  /// "json:FIELD" (an integer field of KEY.json).
  TORCH_ARG(std::string, label) = "cls";
  /// The local cache of remote shards (data.stream.cache_dir), shared by the
  /// task's loaders; none: remote shards are read from their URL at each visit.
  TORCH_ARG(std::shared_ptr<data::ShardCache>, cache);
  /// The training loader's served log (data.stream.served_log; "{rank}" replaced by the rank).
  TORCH_ARG(std::string, served_log);
  /// Decode JPEG images on the GPU with nvJPEG (data.stream.nvjpeg; needs a CUDA device).
  TORCH_ARG(bool, nvjpeg) = false;
};

/// How the shards of `stream` are opened: through its cache when it has one.
data::ShardOpener shard_opener(const StreamOptions& stream);

/// Declares data.shards, data.val_shards, data.test_shards, data.num_classes
/// and the data.stream.* keys (docs/data.md).
void declare_stream_keys(core::Config& config);
/// Whether the run streams shards (data.shards is set).
bool streaming(const core::Config& config);
StreamOptions stream_options_from_config(const core::Config& config);
/// The shards the keys name, their sample counts filled in (a manifest's, or
/// counted once and cached under data.stream.count_cache). Checks what the
/// in-memory keys cannot do with shards (train_subset, test_subset, val_size).
ClassificationShards classification_shards_from_config(const core::Config& config,
                                                       const StreamOptions& stream);

/// Decodes a classification sample: the image or tensor, and its label
/// checked against `num_classes`. `options` is the augmentation the image is
/// cropped and flipped by (training) or augment::eval_options of it. With
/// stream.nvjpeg(), JPEG images are decoded on `device` (a CUDA device) by a
/// decoder of each decoder thread (augment/nvjpeg.h); PNG on the CPU, then copied there.
data::SampleDecoder classification_decoder(const augment::AugmentOptions& options, uint64_t seed,
                                           const StreamOptions& stream, int64_t num_classes,
                                           torch::Device device = torch::kCPU);

class ClassificationTask : public train::Task {
 public:
  /// `model` maps float images [B, C, H, W] to logits [B, num_classes]; it is
  /// moved to options.device().
  ClassificationTask(torch::nn::AnyModule model, ClassificationData data,
                     const ClassificationOptions& options);

  /// Streams `shards` through data::ShardLoader (training sharded between
  /// the ranks as TensorLoader would; validation and test whole on every rank).
  ClassificationTask(torch::nn::AnyModule model, ClassificationShards shards,
                     const ClassificationOptions& options, const StreamOptions& stream);

  /// With classification_options_from_config(config, context).
  static std::unique_ptr<ClassificationTask> from_config(const core::Config& config,
                                                         const RunContext& context,
                                                         torch::nn::AnyModule model, ClassificationData data);
  /// Streamed: the shards the data.shards keys name (streaming(config) must
  /// hold); `num_classes` the recipe's (0: data.num_classes).
  static std::unique_ptr<ClassificationTask> from_shards(const core::Config& config,
                                                         const RunContext& context,
                                                         torch::nn::AnyModule model, int64_t num_classes);

  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  /// Cross-entropy on mixed soft targets (or the labels when nothing is mixed
  /// or smoothed); accuracy against the labels.
  train::StepOutput training_step(const data::Batch& batch) override;
  /// Cross-entropy and accuracy against the labels.
  train::StepOutput evaluation_step(const data::Batch& batch) override;
  data::Loader& train_loader() override { return *train_; }
  data::Loader* val_loader() override { return val_.get(); }
  data::Loader* test_loader() override { return test_.get(); }
  /// Mixing (augment.mix.*) draws each batch's parameters on the host.
  std::string cuda_graph_blocker() const override;

  int64_t num_classes() const { return num_classes_; }

 private:
  torch::nn::AnyModule model_;
  int64_t num_classes_;
  augment::MixOptions mix_;
  uint64_t seed_;
  std::unique_ptr<data::Loader> train_, val_, test_;
};

}  // namespace ember::recipe
