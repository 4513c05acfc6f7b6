#include <ember/data/loader.h>
#include <gtest/gtest.h>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <ember/core/error.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "batches.h"
#include "cuda_test.h"

using namespace ember;

using test_util::collect;
using test_util::expect_same_batches;

namespace {
data::TensorDataset numbered(int64_t n) {
  return {torch::arange(n, torch::kInt64).unsqueeze(1).repeat({1, 3}), torch::arange(n, torch::kInt64)};
}

std::vector<int64_t> drain(data::Loader& loader, int64_t epoch, int64_t skip = 0) {
  loader.start_epoch(epoch, skip);
  std::vector<int64_t> out;
  while (auto b = loader.next()) {
    EXPECT_TRUE(torch::equal(b->input.select(1, 0), b->target));  // inputs and targets stay paired
    for (int64_t i = 0; i < b->size(); ++i) out.push_back(b->target[i].item<int64_t>());
  }
  return out;
}
}  // namespace

TEST(TensorLoader, EachEpochIsAPermutationFixedBySeedAndEpoch) {
  data::TensorLoader a(numbered(103), data::TensorLoaderOptions().batch_size(10).seed(5).prefetch(2));
  data::TensorLoader b(numbered(103), data::TensorLoaderOptions().batch_size(10).seed(5).prefetch(0));
  EXPECT_EQ(data::TensorLoader(numbered(8), data::TensorLoaderOptions()).options().prefetch(),
            0);  // auto on CPU
  EXPECT_EQ(a.num_batches(), 11);
  const auto e0 = drain(a, 0), e1 = drain(a, 1);
  EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()).size(), 103u);
  EXPECT_NE(e0, e1);           // reshuffled per epoch
  EXPECT_EQ(e0, drain(b, 0));  // prefetching changes nothing
  EXPECT_EQ(e1, drain(a, 1));  // replayable
  data::TensorLoader c(numbered(103), data::TensorLoaderOptions().batch_size(10).seed(6));
  EXPECT_NE(e0, drain(c, 0));  // the seed matters
}

TEST(TensorLoader, SkippingBatchesResumesTheSameOrder) {
  data::TensorLoader a(numbered(50), data::TensorLoaderOptions().batch_size(8).seed(1));
  const auto full = drain(a, 3);
  const auto tail = drain(a, 3, 2);
  ASSERT_EQ(tail.size(), full.size() - 16);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), full.begin() + 16));
}

TEST(TensorLoader, DropLastAndNoShuffle) {
  data::TensorLoader a(numbered(25),
                       data::TensorLoaderOptions().batch_size(10).shuffle(false).drop_last(true));
  EXPECT_EQ(a.num_batches(), 2);
  EXPECT_EQ(a.num_samples(), 20);
  const auto order = drain(a, 4);
  std::vector<int64_t> expected(20);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
}

TEST(TensorLoader, TransformRunsAndErrorsReachTheCaller) {
  auto opts = data::TensorLoaderOptions().batch_size(4).prefetch(2).transform([](data::Batch b) {
    b.input = b.input.to(torch::kFloat32) * 2;
    return b;
  });
  data::TensorLoader a(numbered(8), opts);
  a.start_epoch(0, 0);
  auto batch = a.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->input.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(batch->input.select(1, 0), batch->target.to(torch::kFloat32) * 2));

  data::TensorLoader bad(numbered(8), data::TensorLoaderOptions().batch_size(4).prefetch(2).transform(
                                          [](data::Batch) -> data::Batch {
                                            throw std::runtime_error("decode failed for sample 3");
                                          }));
  bad.start_epoch(0, 0);
  EXPECT_THROW(
      {
        try {
          bad.next();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "decode failed for sample 3");
          throw;
        }
      },
      std::runtime_error);
}

TEST(TensorLoader, RejectsBadOptions) {
  EXPECT_THROW(data::TensorLoader(numbered(8), data::TensorLoaderOptions().batch_size(0)), Error);
  EXPECT_THROW(data::TensorLoader(numbered(8), data::TensorLoaderOptions().batch_size(9).drop_last(true)),
               Error);
  EXPECT_THROW(data::TensorLoader(data::TensorDataset{torch::zeros({4, 2}), torch::zeros({3})},
                                  data::TensorLoaderOptions()),
               Error);
}

namespace {
// Every batch of `epoch` (from batch `skip` on) carries its slice of epoch_order(epoch) as
// `index`, on the CPU, and `epoch`; numbered() targets equal their dataset index.
void expect_index_and_epoch(data::TensorLoader& loader, int64_t epoch, int64_t skip) {
  const int64_t bs = loader.options().batch_size();
  const torch::Tensor order = loader.epoch_order(epoch);
  loader.start_epoch(epoch, skip);
  int64_t b = skip;
  while (auto batch = loader.next()) {
    const int64_t len = std::min(bs, order.size(0) - b * bs);
    ASSERT_TRUE(batch->index.defined());
    EXPECT_TRUE(batch->index.device().is_cpu());
    EXPECT_EQ(batch->index.scalar_type(), torch::kInt64);
    EXPECT_TRUE(torch::equal(batch->index, order.narrow(0, b * bs, len)))
        << "epoch " << epoch << " batch " << b;
    EXPECT_TRUE(torch::equal(batch->index, batch->target.cpu()));
    EXPECT_EQ(batch->epoch, epoch);
    ++b;
  }
  EXPECT_EQ(b, loader.num_batches());
}

// Small uint8 "images" [n, side, side, 3] whose pixels differ between samples, and class targets.
data::TensorDataset images(int64_t n, int64_t side = 4) {
  const auto pixels = torch::arange(n * side * side * 3, torch::kInt64)
                          .remainder(251)
                          .to(torch::kUInt8)
                          .reshape({n, side, side, 3});
  return {pixels, torch::arange(n, torch::kInt64).remainder(10)};
}
}  // namespace

TEST(TensorLoader, BatchesCarryTheirIndexAndEpoch) {
  for (int64_t prefetch : {0, 2}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    data::TensorLoader a(numbered(103),
                         data::TensorLoaderOptions().batch_size(10).seed(5).prefetch(prefetch));
    expect_index_and_epoch(a, 0, 0);
    expect_index_and_epoch(a, 1, 0);
    expect_index_and_epoch(a, 7, 4);   // resumed at batch 4 of epoch 7
    expect_index_and_epoch(a, 7, 10);  // only the last, short batch
    expect_index_and_epoch(a, 7, 11);  // nothing left
    data::TensorLoader plain(
        numbered(25),
        data::TensorLoaderOptions().batch_size(10).shuffle(false).drop_last(true).prefetch(prefetch));
    expect_index_and_epoch(plain, 3, 1);
  }
}

TEST(TensorLoader, TransformsSeeIndexAndEpochInTheDocumentedOrder) {
  for (int64_t prefetch : {0, 2}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    std::mutex mutex;
    std::vector<int64_t> host_first, device_first;  // first index of each batch each transform saw
    std::set<std::thread::id> host_threads, device_threads;
    auto opts = data::TensorLoaderOptions()
                    .batch_size(10)
                    .seed(3)
                    .prefetch(prefetch)
                    .transform([&](data::Batch b) {
                      EXPECT_EQ(b.input.scalar_type(), torch::kInt64);  // straight from the gather
                      EXPECT_TRUE(torch::equal(b.index, b.target));
                      EXPECT_EQ(b.epoch, 2);
                      std::lock_guard<std::mutex> lock(mutex);
                      host_first.push_back(b.index[0].item<int64_t>());
                      host_threads.insert(std::this_thread::get_id());
                      b.input = b.input.to(torch::kFloat32) * 2;
                      return b;
                    })
                    .device_transform([&](data::Batch b) {
                      EXPECT_EQ(b.input.scalar_type(), torch::kFloat32);  // after the host transform
                      EXPECT_TRUE(torch::equal(b.index, b.target));
                      EXPECT_EQ(b.epoch, 2);
                      EXPECT_FALSE(torch::GradMode::is_enabled());
                      std::lock_guard<std::mutex> lock(mutex);
                      device_first.push_back(b.index[0].item<int64_t>());
                      device_threads.insert(std::this_thread::get_id());
                      b.input = b.input + 1;
                      return b;
                    });
    data::TensorLoader a(numbered(53), opts);
    const torch::Tensor order = a.epoch_order(2);
    a.start_epoch(2, 1);
    int64_t b = 1;
    while (auto batch = a.next()) {
      // host then device: 2 t + 1; the other order would give 2 (t + 1).
      EXPECT_TRUE(torch::equal(batch->input.select(1, 0), batch->target.to(torch::kFloat32) * 2 + 1));
      EXPECT_TRUE(torch::equal(batch->index, order.narrow(0, b * 10, batch->size())));
      ++b;
    }
    EXPECT_EQ(b, 6);
    std::vector<int64_t> expected;
    for (int64_t i = 1; i < 6; ++i) expected.push_back(order[i * 10].item<int64_t>());
    EXPECT_EQ(host_first, expected);
    EXPECT_EQ(device_first, expected);
    // device_transform always runs on the consumer thread; the host transform in the worker when prefetching.
    EXPECT_EQ(device_threads, std::set<std::thread::id>{std::this_thread::get_id()});
    ASSERT_EQ(host_threads.size(), 1u);
    EXPECT_EQ(*host_threads.begin() == std::this_thread::get_id(), prefetch == 0);
  }
}

TEST(TensorLoader, TransformMustKeepTheIndex) {
  data::TensorLoader a(numbered(8), data::TensorLoaderOptions().batch_size(4).transform([](data::Batch b) {
    data::Batch fresh;  // a new batch without the index
    fresh.input = b.input;
    fresh.target = b.target;
    return fresh;
  }));
  a.start_epoch(0, 0);
  EXPECT_THROW(a.next(), Error);
}

TEST(TensorLoader, ResidentOnTheCpuIsTheSameAsNotResident) {
  const auto opts = data::TensorLoaderOptions().batch_size(16).seed(9);
  data::TensorLoader streamed(images(100), opts);
  data::TensorLoader resident(images(100), data::TensorLoaderOptions(opts).resident(true).prefetch(2));
  EXPECT_EQ(resident.options().prefetch(), 0);  // resident takes no thread
  for (int64_t epoch : {0, 1}) expect_same_batches(collect(streamed, epoch), collect(resident, epoch));
  expect_same_batches(collect(streamed, 5, 3), collect(resident, 5, 3));
  const auto batches = collect(resident, 1);
  EXPECT_EQ(batches[0].input.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(batches[0].input, images(100).inputs.index_select(0, batches[0].index)));
}

TEST(TensorLoader, ResidentRejectsAHostTransform) {
  const auto opts = data::TensorLoaderOptions().resident(true).transform([](data::Batch b) { return b; });
  try {
    data::TensorLoader a(numbered(8), opts);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device_transform"), std::string::npos) << e.what();
  }
  // device_transform is the way to transform resident batches.
  data::TensorLoader ok(
      numbered(8),
      data::TensorLoaderOptions().batch_size(4).resident(true).device_transform([](data::Batch b) {
        b.input = b.input * 3;
        return b;
      }));
  ok.start_epoch(0, 0);
  auto batch = ok.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_TRUE(torch::equal(batch->input.select(1, 0), batch->target * 3));
}

TEST(TensorLoaderCuda, ResidentMatchesTheCpuLoader) {
  EMBER_REQUIRE_CUDA();
  const auto opts = data::TensorLoaderOptions().batch_size(32).seed(4);
  data::TensorLoader cpu(images(1000), opts);
  data::TensorLoader gpu(
      images(1000),
      data::TensorLoaderOptions(opts).device(torch::kCUDA).resident(true).device_transform([](data::Batch b) {
        EXPECT_TRUE(b.input.is_cuda());
        EXPECT_EQ(b.input.scalar_type(),
                  torch::kUInt8);  // stays uint8 on the device
        EXPECT_TRUE(b.target.is_cuda());
        EXPECT_TRUE(b.index.is_cpu());
        return b;
      }));
  EXPECT_EQ(gpu.options().device(), torch::Device(torch::kCUDA, 0));  // "cuda" resolved to the current device
  EXPECT_EQ(gpu.options().prefetch(), 0);
  for (int64_t epoch : {0, 1, 2}) expect_same_batches(collect(cpu, epoch), collect(gpu, epoch));
  expect_same_batches(collect(cpu, 6, 17), collect(gpu, 6, 17));
}

TEST(TensorLoaderCuda, PrefetchDeliversCorrectBatches) {
  EMBER_REQUIRE_CUDA();
  const auto opts = data::TensorLoaderOptions().batch_size(256).seed(11);
  data::TensorLoader cpu(images(2000, 32), opts);
  data::TensorLoader gpu(images(2000, 32), data::TensorLoaderOptions(opts).device(torch::kCUDA).prefetch(2));
  EXPECT_EQ(gpu.options().prefetch(), 2);
  const auto busy = torch::randn({2048, 2048}, torch::kCUDA);
  for (int64_t epoch : {0, 1, 2}) {
    const auto expected = collect(cpu, epoch);
    gpu.start_epoch(epoch, 0);
    std::vector<data::Batch> got;
    while (auto b = gpu.next()) {
      ASSERT_TRUE(b->input.is_cuda());
      // Keep the current stream busy, then read the batch there, with no host sync: the worker
      // runs ahead on its side stream. Without the event the read could see an unfinished copy;
      // without record_stream the dropped batch's memory could be reused by a later copy first.
      const auto product = busy.matmul(busy);  // queued only
      data::Batch copy;
      copy.input = b->input.clone();
      copy.target = b->target.clone();
      copy.index = b->index;
      copy.epoch = b->epoch;
      got.push_back(std::move(copy));
    }  // each batch is dropped while the stream still has work queued
    for (auto& b : got) {
      b.input = b.input.cpu();
      b.target = b.target.cpu();
    }
    expect_same_batches(expected, got);
  }
  expect_same_batches(collect(cpu, 4, 5), collect(gpu, 4, 5));  // resumed
}

TEST(TensorLoaderCuda, PrefetchOrdersCopiesAgainstANonDefaultStream) {
  EMBER_REQUIRE_CUDA();
  const auto opts = data::TensorLoaderOptions().batch_size(100).seed(2);
  data::TensorLoader cpu(images(1500), opts);
  data::TensorLoader gpu(images(1500), data::TensorLoaderOptions(opts).device(torch::kCUDA).prefetch(3));
  const c10::impl::VirtualGuardImpl impl(torch::kCUDA);
  const c10::StreamGuard on_stream(impl.getStreamFromGlobalPool(torch::Device(torch::kCUDA, 0)));
  expect_same_batches(collect(cpu, 1), collect(gpu, 1));
}

TEST(TensorLoaderCuda, DeviceTransformRunsOnTheGpu) {
  EMBER_REQUIRE_CUDA();
  const auto normalize = [](data::Batch b) {
    // Exact on both devices (x / 255 is computed as x * (1 / 255) on CUDA, not on the CPU).
    b.input = b.input.to(torch::kFloat32).mul(0.5).permute({0, 3, 1, 2}).contiguous();
    return b;
  };
  data::TensorLoader cpu(images(300),
                         data::TensorLoaderOptions().batch_size(50).seed(1).device_transform(normalize));
  for (bool resident : {false, true}) {
    SCOPED_TRACE(resident ? "resident" : "streamed");
    int64_t calls = 0;
    data::TensorLoader gpu(images(300), data::TensorLoaderOptions()
                                            .batch_size(50)
                                            .seed(1)
                                            .device(torch::kCUDA)
                                            .resident(resident)
                                            .device_transform([&](data::Batch b) {
                                              EXPECT_TRUE(b.input.is_cuda());
                                              EXPECT_TRUE(b.target.is_cuda());
                                              EXPECT_EQ(b.input.scalar_type(), torch::kUInt8);
                                              ++calls;
                                              return normalize(std::move(b));
                                            }));
    const auto got = collect(gpu, 3);
    EXPECT_EQ(calls, 6);
    expect_same_batches(collect(cpu, 3), got);
    EXPECT_EQ(got[0].input.sizes(), torch::IntArrayRef({50, 3, 4, 4}));
  }
}
