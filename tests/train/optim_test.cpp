// Optimizers from OptimizerOptions: parameter groups and the weight-decay rule.
#include <gtest/gtest.h>

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

std::vector<std::string> names_of(const train::ParamGroupPlan& g) {
  return g.names;
}

}  // namespace

TEST(Optimizer, NoWeightDecayOnBiasesNormsAndEmbeddingsByDefault) {
  Mixed m;
  const auto groups = train::plan_param_groups(m, train::OptimizerOptions(0.1).weight_decay(0.01));
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(names_of(groups[0]), (std::vector<std::string>{"fc.weight", "head.weight"}));
  EXPECT_EQ(groups[0].weight_decay, 0.01);
  EXPECT_EQ(names_of(groups[1]),
            (std::vector<std::string>{"emb.weight", "fc.bias", "norm.weight", "norm.bias", "head.bias"}));
  EXPECT_EQ(groups[1].weight_decay, 0.0);

  const auto all =
      train::plan_param_groups(m, train::OptimizerOptions(0.1).weight_decay(0.01).decay_all_parameters(true));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].params.size(), 7u);
}

TEST(Optimizer, GroupsTakeTheirOwnRateAndDecayAndTheScheduleScalesEach) {
  Mixed m;
  const auto head =
      train::ParamGroupOptions([](const std::string& name) { return name.rfind("head.", 0) == 0; })
          .lr(0.5)
          .weight_decay(0.2);  // explicit: applies to the head's bias too
  auto opt = train::make_optimizer(
      m, train::OptimizerOptions(0.1).kind(train::OptimizerKind::kAdamW).weight_decay(0.01).groups({head}));
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
          train::ParamGroupOptions([](const std::string& n) { return n.rfind("fc2.", 0) == 0; }).lr(0.01);
      return train::make_optimizer(*model(), train::OptimizerOptions(0.1).groups({fc2}));
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
  o.epochs(1).max_steps(2).schedule(std::make_shared<train::StepSchedule>(1, 0.5));
  train::Trainer(o).add_callback(rec).fit(two);
  // fc2.weight, fc2.bias (its own rate; decayed and not), fc1.weight, fc1.bias.
  ASSERT_EQ(rec->rates.size(), 4u);
  EXPECT_DOUBLE_EQ(rec->rates[0], 0.01 * 0.25);
  EXPECT_DOUBLE_EQ(rec->rates[1], 0.01 * 0.25);
  EXPECT_DOUBLE_EQ(rec->rates[2], 0.1 * 0.25);
  EXPECT_DOUBLE_EQ(rec->rates[3], 0.1 * 0.25);
}

TEST(Optimizer, NamesAndBadValuesAreConfigErrors) {
  EXPECT_EQ(train::parse_optimizer_kind("adamw"), train::OptimizerKind::kAdamW);
  EXPECT_STREQ(train::to_string(train::OptimizerKind::kSgd), "sgd");
  for (auto bad :
       {std::function<void()>([] { train::parse_optimizer_kind("lion"); }), std::function<void()>([] {
          Mixed m;
          train::make_optimizer(m, train::OptimizerOptions(-1.0));
        })}) {
    try {
      bad();
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kConfig) << e.what();
    }
  }
}
