// core::EnumNames, and every enum's parse/to_string pair through it: each
// value's name parses back to the value, and an unknown name is an error
// listing the names (with the nearest one for a near miss).
#include "ember/core/enum_names.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "ember/amp/precision.h"
#include "ember/augment/augment.h"
#include "ember/core/activation_checkpoint.h"
#include "ember/core/flops.h"
#include "ember/data/cifar.h"
#include "ember/dist/process_group.h"
#include "ember/dist/sharding.h"
#include "ember/monitor/writers.h"
#include "ember/optim/optimizer.h"
#include "ember/optim/schedule.h"
#include "ember/prune/callback.h"
#include "ember/prune/pruner.h"
#include "ember/train/early_stopping.h"

namespace ember {
namespace {

enum class Fruit { kApple, kBanana, kCherry };
constexpr core::EnumNames<Fruit, 3> kFruits{
    "fruit",
    {{{Fruit::kApple, "apple"}, {Fruit::kBanana, "banana"}, {Fruit::kCherry, "cherry"}}},
    "all sweet"};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(e.what()) + " {" + to_string(e.kind()) + "}";
  }
  return "no error";
}

TEST(EnumNames, NamesParseAndListWithTheNearestName) {
  EXPECT_EQ(kFruits.parse("banana", "test"), Fruit::kBanana);
  EXPECT_STREQ(kFruits.name(Fruit::kCherry), "cherry");
  EXPECT_EQ(kFruits.list(), "apple, banana or cherry");
  EXPECT_FALSE(kFruits.find("Apple").has_value());  // names are exact
  EXPECT_EQ(
      error_of([] { kFruits.parse("banan", "shop"); }),
      "[shop] unknown fruit 'banan'; choose apple, banana or cherry (all sweet) (did you mean 'banana'?) "
      "{config}");
  // Far from every name: no guess.
  EXPECT_EQ(error_of([] { kFruits.parse("pineapple", "shop", ErrorKind::kData); }),
            "[shop] unknown fruit 'pineapple'; choose apple, banana or cherry (all sweet) {data}");
  EXPECT_EQ(error_of([] { kFruits.parse("", "shop"); }),
            "[shop] unknown fruit ''; choose apple, banana or cherry (all sweet) {config}");
}

// Each value's name parses back to it; the names are distinct.
template <typename E>
void expect_round_trip(const std::vector<E>& values, E (*parse)(const std::string&), const char* what) {
  std::set<std::string> names;
  for (const E v : values) {
    const std::string name = to_string(v);
    EXPECT_TRUE(names.insert(name).second) << what << ": " << name << " twice";
    EXPECT_EQ(parse(name), v) << what << ": " << name;
  }
  EXPECT_THROW(parse("no-such-name"), Error) << what;
}

TEST(EnumNames, EveryParsedEnumRoundTrips) {
  using optim::OptimizerKind;
  using optim::ScheduleKind;
  expect_round_trip<OptimizerKind>({OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW},
                                   optim::parse_optimizer_kind, "optimizer");
  expect_round_trip<ScheduleKind>(
      {ScheduleKind::kConstant, ScheduleKind::kStep, ScheduleKind::kCosine, ScheduleKind::kOneCycle},
      optim::parse_schedule_kind, "schedule");
  using dist::Sharding;
  expect_round_trip<Sharding>(
      {Sharding::kNone, Sharding::kOptimizer, Sharding::kGradients, Sharding::kParameters},
      dist::parse_sharding, "sharding");
  expect_round_trip<dist::Backend>({dist::Backend::kAuto, dist::Backend::kGloo, dist::Backend::kNccl},
                                   dist::parse_backend, "backend");
  EXPECT_STREQ(dist::to_string(dist::Backend::kReplicas), "replicas");
  EXPECT_THROW(dist::parse_backend("replicas"), Error) << "the replica group is never configured";
  expect_round_trip<augment::CropMode>(
      {augment::CropMode::kNone, augment::CropMode::kPad, augment::CropMode::kRandomResized},
      [](const std::string& n) { return augment::parse_crop_mode(n); }, "crop");
  using prune::EvalSplit;
  expect_round_trip<EvalSplit>({EvalSplit::kVal, EvalSplit::kTest, EvalSplit::kNone}, prune::parse_eval_split,
                               "eval split");
  expect_round_trip<prune::PruneTarget>({prune::PruneTarget::kMacs, prune::PruneTarget::kLatency},
                                        prune::parse_prune_target, "prune target");
  using prune::Importance;
  expect_round_trip<Importance>(
      {Importance::kL1, Importance::kL2, Importance::kNormScale, Importance::kTaylor, Importance::kRandom},
      prune::importance_from_string, "importance");
  using train::EarlyStoppingMetric;
  expect_round_trip<EarlyStoppingMetric>({EarlyStoppingMetric::kValLoss, EarlyStoppingMetric::kValAccuracy},
                                         train::parse_early_stopping_metric, "early stopping");
  expect_round_trip<data::CifarVariant>({data::CifarVariant::kCifar10, data::CifarVariant::kCifar100},
                                        data::parse_cifar_variant, "cifar");
  using monitor::RecordKind;
  expect_round_trip<RecordKind>({RecordKind::kStep, RecordKind::kTrainEpoch, RecordKind::kVal},
                                monitor::parse_record_kind, "record");
  using amp::Precision;
  expect_round_trip<Precision>(
      {Precision::kFp32, Precision::kTf32, Precision::kBf16Mixed, Precision::kFp16Mixed},
      amp::parse_precision, "precision");
  expect_round_trip<core::CheckpointMode>({core::CheckpointMode::kFull, core::CheckpointMode::kLight},
                                          core::parse_checkpoint_mode, "checkpoint mode");
}

TEST(EnumNames, NamedOnlyEnumsHaveDistinctNames) {
  std::set<std::string> kinds;
  for (const ErrorKind k : {ErrorKind::kGeneral, ErrorKind::kConfig, ErrorKind::kData, ErrorKind::kCheckpoint,
                            ErrorKind::kDistributed, ErrorKind::kDiverged})
    EXPECT_TRUE(kinds.insert(to_string(k)).second && kinds.count("?") == 0) << to_string(k);
  std::set<std::string> maths;
  using core::MathType;
  for (const MathType m : {MathType::kFp32, MathType::kTf32, MathType::kBf16, MathType::kFp16})
    EXPECT_TRUE(maths.insert(core::to_string(m)).second && maths.count("?") == 0) << core::to_string(m);
}

}  // namespace
}  // namespace ember
