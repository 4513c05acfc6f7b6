#pragma once
// Learning-rate range test (Smith 2015; the "LR finder" of fastai and
// Lightning): train for a few hundred steps while the learning rate grows
// exponentially from min_lr to max_lr, record the loss of every step, and
// suggest a learning rate from the curve.
//
//   train::LrFinderResult r = train::find_lr(task, trainer_options, train::LrFinderOptions());
//   std::cout << "optim.lr=" << r.suggested_lr << "\n";
//
// It runs the Trainer's own step (precision, loss scaling, accumulation,
// clipping, the task's optimizer), on the task's model: its parameters and
// buffers, and LibTorch's CPU (and CUDA) random generators, are restored
// afterwards, so the task is as before (a run on a copy of the model). The
// loader's position is not kept (fit() restarts it).
//
// The curve: step i uses lr_i = min_lr x (max_lr / min_lr)^(i / (steps - 1))
// (other parameter groups keep their ratio to the first); loss_i is the
// step's training loss. While it runs, the loss is smoothed by a
// bias-corrected exponential moving average (factor beta = `smoothing`; 0 =
// a window of 5% of the steps, beta = 1 - 1 / max(2, steps / 20)); the test
// stops once that average exceeds `divergence` x its minimum, or a loss is
// not finite.
//
// That average lags the sweep by about beta / (1 - beta) steps, so the
// suggestions are taken on a curve without lag: the losses, capped at
// divergence x the average's minimum (the exploded tail would smear back),
// smoothed by the same average forward and then backward (as scipy's
// filtfilt). Both rules work against log10(lr) (the slope against lr itself
// is dominated by the largest rates):
// - steepest (suggested_lr): the point where that curve falls fastest,
//   d smoothed / d log10(lr) most negative (central differences), among the
//   points after the first 10% and up to the curve's minimum;
// - valley (valley_lr, fastai's rule): the longest decreasing subsequence of
//   that curve; the point halfway along it.

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ember/train/task.h"
#include "ember/train/trainer.h"

namespace ember::train {

struct LrFinderOptions {
  TORCH_ARG(double, min_lr) = 1e-7;
  TORCH_ARG(double, max_lr) = 10.0;
  /// Optimizer steps of the sweep.
  TORCH_ARG(int64_t, steps) = 200;
  /// Factor of the loss's exponential moving average, in [0, 1); 0 = a window of 5% of the steps.
  TORCH_ARG(double, smoothing) = 0;
  /// Stop once the smoothed loss exceeds this multiple of its minimum (> 1).
  TORCH_ARG(double, divergence) = 4.0;
};

struct LrFinderResult {
  std::vector<double> lrs;       ///< learning rate of each step (the first parameter group's)
  std::vector<double> losses;    ///< training loss of each step
  std::vector<double> online;    ///< the moving average the stop watched (lags the sweep)
  std::vector<double> smoothed;  ///< the curve without lag that the rules use (see the top of this file)
  double smoothing = 0;          ///< the factor used
  double suggested_lr = 0;       ///< steepest descent; 0 = the curve is too short to say
  int64_t suggested_index = -1;
  double valley_lr = 0;  ///< fastai's valley rule; 0 = too short
  int64_t valley_index = -1;
  std::string stop_reason;  ///< "completed N steps", or why it stopped early
};

/// The rules on a recorded curve (index into `lrs`, or -1 if it has fewer than 5 points).
int64_t steepest_descent_index(const std::vector<double>& lrs, const std::vector<double>& smoothed);
int64_t valley_index(const std::vector<double>& smoothed);

/// Runs the test with `options` (run_dir, resume, schedule, epochs, max_steps,
/// validation and checkpoints are replaced: it writes nothing).
LrFinderResult find_lr(Task& task, TrainerOptions options, const LrFinderOptions& finder = {});

}  // namespace ember::train
