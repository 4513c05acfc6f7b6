// Optimizers from OptimizerOptions: parameter groups and the weight-decay rule.
#include <gtest/gtest.h>

#include "tolerance.h"
#include "train/test_task.h"

using namespace ember;

namespace {

struct Mixed : torch::nn::Module {
  Mixed() {
    emb = register_module("emb", torch::nn::Embedding(10, 4));
    fc = register_module("fc", torch::nn::Linear(4, 4));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})));
    head = register_module("head", torch::nn::Linear(4, 3));
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear fc{nullptr}, head{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};

std::vector<std::string> names_of(const optim::ParamGroupPlan& g) {
  return g.names;
}

}  // namespace

TEST(Optimizer, NoWeightDecayOnBiasesNormsAndEmbeddingsByDefault) {
  Mixed m;
  const auto groups = optim::plan_param_groups(m, optim::OptimizerOptions(0.1).weight_decay(0.01));
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(names_of(groups[0]), (std::vector<std::string>{"fc.weight", "head.weight"}));
  EXPECT_EQ(groups[0].weight_decay, 0.01);
  EXPECT_EQ(names_of(groups[1]),
            (std::vector<std::string>{"emb.weight", "fc.bias", "norm.weight", "norm.bias", "head.bias"}));
  EXPECT_EQ(groups[1].weight_decay, 0.0);

  const auto all =
      optim::plan_param_groups(m, optim::OptimizerOptions(0.1).weight_decay(0.01).decay_all_parameters(true));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].params.size(), 7u);
}

TEST(Optimizer, GroupsTakeTheirOwnRateAndDecayAndTheScheduleScalesEach) {
  Mixed m;
  const auto head =
      optim::ParamGroupOptions([](const std::string& name) { return name.rfind("head.", 0) == 0; })
          .lr(0.5)
          .weight_decay(0.2);  // explicit: applies to the head's bias too
  auto opt = optim::make_optimizer(
      m, optim::OptimizerOptions(0.1).kind(optim::OptimizerKind::kAdamW).weight_decay(0.01).groups({head}));
  auto& groups = opt->param_groups();
  ASSERT_EQ(groups.size(), 3u);  // head (all decayed: explicit), the rest decayed, the rest not
  const auto& h = static_cast<const torch::optim::AdamWOptions&>(groups[0].options());
  EXPECT_EQ(h.lr(), 0.5);
  EXPECT_EQ(h.weight_decay(), 0.2);
  EXPECT_EQ(groups[0].params().size(), 2u);
  EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(groups[1].options()).weight_decay(), 0.01);
  EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(groups[2].options()).weight_decay(), 0.0);

  // The Trainer's schedule scales every group's own base rate.
  struct TwoRates : test_util::BlobTask {
    using BlobTask::BlobTask;
    std::unique_ptr<torch::optim::Optimizer> make_optimizer() override {
      const auto fc2 =
          optim::ParamGroupOptions([](const std::string& n) { return n.rfind("fc2.", 0) == 0; }).lr(0.01);
      return optim::make_optimizer(*model(), optim::OptimizerOptions(0.1).groups({fc2}));
    }
  } two(test_util::BlobTask::Options{});
  struct LastRates : train::Callback {
    std::string name() const override { return "rates"; }
    void on_step_end(train::Trainer& t, const train::StepInfo&) override {
      rates.clear();
      for (auto& g : t.optimizer()->param_groups()) rates.push_back(g.options().get_lr());
    }
    std::vector<double> rates;
  };
  auto rec = std::make_shared<LastRates>();
  train::TrainerOptions o;
  o.epochs(1).max_steps(2).schedule(std::make_shared<optim::StepSchedule>(1, 0.5));
  train::Trainer(o).add_callback(rec).fit(two);
  // fc2.weight, fc2.bias (its own rate; decayed and not), fc1.weight, fc1.bias.
  ASSERT_EQ(rec->rates.size(), 4u);
  EXPECT_DOUBLE_EQ(rec->rates[0], 0.01 * 0.25);
  EXPECT_DOUBLE_EQ(rec->rates[1], 0.01 * 0.25);
  EXPECT_DOUBLE_EQ(rec->rates[2], 0.1 * 0.25);
  EXPECT_DOUBLE_EQ(rec->rates[3], 0.1 * 0.25);
}

TEST(Optimizer, NamesAndBadValuesAreConfigErrors) {
  EXPECT_EQ(optim::parse_optimizer_kind("adamw"), optim::OptimizerKind::kAdamW);
  EXPECT_STREQ(optim::to_string(optim::OptimizerKind::kSgd), "sgd");
  for (auto bad :
       {std::function<void()>([] { optim::parse_optimizer_kind("lion"); }), std::function<void()>([] {
          Mixed m;
          optim::make_optimizer(m, optim::OptimizerOptions(-1.0));
        })}) {
    try {
      bad();
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kConfig) << e.what();
    }
  }
}

// optim/ without the Trainer: its keys declared alone on a bare config, their
// defaults from the options structs, read back into an optimizer and a
// schedule in steps.
TEST(OptimKeys, DeclaredAloneReadBackIntoAnOptimizerAndASchedule) {
  core::Config c;
  optim::declare_optimizer_keys(c, optim::OptimizerOptions(3e-4).kind(optim::OptimizerKind::kAdamW));
  optim::declare_schedule_keys(c);
  EXPECT_EQ(c.get_string("optim.name"), "adamw");
  EXPECT_DOUBLE_EQ(c.get_float("optim.lr"), 3e-4);
  EXPECT_DOUBLE_EQ(c.get_float("optim.weight_decay"), optim::OptimizerOptions().weight_decay());
  EXPECT_EQ(c.get_string("sched.name"), "constant");
  EXPECT_FALSE(c.has("trainer.epochs")) << "the loop's keys are train/'s";

  c.set_override("optim.weight_decay=0.1");
  c.set_override("optim.fused=false");
  c.set_override("sched.name=cosine");
  c.set_override("sched.warmup_epochs=0.5");
  c.validate();
  const optim::OptimizerOptions o = optim::optimizer_options_from_config(c);
  EXPECT_EQ(o.kind(), optim::OptimizerKind::kAdamW);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.1);
  EXPECT_FALSE(o.fused());
  Mixed m;
  const auto opt = optim::make_optimizer(m, o);
  ASSERT_NE(dynamic_cast<torch::optim::AdamW*>(opt.get()), nullptr);
  EXPECT_EQ(dynamic_cast<optim::FusedAdamW*>(opt.get()), nullptr) << "optim.fused=false: LibTorch's own";

  // 10 steps per epoch, 40 in the run: 5 warm-up steps, then a cosine over the other 35.
  const optim::ScheduleOptions s = optim::epoch_schedule_options_from_config(c).in_steps(10, 40);
  EXPECT_EQ(s.kind(), optim::ScheduleKind::kCosine);
  EXPECT_EQ(s.warmup_steps(), 5);
  EXPECT_EQ(s.total_steps(), 35);
  const auto schedule = optim::make_schedule(s);
  // Float64 arithmetic of terms <= 1: at most 16 roundings (tolerance.h).
  const double bound = test_util::rounding_bound(torch::kFloat64, 16, 1.0);
  EXPECT_NEAR(schedule->lr_at(0, 1.0), s.warmup_start_factor(), bound);
  EXPECT_NEAR(schedule->lr_at(5, 1.0), 1.0, bound);
  EXPECT_NEAR(schedule->lr_at(40, 1.0), s.min_factor(), bound);

  c.set_override("optim.name=lion");
  EXPECT_THROW(c.validate(), Error) << "an unknown optimizer is a config error at validation";
}

// declare_trainer_keys takes the schedule's defaults from its TrainerOptions,
// as it does every other key's (it declared EpochScheduleOptions()'s whatever
// the caller gave).
TEST(OptimKeys, TheTrainersScheduleDefaultsComeFromItsOptions) {
  core::Config c;
  train::declare_trainer_keys(
      c, train::TrainerOptions().epoch_schedule(
             optim::EpochScheduleOptions()
                 .shape(optim::ScheduleOptions().kind(optim::ScheduleKind::kCosine).min_factor(0.05))
                 .warmup_epochs(2)));
  EXPECT_EQ(c.get_string("sched.name"), "cosine");
  EXPECT_DOUBLE_EQ(c.get_float("sched.warmup_epochs"), 2.0);
  EXPECT_DOUBLE_EQ(c.get_float("sched.min_factor"), 0.05);
  core::Config plain;
  train::declare_trainer_keys(plain);
  EXPECT_EQ(plain.get_string("sched.name"), "constant") << "no schedule given: EpochScheduleOptions()'s";
}
