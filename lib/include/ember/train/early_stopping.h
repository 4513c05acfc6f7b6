#pragma once
// EarlyStopping: stops fit when a validation metric stops improving.

#include <torch/arg.h>
#include <limits>
#include <string>

#include "ember/train/callback.h"

namespace ember::train {

/// What early stopping watches.
enum class EarlyStoppingMetric { kValLoss, kValAccuracy };
/// "val_loss" or "val_accuracy" -> EarlyStoppingMetric; anything else is a config error.
EarlyStoppingMetric parse_early_stopping_metric(const std::string& name);
const char* to_string(EarlyStoppingMetric metric);

struct EarlyStoppingOptions {
  /// Epochs without improvement before stopping.
  explicit EarlyStoppingOptions(int64_t patience = 3) : patience_(patience) {}
  TORCH_ARG(int64_t, patience);
  /// Validation loss (lower is better) or accuracy (higher is better).
  TORCH_ARG(EarlyStoppingMetric, monitor) = EarlyStoppingMetric::kValLoss;
  /// Smallest change that counts as an improvement.
  TORCH_ARG(double, min_delta) = 0.0;
  /// Stop when the monitored value is not finite (NaN/inf loss).
  TORCH_ARG(bool, check_finite) = true;
};

class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options);
  std::string name() const override { return "early_stopping"; }
  void on_validation_end(Trainer& trainer, int64_t epoch, const EvalResult& val) override;
  void on_checkpoint_save(Trainer& trainer, torch::serialize::OutputArchive& archive) override;
  void on_checkpoint_load(Trainer& trainer, torch::serialize::InputArchive& archive) override;

  double best() const { return best_; }
  int64_t bad_epochs() const { return bad_epochs_; }

 private:
  EarlyStoppingOptions options_;
  bool maximize_ = false;
  double best_;
  int64_t bad_epochs_ = 0;
};

}  // namespace ember::train
