#include "ember/train/early_stopping.h"

#include <cmath>

#include "core/check.h"
#include "ember/core/enum_names.h"
#include "ember/train/trainer.h"

namespace ember::train {

namespace {
constexpr core::EnumNames<EarlyStoppingMetric, 2> kMetricNames{
    "early_stop.monitor metric",
    {{{EarlyStoppingMetric::kValLoss, "val_loss"}, {EarlyStoppingMetric::kValAccuracy, "val_accuracy"}}}};
}  // namespace

EarlyStoppingMetric parse_early_stopping_metric(const std::string& name) {
  return kMetricNames.parse(name, "train::EarlyStopping");
}

const char* to_string(EarlyStoppingMetric metric) {
  return kMetricNames.name(metric);
}

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  EMBER_CHECK(options_.patience() >= 1, "[train::EarlyStopping] patience must be >= 1, got {}",
              options_.patience());
  EMBER_CHECK(options_.min_delta() >= 0, "[train::EarlyStopping] min_delta must be >= 0, got {}",
              options_.min_delta());
  maximize_ = options_.monitor() == EarlyStoppingMetric::kValAccuracy;
  best_ = maximize_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
}

void EarlyStopping::on_validation_end(Trainer& trainer, int64_t epoch, const EvalResult& val) {
  const double value = maximize_ ? val.accuracy : val.loss;
  if (options_.check_finite() && !std::isfinite(value)) {
    trainer.request_stop(
        fmt::format("early stopping: {} is {} at epoch {}", to_string(options_.monitor()), value, epoch + 1));
    return;
  }
  const bool improved =
      maximize_ ? value > best_ + options_.min_delta() : value < best_ - options_.min_delta();
  if (improved) {
    best_ = value;
    bad_epochs_ = 0;
    return;
  }
  if (++bad_epochs_ >= options_.patience())
    trainer.request_stop(fmt::format("early stopping: {} did not improve on {:.6g} for {} epochs",
                                     to_string(options_.monitor()), best_, bad_epochs_));
}

void EarlyStopping::on_checkpoint_save(Trainer&, torch::serialize::OutputArchive& archive) {
  archive.write("best", torch::IValue(best_));
  archive.write("bad_epochs", torch::IValue(bad_epochs_));
}

void EarlyStopping::on_checkpoint_load(Trainer&, torch::serialize::InputArchive& archive) {
  torch::IValue v;
  archive.read("best", v);
  best_ = v.toDouble();
  archive.read("bad_epochs", v);
  bad_epochs_ = v.toInt();
}

}  // namespace ember::train
