// The fused augmentation kernel, run on the CPU: an emulated launch drives
// the kernel's own grid, per-block set-up and per-thread functions
// (lib/src/augment/cuda/augment_grid.h) over every block and thread of every
// launch, and must write each output element exactly once with the bits of
// the CPU reference (a separate, row-wise implementation in augment.cpp).
//
// What this catches without a GPU: index arithmetic, tile edges, the split of
// large batches into launches, layouts, channels, output types and the
// per-pixel arithmetic. What it cannot catch: races, the memory model,
// shared-memory and barrier misuse, streams, and the device's own float
// conversions (the GPU tests and compute-sanitizer on the device check cover
// those).
#include <ember/augment/augment.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "augment/apply_impl.h"
#include "augment/cuda/augment_grid.h"

using namespace ember::augment;
namespace ad = ember::augment::detail;
using ad::Index3;

namespace {

torch::Tensor images(int64_t n, int64_t h, int64_t w, int64_t c, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(0, 256, {n, h, w, c}, gen, torch::kUInt8);
}

struct Emulated {
  torch::Tensor out;            ///< what the kernel would have written
  std::vector<uint8_t> writes;  ///< writes per output element
  int launches = 0;
  std::string error;  ///< first problem seen (empty: none)
};

template <typename Out, bool kNHWC>
void run_grid(const ad::BatchGeometry& g, const uint8_t* src, const float* params, int max_z, Emulated& e) {
  Out* dst = e.out.data_ptr<Out>();
  const int64_t numel = e.out.numel();
  const Index3 block_dim = ad::augment_block_dim();
  int next_first = 0;
  ad::for_each_augment_launch(
      g,
      [&](int first, Index3 grid) {
        ++e.launches;
        if (first != next_first || grid.z < 1 || static_cast<int>(grid.z) > max_z)
          e.error = "launch at sample " + std::to_string(first) + " with grid.z " + std::to_string(grid.z);
        next_first = first + static_cast<int>(grid.z);
        for (unsigned bz = 0; bz < grid.z; ++bz)
          for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
              const Index3 block{bx, by, bz};
              const int n = ad::augment_block_sample(first, block);
              const ad::SamplePlan plan = ad::augment_block_plan(params, g, n);  // thread (0, 0), shared
              for (unsigned ty = 0; ty < block_dim.y; ++ty)
                for (unsigned tx = 0; tx < block_dim.x; ++tx)
                  ad::augment_thread<kNHWC>(src, g, plan, n, block, Index3{tx, ty, 0},
                                            [&](int64_t i, float v) {
                                              if (i < 0 || i >= numel) {
                                                e.error = "store out of bounds at " + std::to_string(i);
                                                return;
                                              }
                                              ++e.writes[static_cast<size_t>(i)];
                                              dst[i] = static_cast<Out>(v);
                                            });
            }
      },
      max_z);
  if (next_first != g.n)
    e.error = "launches covered " + std::to_string(next_first) + " of " + std::to_string(g.n);
}

// The kernel's output for `images` and `params` under `o`, by emulated launch.
Emulated emulate(const torch::Tensor& images, const torch::Tensor& params, const AugmentOptions& o,
                 int max_z = ad::kMaxGridZ) {
  const int64_t oh = o.size().empty() ? images.size(1) : o.size()[0];
  const int64_t ow = o.size().empty() ? images.size(2) : o.size()[1];
  const bool nhwc = o.layout() == Layout::kNHWC;
  ad::ApplySetup setup = ad::setup_apply(images, params, {oh, ow}, o.mean(), o.std(), o.contrast_center(),
                                         o.erase_value(), o.dtype(), nhwc);
  Emulated e;
  e.out = setup.out;
  e.out.fill_(std::numeric_limits<float>::quiet_NaN());  // poison: an unwritten element cannot pass
  e.writes.assign(static_cast<size_t>(e.out.numel()), 0);
  const torch::Tensor src = images.contiguous();
  const torch::Tensor par = params.contiguous();
  const uint8_t* sp = src.data_ptr<uint8_t>();
  const float* pp = par.data_ptr<float>();
  const ad::BatchGeometry& g = setup.geometry;
  switch (o.dtype()) {
    case torch::kFloat32:
      nhwc ? run_grid<float, true>(g, sp, pp, max_z, e) : run_grid<float, false>(g, sp, pp, max_z, e);
      break;
    case torch::kFloat16:
      nhwc ? run_grid<c10::Half, true>(g, sp, pp, max_z, e) : run_grid<c10::Half, false>(g, sp, pp, max_z, e);
      break;
    default:
      nhwc ? run_grid<c10::BFloat16, true>(g, sp, pp, max_z, e)
           : run_grid<c10::BFloat16, false>(g, sp, pp, max_z, e);
      break;
  }
  return e;
}

// Bit-for-bit equality (also tells -0.0 from 0.0 and compares NaN payloads).
bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const torch::Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.nbytes()) == 0;
}

// Emulated kernel == CPU reference, each element written once, for `o` in
// every output type and layout.
void expect_kernel_equals_reference(const torch::Tensor& x, const AugmentOptions& base,
                                    const std::string& what, int max_z = ad::kMaxGridZ,
                                    int expected_launches = -1) {
  const int64_t n = x.size(0);
  const torch::Tensor params =
      sample_params(base, torch::arange(n, torch::kInt64) + 500, x.size(1), x.size(2), 7, 2);
  for (auto dtype : {torch::kFloat32, torch::kFloat16, torch::kBFloat16}) {
    for (auto layout : {Layout::kNCHW, Layout::kNHWC}) {
      const AugmentOptions o = AugmentOptions(base).dtype(dtype).layout(layout);
      const std::string label =
          what + " " + c10::toString(dtype) + (layout == Layout::kNHWC ? " NHWC" : " NCHW");
      const Emulated e = emulate(x, params, o, max_z);
      ASSERT_TRUE(e.error.empty()) << label << ": " << e.error;
      if (expected_launches >= 0) {
        EXPECT_EQ(e.launches, expected_launches) << label;
      }
      size_t unwritten = 0, rewritten = 0;
      for (uint8_t w : e.writes) {
        unwritten += w == 0;
        rewritten += w > 1;
      }
      EXPECT_EQ(unwritten, 0u) << label << ": elements never written";
      EXPECT_EQ(rewritten, 0u) << label << ": elements written more than once";
      const torch::Tensor want = apply(x, params, o);  // the CPU reference
      EXPECT_TRUE(same_bits(e.out, want)) << label << ": max |diff| "
                                          << (e.out.to(torch::kFloat64) - want.to(torch::kFloat64))
                                                 .abs()
                                                 .nan_to_num(1e30)
                                                 .max()
                                                 .item<double>();
    }
  }
}

const AugmentOptions kAll = AugmentOptions()
                                .crop(CropMode::kRandomResized)
                                .hflip(0.5)
                                .vflip(0.3)
                                .brightness(0.4)
                                .contrast(0.4)
                                .saturation(0.4)
                                .hue(0.1)
                                .grayscale(0.2)
                                .erase(0.6)
                                .erase_value(0.25);

}  // namespace

TEST(AugmentEmulated, TileEdgesAndOddSizes) {
  const torch::Tensor x = images(5, 66, 61, 3, 1);
  // Outputs exactly one tile, one past a tile in each axis, narrower than a
  // warp, one pixel, and odd sizes spanning several tiles (padded crops of
  // up to 74 x 69 fit the padded image).
  for (std::vector<int64_t> size :
       {std::vector<int64_t>{32, 32}, {33, 33}, {31, 64}, {1, 1}, {17, 13}, {70, 45}}) {
    const std::string what = std::to_string(size[0]) + "x" + std::to_string(size[1]);
    expect_kernel_equals_reference(x, AugmentOptions(kAll).size(size), "resized " + what);
    expect_kernel_equals_reference(x, AugmentOptions().crop(CropMode::kPad).padding(4).size(size).hflip(0.5),
                                   "padded " + what);
  }
}

TEST(AugmentEmulated, EveryOperationAndNormalisation) {
  const torch::Tensor x = images(6, 20, 24, 3, 2);
  expect_kernel_equals_reference(x, AugmentOptions(), "identity");
  expect_kernel_equals_reference(x, AugmentOptions().hflip(0.5).vflip(0.5), "flips");
  expect_kernel_equals_reference(x, AugmentOptions().crop(CropMode::kRandomResized).size({48, 40}),
                                 "upscaling");
  expect_kernel_equals_reference(
      x, AugmentOptions().brightness(0.5).contrast(0.5).saturation(0.5).hue(0.2).grayscale(0.5), "colour");
  expect_kernel_equals_reference(
      x, AugmentOptions(kAll).size({16, 16}).mean({0.5, 0.4, 0.3}).std({0.2, 0.25, 0.3}), "all, normalised");
}

TEST(AugmentEmulated, OneChannel) {
  const torch::Tensor x = images(7, 28, 28, 1, 3);
  expect_kernel_equals_reference(x, AugmentOptions(kAll).size({28, 28}), "gray resized");
  expect_kernel_equals_reference(x,
                                 AugmentOptions()
                                     .crop(CropMode::kPad)
                                     .padding(4)
                                     .hflip(0.5)
                                     .brightness(0.3)
                                     .contrast(0.3)
                                     .mean({0.3})
                                     .std({0.35}),
                                 "gray padded, normalised");
}

TEST(AugmentEmulated, BatchesSplitIntoLaunches) {
  // A small limit splits a small batch the way 65535 splits a large one.
  const torch::Tensor x = images(10, 9, 11, 3, 4);
  expect_kernel_equals_reference(x, AugmentOptions(kAll).size({40, 8}), "10 samples, 4 per launch", 4, 3);
  expect_kernel_equals_reference(x, AugmentOptions(kAll).size({40, 8}), "10 samples, 5 per launch", 5, 2);
  expect_kernel_equals_reference(x, AugmentOptions(kAll).size({40, 8}), "10 samples, 1 per launch", 1, 10);
}

TEST(AugmentEmulated, BatchesPastTheGridLimitTakeTwoLaunches) {
  // More samples than gridDim.z allows (65535), with the kernel's real limit.
  const torch::Tensor x = images(70000, 2, 3, 3, 5);
  const AugmentOptions o = AugmentOptions().hflip(0.5).brightness(0.3).erase(0.5).erase_scale({0.1, 0.5});
  const torch::Tensor params = sample_params(o, torch::arange(70000, torch::kInt64), 2, 3, 1, 0);
  const Emulated e = emulate(x, params, o);
  ASSERT_TRUE(e.error.empty()) << e.error;
  EXPECT_EQ(e.launches, 2);
  EXPECT_EQ(std::count(e.writes.begin(), e.writes.end(), uint8_t{1}),
            static_cast<ptrdiff_t>(e.writes.size()));
  EXPECT_TRUE(same_bits(e.out, apply(x, params, o)));
}

TEST(AugmentEmulated, EmptyBatchLaunchesNothing) {
  const torch::Tensor x = images(0, 8, 8, 3, 6);
  const Emulated e = emulate(x, torch::zeros({0, kNumParams}), AugmentOptions());
  EXPECT_TRUE(e.error.empty()) << e.error;
  EXPECT_EQ(e.launches, 0);
  EXPECT_EQ(e.out.numel(), 0);
}
