// One harness for Ember's device operators: each case is described once (its
// inputs, the op, its CPU reference, the error allowed) and runs on every
// backend this machine has, measuring the largest error against the reference.
// A new kernel adds its cases to cases() below. Backends:
//   Ops.*      the CPU path of the op (when the reference is the CPU path itself,
//              the check is that it repeats bit for bit)
//   OpsCuda.*  the CUDA path (skipped without a GPU; the device check runs *Cuda.*)
// All of today's ops promise bit-exact results (tolerance 0): the CUDA kernels
// run the CPU reference's per-element code.
#include <ember/augment/augment.h>
#include <ember/augment/mix.h>
#include <ember/train/accuracy.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "cuda_test.h"

namespace {

using namespace ember;
using Tensors = std::vector<torch::Tensor>;

struct OpCase {
  std::string name;
  /// Inputs on the CPU (made once, deterministically).
  std::function<Tensors()> inputs;
  /// The op on `inputs` moved to the backend's device; outputs on any device.
  std::function<Tensors(const Tensors& inputs)> run;
  /// The CPU reference on the CPU inputs; empty = the op's own CPU path.
  std::function<Tensors(const Tensors& inputs)> reference;
  /// Largest allowed |output - reference| per element (0: the same bits).
  double tolerance = 0.0;
};

torch::Tensor images(int64_t n, int64_t h, int64_t w, int64_t c, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(0, 256, {n, h, w, c}, gen, torch::kUInt8);
}
torch::Tensor indices(int64_t n, int64_t first = 0) {
  return torch::arange(first, first + n, torch::kInt64);
}

void add_augment_cases(std::vector<OpCase>& cases) {
  using augment::AugmentOptions;
  using augment::CropMode;
  using augment::Layout;
  const std::vector<std::pair<std::string, AugmentOptions>> options = {
      {"identity", AugmentOptions()},
      {"flips", AugmentOptions().hflip(0.5).vflip(0.5)},
      {"pad_crop", AugmentOptions().crop(CropMode::kPad).padding(3).size({24, 32}).hflip(0.5)},
      {"resized_crop", AugmentOptions().crop(CropMode::kRandomResized).size({16, 20}).hflip(0.5)},
      {"resized_up", AugmentOptions().crop(CropMode::kRandomResized).size({64, 48})},
      {"color", AugmentOptions().brightness(0.4).contrast(0.4).saturation(0.4).hue(0.1).grayscale(0.2)},
      {"erase_norm",
       AugmentOptions().erase(0.9).erase_value(0.25).mean({0.5, 0.4, 0.3}).std({0.2, 0.25, 0.3})},
      {"everything", AugmentOptions()
                         .crop(CropMode::kRandomResized)
                         .size({17, 13})
                         .hflip(0.5)
                         .brightness(0.3)
                         .contrast(0.3)
                         .saturation(0.3)
                         .hue(0.05)
                         .erase(0.5)
                         .mean({0.5, 0.4, 0.3})
                         .std({0.2, 0.25, 0.3})},
  };
  for (const auto& [name, base] : options) {
    for (auto dtype : {torch::kFloat32, torch::kFloat16, torch::kBFloat16}) {
      for (auto layout : {Layout::kNCHW, Layout::kNHWC}) {
        const AugmentOptions o = AugmentOptions(base).dtype(dtype).layout(layout);
        OpCase c;
        c.name =
            "augment_" + name + "_" + c10::toString(dtype) + (layout == Layout::kNHWC ? "_nhwc" : "_nchw");
        c.inputs = [] { return Tensors{images(37, 29, 41, 3, 14)}; };
        c.run = [o](const Tensors& in) {
          const augment::AugmentResult r = augment::augment(in[0], indices(37, 1000), o, 21, 3);
          return Tensors{r.images, r.params};
        };
        cases.push_back(c);
      }
    }
  }
  // One channel: brightness and contrast only (colour ops that need three are skipped).
  OpCase gray;
  gray.name = "augment_gray_color_crop";
  gray.inputs = [] { return Tensors{images(9, 20, 20, 1, 15)}; };
  gray.run = [](const Tensors& in) {
    const auto o =
        AugmentOptions().crop(CropMode::kRandomResized).size({12, 12}).brightness(0.3).contrast(0.3);
    return Tensors{augment::augment(in[0], indices(9), o, 4, 0).images};
  };
  cases.push_back(gray);
}

void add_mix_cases(std::vector<OpCase>& cases) {
  using augment::MixOptions;
  const MixOptions both = MixOptions().mixup_alpha(0.4).cutmix_alpha(1.0).label_smoothing(0.1);
  OpCase c;
  c.name = "mix_mixup_cutmix_fp32_nchw";
  c.inputs = [] {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
    return Tensors{torch::rand({16, 3, 8, 8}, gen), torch::arange(16, torch::kInt64) % 10};
  };
  c.run = [both](const Tensors& in) {
    const augment::MixResult r = augment::mix(in[0], in[1], 10, indices(16), both, 1, 0);
    return Tensors{r.images, r.targets, r.params};
  };
  cases.push_back(c);
  OpCase h = c;
  h.name = "mix_mixup_cutmix_bf16_nhwc";
  h.inputs = [] {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
    return Tensors{torch::rand({16, 3, 8, 8}, gen).permute({0, 2, 3, 1}).contiguous().to(torch::kBFloat16),
                   torch::arange(16, torch::kInt64) % 10};
  };
  h.run = [both](const Tensors& in) {
    const augment::MixResult r =
        augment::mix(in[0], in[1], 10, indices(16), MixOptions(both).layout(augment::Layout::kNHWC), 1, 0);
    return Tensors{r.images, r.targets, r.params};
  };
  cases.push_back(h);
}

void add_accuracy_cases(std::vector<OpCase>& cases) {
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kFloat16, torch::kBFloat16}) {
    for (int64_t cols : {1, 3, 10, 31, 32, 33, 1000}) {
      for (int64_t rows : {1, 7, 257, 5000}) {
        OpCase c;
        c.name = std::string("count_correct_") + c10::toString(dtype) + "_" + std::to_string(rows) + "x" +
                 std::to_string(cols);
        c.inputs = [=] {
          // Small integers make ties common, to exercise the lowest-index rule; one NaN row.
          auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(rows * 7919 + cols));
          torch::Tensor logits = torch::randint(0, 4, {rows, cols}, gen).to(dtype);
          if (rows > 3) logits[3][cols / 2] = NAN;
          return Tensors{logits, torch::randint(0, cols, {rows}, gen, torch::kInt64)};
        };
        c.run = [](const Tensors& in) { return Tensors{train::count_correct(in[0], in[1])}; };
        c.reference = [](const Tensors& in) {
          return Tensors{train::count_correct_reference(in[0].to(torch::kFloat64), in[1])};
        };
        cases.push_back(c);
      }
    }
  }
}

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> all = [] {
    std::vector<OpCase> c;
    add_augment_cases(c);
    add_mix_cases(c);
    add_accuracy_cases(c);
    return c;
  }();
  return all;
}

// Runs `op` on `device` and compares every output with the reference.
void check_case(const OpCase& op, const torch::Device& device) {
  const Tensors cpu_inputs = op.inputs();
  Tensors moved;
  for (const auto& t : cpu_inputs) moved.push_back(t.to(device));
  const Tensors got = op.run(moved);
  const Tensors want = op.reference ? op.reference(cpu_inputs) : op.run(cpu_inputs);
  ASSERT_EQ(got.size(), want.size()) << op.name;
  for (size_t k = 0; k < got.size(); ++k) {
    if (k == 0) {
      EXPECT_EQ(got[k].device().type(), device.type()) << op.name << ": the output stays on the device";
    }
    const torch::Tensor g = got[k].cpu(), w = want[k].cpu();
    ASSERT_EQ(g.sizes(), w.sizes()) << op.name << " output " << k;
    ASSERT_EQ(g.scalar_type(), w.scalar_type()) << op.name << " output " << k;
    if (op.tolerance == 0) {
      EXPECT_TRUE(torch::equal(g, w))
          << op.name << " output " << k << ": max error "
          << (g.to(torch::kFloat64) - w.to(torch::kFloat64)).abs().max().item<double>();
    } else {
      const double err = (g.to(torch::kFloat64) - w.to(torch::kFloat64)).abs().max().item<double>();
      EXPECT_LE(err, op.tolerance) << op.name << " output " << k;
    }
  }
}

std::string case_name(const testing::TestParamInfo<size_t>& info) {
  return cases()[info.param].name;
}

class Ops : public testing::TestWithParam<size_t> {};
class OpsCuda : public testing::TestWithParam<size_t> {};

TEST_P(Ops, CpuPathMatchesTheReference) {
  check_case(cases()[GetParam()], torch::kCPU);
}

TEST_P(OpsCuda, CudaPathMatchesTheCpuReference) {
  EMBER_REQUIRE_CUDA();
  check_case(cases()[GetParam()], torch::Device(torch::kCUDA));
}

INSTANTIATE_TEST_SUITE_P(Backend, Ops, testing::Range<size_t>(0, cases().size()), case_name);
INSTANTIATE_TEST_SUITE_P(Backend, OpsCuda, testing::Range<size_t>(0, cases().size()), case_name);

}  // namespace
