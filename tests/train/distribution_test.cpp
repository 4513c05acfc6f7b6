// The Trainer's one interface to other processes (train::Distribution), with
// a stand-in for a second rank that mirrors this one.
#include <gtest/gtest.h>

#include <limits>

#include "train/test_task.h"

using namespace ember;
using test_util::BlobTask;

namespace {

// Rank `rank` of two identical processes: a sum over them doubles a value.
struct Twin : train::Distribution {
  explicit Twin(int64_t rank, bool other_stops = false) : rank_(rank), other_stops_(other_stops) {}
  int64_t world_size() const override { return 2; }
  int64_t rank() const override { return rank_; }
  void all_reduce_sum(torch::Tensor& t) override {
    ++sums;
    t.mul_(2);
  }
  bool any(bool flag) override {
    ++agreements;
    return flag || other_stops_;
  }
  void check_same(const std::string& what, const std::string& value) override {
    checked.emplace_back(what, value);
  }
  int64_t rank_;
  bool other_stops_;
  int sums = 0, agreements = 0;
  std::vector<std::pair<std::string, std::string>> checked;
};

train::TrainerOptions options(std::shared_ptr<train::Distribution> d, const std::string& dir) {
  train::TrainerOptions o;
  o.epochs(2).run_dir(dir).distribution(std::move(d));
  o.optimizer().lr(0.05);
  return o;
}

}  // namespace

TEST(Distribution, TheDefaultIsOneProcessThatWritesAndNeverWaits) {
  const auto one = train::TrainerOptions().distribution();
  ASSERT_NE(one, nullptr);
  EXPECT_EQ(one->world_size(), 1);
  EXPECT_TRUE(one->is_writer());
  EXPECT_FALSE(one->any(false));
  torch::Tensor t = torch::ones({2});
  one->all_reduce_sum(t);
  EXPECT_TRUE(torch::equal(t, torch::ones({2})));
}

TEST(Distribution, EpochSumsCoverEveryRankAndOnlyTheWriterSavesCheckpoints) {
  for (int64_t rank : {0, 1}) {
    const std::string dir = test_util::temp_dir("dist_rank" + std::to_string(rank));
    auto twin = std::make_shared<Twin>(rank);
    BlobTask task({});
    const train::FitResult r = train::Trainer(options(twin, dir)).fit(task);
    EXPECT_EQ(r.last_train.samples, 2 * 256) << "the epoch's samples, summed over both ranks";
    EXPECT_EQ(r.samples, 2 * 256) << "this process's samples over two epochs";
    EXPECT_EQ(twin->sums, 2 + 16) << "the epoch's sums once per epoch, the judged loss once per step";
    EXPECT_EQ(twin->agreements, 2) << "one stop agreement per epoch";
    ASSERT_EQ(twin->checked.size(), 1u);
    EXPECT_EQ(twin->checked[0].second, "0 0 0 8") << "the resume position: epoch, step, skipped, batches";
    EXPECT_EQ(std::ifstream(dir + "/checkpoints/last.pt").good(), rank == 0) << "rank " << rank;
  }
}

namespace {
// Rank 1 of two, whose peer's loss is NaN from its step `from` on: the
// judged loss (the mean over ranks, one scalar all-reduce per step) turns NaN.
struct NanPeer : Twin {
  explicit NanPeer(int64_t from) : Twin(1), from_(from) {}
  void all_reduce_sum(torch::Tensor& t) override {
    Twin::all_reduce_sum(t);
    if (t.scalar_type() == torch::kFloat32 && t.numel() == 1 && ++losses_ >= from_)
      t.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  int64_t from_, losses_ = 0;
};
}  // namespace

TEST(Distribution, ADivergenceOnAnotherRankStopsThisOneAtTheSameStep) {
  // This rank's own loss stays finite; its peer's is NaN from step 11 on. Both
  // judge the same (reduced) records at the same steps, so this rank stops too,
  // with the divergence diagnosis, at the read that sees 4 bad steps (step 16),
  // and not later in a collective its peer has left.
  auto peer = std::make_shared<NanPeer>(11);
  BlobTask task({});
  train::TrainerOptions o = options(peer, "");
  o.epochs(5).nonfinite_patience(4);
  train::Trainer trainer(o);
  try {
    trainer.fit(task);
    FAIL() << "a divergence on the other rank did not stop this one";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kDiverged) << m;
    EXPECT_NE(m.find("since step 11 (epoch 2)"), std::string::npos) << m;
    EXPECT_NE(m.find("at step 10"), std::string::npos) << m;  // the last finite (mean) loss
  }
  EXPECT_EQ(trainer.global_step(), 16);
}

TEST(Distribution, AStopOnAnotherRankStopsThisOne) {
  auto twin = std::make_shared<Twin>(0, /*other_stops=*/true);
  BlobTask task({});
  const train::FitResult r = train::Trainer(options(twin, "")).fit(task);
  EXPECT_EQ(r.epochs_completed, 1);
  EXPECT_EQ(r.stop_cause, train::StopCause::kOtherRank);
  EXPECT_EQ(r.stop_reason, "stopped by another rank");
}
