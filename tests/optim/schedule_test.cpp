#include <ember/core/error.h>
#include <ember/optim/schedule.h>
#include <gtest/gtest.h>

#include <cmath>

#include "tolerance.h"

using namespace ember::optim;
using ember::Error;
using ember::ErrorKind;

namespace {
constexpr double kPi = 3.14159265358979323846;
// A schedule's float64 arithmetic against a closed form: at most 8 roundings a side (the cosine's
// argument pi t / T 2, the cosine 1, ~5 sums and products) of terms no larger than the base rate 1:
// 16 eps (tolerance.h). EXPECT_DOUBLE_EQ (4 ulps) where both sides round at most twice.
const double kRateBound = ember::test_util::rounding_bound(torch::kFloat64, 16, 1.0);
}  // namespace

TEST(Schedule, StepDecays) {
  StepSchedule s(10, 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(0, 0.8), 0.8);
  EXPECT_DOUBLE_EQ(s.lr_at(9, 0.8), 0.8);
  EXPECT_DOUBLE_EQ(s.lr_at(10, 0.8), 0.4);
  EXPECT_DOUBLE_EQ(s.lr_at(25, 0.8), 0.2);
}

TEST(Schedule, CosineEndpointsAndMidpoint) {
  CosineSchedule s(100, 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(0, 1.0), 1.0);
  EXPECT_NEAR(s.lr_at(50, 1.0), 0.55, kRateBound);
  EXPECT_NEAR(s.lr_at(100, 1.0), 0.1, kRateBound);
  EXPECT_NEAR(s.lr_at(500, 1.0), 0.1, kRateBound);
  EXPECT_NEAR(s.lr_at(25, 1.0), 0.1 + 0.9 * (1 + std::cos(kPi / 4)) / 2, kRateBound);
}

TEST(Schedule, OneCycleMatchesPyTorchClosedForm) {
  // torch.optim.lr_scheduler.OneCycleLR(max_lr=1, total_steps=100, pct_start=0.3,
  // div_factor=25, final_div_factor=1e4), anneal_strategy='cos'.
  OneCycleSchedule s(OneCycleOptions(100));
  const double initial = 1.0 / 25, final_lr = initial / 1e4, up = 0.3 * 100 - 1, down = 99;
  const auto anneal = [](double a, double b, double pct) {
    return b + (a - b) / 2 * (std::cos(kPi * pct) + 1);
  };
  for (int64_t t = 0; t < 100; ++t) {
    const double want =
        t <= up ? anneal(initial, 1.0, t / up) : anneal(1.0, final_lr, (t - up) / (down - up));
    EXPECT_NEAR(s.lr_at(t, 1.0), want, kRateBound) << t;
  }
  EXPECT_NEAR(s.lr_at(0, 1.0), 0.04, kRateBound);
  EXPECT_NEAR(s.lr_at(29, 1.0), 1.0, kRateBound);
  EXPECT_NEAR(s.lr_at(99, 1.0), 4e-6, kRateBound);
}

TEST(Schedule, WarmupRampsThenHandsOver) {
  WarmupSchedule s(4, 0.2, std::make_shared<StepSchedule>(2, 0.1));
  EXPECT_DOUBLE_EQ(s.lr_at(0, 1.0), 0.2);
  EXPECT_DOUBLE_EQ(s.lr_at(2, 1.0), 0.6);
  EXPECT_DOUBLE_EQ(s.lr_at(4, 1.0), 1.0);
  EXPECT_NEAR(s.lr_at(6, 1.0), 0.1, kRateBound);
}

TEST(Schedule, MakeScheduleByNameAndErrors) {
  auto s =
      make_schedule(ScheduleOptions().kind(parse_schedule_kind("cosine")).total_steps(10).warmup_steps(5));
  EXPECT_EQ(s->name(), "warmup+cosine");
  try {
    parse_schedule_kind("cosnie");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("choose constant, step, cosine or onecycle"), std::string::npos);
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
  }
  EXPECT_THROW(StepSchedule(0, 0.1), std::exception);
  EXPECT_THROW(OneCycleSchedule(OneCycleOptions(100).pct_start(1.5)), std::exception);
}
