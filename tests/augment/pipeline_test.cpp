// augment.* config keys and the loader transform keyed by batch.index/epoch.
#include <ember/augment/pipeline.h>
#include <ember/core/error.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace ember;
using namespace ember::augment;

TEST(AugmentPipeline, ConfigKeysRoundTripAndReject) {
  core::Config c;
  declare_augment_keys(c, AugmentOptions().crop(CropMode::kPad).padding(2).hflip(0.5), MixOptions().cutmix_alpha(1.0));
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
  for (const char* bad : {"augment.crop=random", "augment.size=[2.5, 3]", "augment.dtype=int8", "augment.hflip=2",
                          "augment.hue=0.9", "augment.layout=chw"}) {
    core::Config b;
    declare_augment_keys(b);
    b.set_override(bad);
    EXPECT_THROW(augment_options_from_config(b), Error) << bad;
  }
  core::Config m;
  declare_augment_keys(m);
  m.set_override("augment.mix.label_smoothing=1.5");
  EXPECT_THROW(mix_options_from_config(m), Error);
}

TEST(AugmentPipeline, LoaderTransformIsKeyedByIndexAndEpochAndSurvivesResume) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  data::TensorDataset ds{torch::randint(0, 256, {40, 12, 12, 3}, gen, torch::kUInt8), torch::arange(40, torch::kInt64)};
  const AugmentOptions o = AugmentOptions().crop(CropMode::kRandomResized).size({8, 8}).hflip(0.5).brightness(0.3);
  data::TensorLoader loader(ds, data::TensorLoaderOptions().set_batch_size(16).set_seed(9).set_transform(batch_transform(o, 77)));
  loader.start_epoch(2, 0);
  std::vector<torch::Tensor> first;
  while (auto b = loader.next()) {
    ASSERT_EQ(b->input.sizes(), (std::vector<int64_t>{b->size(), 3, 8, 8}));
    const torch::Tensor want = augment::augment(ds.inputs.index_select(0, b->index), b->index, o, 77, 2).images;
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
  EXPECT_THROW(batch_transform(o, 1)(bare), Error);
}

TEST(AugmentPipeline, MixBatchGivesSoftTargetsWithOrWithoutMixing) {
  data::Batch b;
  b.input = torch::rand({6, 3, 4, 4});
  b.target = torch::tensor({0, 2, 1, 2, 0, 1}, torch::kInt64);
  b.index = torch::arange(10, 16, torch::kInt64);
  b.epoch = 3;
  const MixResult plain = mix_batch(b, 3, MixOptions().label_smoothing(0.3), 5);
  EXPECT_TRUE(torch::equal(plain.images, b.input));
  const torch::Tensor want = torch::full({6, 3}, 0.1f).scatter_(1, b.target.view({6, 1}), 0.8f);
  EXPECT_TRUE(torch::allclose(plain.targets, want));
  const MixOptions mo = MixOptions().mixup_alpha(0.4);
  const MixResult mixed = mix_batch(b, 3, mo, 5);
  EXPECT_TRUE(torch::equal(mixed.images, mix(b.input, b.target, 3, b.index, mo, 5, 3).images));
  EXPECT_FALSE(torch::equal(mixed.images, b.input));
  EXPECT_THROW(mix_batch(b, 2, MixOptions(), 5), Error) << "label 2 out of range for 2 classes";
}
