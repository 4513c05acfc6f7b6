// ClassificationTask and its pieces: the augment.* keys, the loader
// transform keyed by batch.index/epoch, soft targets, the data split.
#include <ember/augment/keys.h>
#include <ember/core/error.h>
#include <ember/recipe/classification.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tolerance.h"

using namespace ember;
using namespace ember::augment;
using recipe::augment_transform;
using recipe::mix_batch;

TEST(Classification, ConfigKeysRoundTripAndReject) {
  core::Config c;
  declare_augment_keys(c, AugmentOptions().crop(CropMode::kPad).padding(2).hflip(0.5),
                       MixOptions().cutmix_alpha(1.0));
  AugmentOptions o = augment_options_from_config(c);
  EXPECT_EQ(o.crop(), CropMode::kPad);
  EXPECT_EQ(o.padding(), 2);
  EXPECT_EQ(o.hflip(), 0.5);
  EXPECT_EQ(mix_options_from_config(c).cutmix_alpha(), 1.0);
  c.set_override("augment.crop=resized");
  c.set_override("augment.size=[24, 32]");
  c.set_override("augment.dtype=bfloat16");
  c.set_override("augment.layout=nhwc");
  c.set_override("augment.brightness=0.3");
  o = augment_options_from_config(c);
  EXPECT_EQ(o.crop(), CropMode::kRandomResized);
  EXPECT_EQ(o.size(), (std::vector<int64_t>{24, 32}));
  EXPECT_EQ(o.dtype(), torch::kBFloat16);
  EXPECT_EQ(o.layout(), Layout::kNHWC);
  EXPECT_EQ(o.brightness(), 0.3);
  for (const char* bad : {"augment.crop=random", "augment.size=[2.5, 3]", "augment.dtype=int8",
                          "augment.hflip=2", "augment.hue=0.9", "augment.layout=chw"}) {
    core::Config b;
    declare_augment_keys(b);
    try {  // refused where it is set (bounds) or where it is read (names, integers)
      b.set_override(bad);
      augment_options_from_config(b);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kConfig) << bad << ": " << e.what();
    }
  }
  core::Config m;
  declare_augment_keys(m);
  EXPECT_THROW(m.set_override("augment.mix.label_smoothing=1.5"), Error);
}

// On the CPU the transform writes into an output batch it made before once
// nothing else holds that batch, never into one still held (by the caller, a
// view of it, a queue): every batch keeps the values of a fresh one.
TEST(Classification, TransformReusesOnlyReleasedBatches) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const torch::Tensor pixels = torch::randint(0, 256, {16, 12, 12, 3}, gen, torch::kUInt8);
  const AugmentOptions o = AugmentOptions()
                               .crop(CropMode::kRandomResized)
                               .size({8, 8})
                               .hflip(0.5)
                               .mean({0.5, 0.5, 0.5})
                               .std({0.2, 0.2, 0.2});
  const auto transform = augment_transform(o, 5);
  const auto batch = [&](int64_t first) {
    data::Batch b;
    b.index = torch::arange(first, first + 4, torch::kInt64);
    b.input = pixels.index_select(0, b.index);
    b.epoch = 1;
    return b;
  };
  const auto fresh = [&](int64_t first) {
    const data::Batch b = batch(first);
    return augment::augment(b.input, b.index, o, 5, 1).images;
  };
  torch::Tensor a = transform(batch(0)).input;
  const void* a_memory = a.data_ptr();
  torch::Tensor b = transform(batch(4)).input;  // a is held: another buffer
  EXPECT_NE(b.data_ptr(), a_memory);
  EXPECT_TRUE(torch::equal(a, fresh(0)));
  EXPECT_TRUE(torch::equal(b, fresh(4)));
  const void* b_memory = b.data_ptr();
  const torch::Tensor b_row = b.select(0, 1);  // a view holds b's memory
  a.reset();
  b.reset();
  torch::Tensor c = transform(batch(8)).input;  // a's memory, free again
  EXPECT_EQ(c.data_ptr(), a_memory);
  EXPECT_TRUE(torch::equal(c, fresh(8)));
  torch::Tensor d = transform(batch(12)).input;  // neither c's (held) nor b's (its row is held)
  EXPECT_NE(d.data_ptr(), a_memory);
  EXPECT_NE(d.data_ptr(), b_memory);
  EXPECT_TRUE(torch::equal(c, fresh(8)));
  EXPECT_TRUE(torch::equal(b_row, fresh(4).select(0, 1)));
  EXPECT_TRUE(torch::equal(d, fresh(12)));
  // A last, smaller batch gets a buffer of its own size.
  data::Batch tail = batch(0);
  tail.index = tail.index.narrow(0, 0, 3);
  tail.input = tail.input.narrow(0, 0, 3);
  EXPECT_EQ(transform(tail).input.size(0), 3);
}

TEST(Classification, LoaderTransformIsKeyedByIndexAndEpochAndSurvivesResume) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  data::TensorDataset ds{torch::randint(0, 256, {40, 12, 12, 3}, gen, torch::kUInt8),
                         torch::arange(40, torch::kInt64)};
  const AugmentOptions o =
      AugmentOptions().crop(CropMode::kRandomResized).size({8, 8}).hflip(0.5).brightness(0.3);
  data::TensorLoader loader(
      ds, data::TensorLoaderOptions().batch_size(16).seed(9).transform(augment_transform(o, 77)));
  loader.start_epoch(2, 0);
  std::vector<torch::Tensor> first;
  while (auto b = loader.next()) {
    ASSERT_EQ(b->input.sizes(), (std::vector<int64_t>{b->size(), 3, 8, 8}));
    const torch::Tensor want =
        augment::augment(ds.inputs.index_select(0, b->index), b->index, o, 77, 2).images;
    EXPECT_TRUE(torch::equal(b->input, want));
    EXPECT_TRUE(torch::equal(b->target, b->index));
    first.push_back(b->input);
  }
  loader.start_epoch(2, 1);  // resume after the first batch: the same augmentations
  for (size_t k = 1; k < first.size(); ++k) EXPECT_TRUE(torch::equal(loader.next()->input, first[k]));
  loader.start_epoch(3, 0);
  EXPECT_FALSE(torch::equal(loader.next()->input, first[0]));
  // A batch without indices is a clear error.
  data::Batch bare;
  bare.input = ds.inputs.narrow(0, 0, 2);
  bare.target = ds.targets.narrow(0, 0, 2);
  EXPECT_THROW(augment_transform(o, 1)(bare), Error);
}

TEST(Classification, MixBatchGivesSoftTargetsWithOrWithoutMixing) {
  data::Batch b;
  b.input = torch::rand({6, 3, 4, 4});
  b.target = torch::tensor({0, 2, 1, 2, 0, 1}, torch::kInt64);
  b.index = torch::arange(10, 16, torch::kInt64);
  b.epoch = 3;
  const MixResult plain = mix_batch(b, 3, MixOptions().label_smoothing(0.3), 5);
  EXPECT_TRUE(torch::equal(plain.images, b.input));
  const torch::Tensor want = torch::full({6, 3}, 0.1f).scatter_(1, b.target.view({6, 1}), 0.8f);
  // 0.3 / 3 and 1 - 0.3 + 0.1 in float64, rounded to float32, and lambda = 1 blends (float32,
  // values <= 1): ~4 roundings of 1 against the constants' one.
  EXPECT_TRUE(test_util::near(plain.targets, want, test_util::rounding_bound(torch::kFloat32, 4, 1.0)));
  const MixOptions mo = MixOptions().mixup_alpha(0.4);
  const MixResult mixed = mix_batch(b, 3, mo, 5);
  EXPECT_TRUE(torch::equal(mixed.images, mix(b.input, b.target, 3, b.index, mo, 5, 3).images));
  EXPECT_FALSE(torch::equal(mixed.images, b.input));
  EXPECT_THROW(mix_batch(b, 2, MixOptions(), 5), Error) << "label 2 out of range for 2 classes";
}

namespace {

// Linear logits over the mean of each channel: any image size, deterministic.
struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl() { fc = register_module("fc", torch::nn::Linear(3, 4)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc->forward(x.mean({2, 3})); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(TinyNet);

recipe::ClassificationData images(int64_t n_train, int64_t n_test) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto make = [&](int64_t n) {
    return data::TensorDataset{torch::randint(0, 256, {n, 8, 8, 3}, gen, torch::kUInt8),
                               torch::randint(0, 4, {n}, gen, torch::kInt64)};
  };
  return {make(n_train), make(n_test), 4};
}

}  // namespace

TEST(Classification, TaskSplitsShardsAndNormalisesEvaluationData) {
  core::Config c;
  recipe::declare_classification_keys(
      c, recipe::ClassificationOptions().batch_size(10).eval_batch_size(7).augment(
             AugmentOptions().hflip(0.5).mean({0.5, 0.5, 0.5}).std({0.25, 0.25, 0.25})));
  c.set_override("data.val_size=12");
  c.set_override("data.train_subset=52");
  torch::manual_seed(0);
  auto task = recipe::ClassificationTask::from_config(c, recipe::RunContext().seed(3),
                                                      torch::nn::AnyModule(TinyNet()), images(60, 9));
  EXPECT_EQ(task->train_loader().num_samples(), 40) << "52 kept, the last 12 held out";
  ASSERT_NE(task->val_loader(), nullptr);
  EXPECT_EQ(task->val_loader()->num_samples(), 12);
  EXPECT_EQ(task->test_loader()->num_samples(), 9);
  EXPECT_EQ(task->val_loader()->num_batches(), 2) << "eval batches of 7";
  // Validation: normalised, never flipped (eval_options), the same every epoch.
  task->val_loader()->start_epoch(0, 0);
  const data::Batch v0 = *task->val_loader()->next();
  task->val_loader()->start_epoch(5, 0);
  const data::Batch v5 = *task->val_loader()->next();
  EXPECT_TRUE(torch::equal(v0.input, v5.input));
  EXPECT_EQ(v0.input.sizes(), (std::vector<int64_t>{7, 3, 8, 8}));
  const auto ds = images(60, 9).train;
  const torch::Tensor want =
      (ds.inputs.narrow(0, 40, 7).permute({0, 3, 1, 2}).to(torch::kFloat32) / 255.0 - 0.5) / 0.25;
  // The augment path's (x * (1/255) - 0.5) * 4 against ATen's (x / 255 - 0.5) / 0.25 (float32):
  // 3 roundings of values <= 1 on each side, then x 4 (exact): 6 eps of 4.
  EXPECT_TRUE(test_util::near(v0.input, want, test_util::rounding_bound(torch::kFloat32, 6, 4.0)));
  // Without mixing or smoothing a training step is the plain labelled loss.
  task->train_loader().start_epoch(0, 0);
  const data::Batch b = *task->train_loader().next();
  const train::StepOutput a = task->training_step(b), e = task->evaluation_step(b);
  EXPECT_TRUE(torch::equal(a.loss, e.loss));  // bitwise: one forward and one loss on the same batch
  EXPECT_TRUE(torch::equal(a.target, b.target));
}

TEST(Classification, TheContextGivesDeviceSeedShardAndAToolsBatchSize) {
  core::Config c;
  recipe::declare_classification_keys(c, recipe::ClassificationOptions().batch_size(10));
  const recipe::RunContext ctx = recipe::RunContext().seed(9).world_size(4).rank(3);
  recipe::ClassificationOptions o = recipe::classification_options_from_config(c, ctx);
  EXPECT_EQ(o.batch_size(), 10) << "data.batch_size";
  EXPECT_EQ(o.seed(), 9u);
  EXPECT_EQ(o.world_size(), 4);
  EXPECT_EQ(o.rank(), 3);
  EXPECT_EQ(o.device(), torch::Device(torch::kCPU));
  recipe::RunContext probe = ctx;
  probe.batch_size(3);  // a recipe tool's probe
  o = recipe::classification_options_from_config(c, probe);
  EXPECT_EQ(o.batch_size(), 3);
  EXPECT_EQ(c.get_int("data.batch_size"), 10) << "the config is not written";
  auto task =
      recipe::ClassificationTask::from_config(c, probe, torch::nn::AnyModule(TinyNet()), images(48, 8));
  EXPECT_EQ(task->train_loader().num_samples(), 12) << "rank 3 of 4";
  EXPECT_EQ(task->train_loader().num_batches(), 4) << "batches of 3";
}

TEST(Classification, LabelSmoothingTrainsOnSoftTargetsAndEvaluatesOnLabels) {
  core::Config c;
  recipe::declare_classification_keys(c, recipe::ClassificationOptions().batch_size(8));
  c.set_override("augment.mix.label_smoothing=0.2");
  torch::manual_seed(0);
  auto task = recipe::ClassificationTask::from_config(c, recipe::RunContext().world_size(2).rank(1),
                                                      torch::nn::AnyModule(TinyNet()), images(32, 8));
  EXPECT_EQ(task->train_loader().num_samples(), 16) << "rank 1 of 2 trains on half";
  EXPECT_EQ(task->test_loader()->num_samples(), 8) << "every rank tests on all";
  task->train_loader().start_epoch(0, 0);
  const data::Batch b = *task->train_loader().next();
  const train::StepOutput smoothed = task->training_step(b), plain = task->evaluation_step(b);
  const torch::Tensor soft = torch::nn::functional::cross_entropy(
      plain.output, torch::full({b.size(), 4}, 0.05f).scatter_(1, b.target.view({-1, 1}), 0.85f));
  // The same logits; the soft targets' constants may differ by a rounding (float32), and the loss
  // sums 4 classes and averages 8 samples otherwise: ~16 roundings of its terms t log p.
  const double bound =
      test_util::rounding_bound(torch::kFloat32, 16, test_util::max_abs(torch::log_softmax(plain.output, 1)));
  EXPECT_TRUE(test_util::near(smoothed.loss, soft, bound));
  EXPECT_FALSE(test_util::near(smoothed.loss, plain.loss, bound));
  EXPECT_TRUE(torch::equal(smoothed.target, b.target)) << "accuracy against the labels";
}

TEST(Classification, TaskRejectsOutOfRangeLabelsBeforeTraining) {
  const auto task_of = [](recipe::ClassificationData d) {
    return recipe::ClassificationTask(torch::nn::AnyModule(TinyNet()), std::move(d),
                                      recipe::ClassificationOptions().batch_size(4));
  };
  recipe::ClassificationData d = images(20, 6);
  d.test.targets[4] = 4;  // 4 classes: labels 0..3
  try {
    task_of(d);
    ADD_FAILURE() << "label 4 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kData);
    EXPECT_NE(std::string(e.what()).find("test sample 4 has label 4"), std::string::npos) << e.what();
  }
  d = images(20, 6);
  d.train.targets[7] = -1;
  EXPECT_THROW(task_of(d), Error);
  EXPECT_NO_THROW(task_of(images(20, 6)));
}
