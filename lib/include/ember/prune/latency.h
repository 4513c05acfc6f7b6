#pragma once
// Latency for pruning: what a conv or linear layer costs on the device at a
// given width, and what the whole model costs, so that the pruner can remove
// the channels that buy the most time for the least importance
// (Pruner::prune_to_latency) and round widths to what the device runs fast.
//
//   prune::MeasuredLatency latency(prune::LatencyOptions().batch(64).table("~/.cache/ember/latency.json"));
//   auto infer = [&] { torch::NoGradGuard g; model->forward(batch64); };
//   pruner.prune_to_latency(1.5, latency, infer, &optimizer);   // 1.5x faster inference, measured
//
// Speed on real hardware moves in steps with the channel count (vector widths,
// tensor-core tiles, oneDNN's blocked layouts), not with the MACs, so the
// pruner asks the table for the time of each layer at candidate widths. Each
// (device, dtype, layout, shape) is timed once and kept in the table file; a
// later run on the same machine reads it instead of timing again. Tests inject
// their own LatencySource (a model of steps), so the algorithm is checked
// exactly without timing anything.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ember/core/model_cost.h"

namespace ember::prune {

/// One conv or linear layer as the latency table sees it, per sample.
struct LayerOp {
  enum class Kind { kConv, kLinear };
  Kind kind = Kind::kLinear;
  std::string weight;       ///< the weight's qualified name, e.g. "stages.0.conv1.weight"
  int64_t in = 0, out = 0;  ///< input and output channels (features)
  int64_t groups = 1;       ///< conv groups (depthwise: groups == in == out)
  std::vector<int64_t> kernel, stride, padding, dilation;  ///< conv only
  /// conv: the input's spatial size; linear: {rows per sample} (tokens of a sequence model, else 1).
  std::vector<int64_t> extent;
  /// Whether a depthwise conv (its input channels and groups follow its output channels).
  bool depthwise() const { return kind == Kind::kConv && groups > 1 && groups == in && groups == out; }
  /// The shape part of a table key at `batch` samples, e.g. "conv b64 i16 o32 x28,28 k3,3 s1,1 p1,1 d1,1 g1".
  std::string key(int64_t batch) const;
};

/// The conv (1-d, 2-d) and linear layers that `forward` (the model on one
/// sample) runs, in forward order, with their shapes. Other ops with weights
/// (transposed convs, embeddings, matmuls in custom modules) are left out:
/// their time counts as fixed. A layer called twice appears twice.
std::vector<LayerOp> layer_ops(torch::nn::Module& model, const core::ForwardFn& forward);

/// Where latencies come from: measured on the device (MeasuredLatency) or a model (tests).
class LatencySource {
 public:
  virtual ~LatencySource() = default;
  /// Microseconds of one inference forward of `op` at the source's batch.
  virtual double op_us(const LayerOp& op) = 0;
  /// Microseconds of one inference forward of the whole model; `infer` runs it once.
  virtual double model_us(torch::nn::Module& model, const std::function<void()>& infer) = 0;
  /// The relative uncertainty of the last model_us (op: false) or of the
  /// layer times (op: true); 0 = exact. A change smaller than this is not
  /// believed: the pruner takes no width step whose saving is within it and
  /// stops when a round's measured gain is.
  virtual double noise(bool op) const {
    (void)op;
    return 0.0;
  }
  /// A decision every data-parallel rank must take alike (stop, out of time):
  /// true on all ranks when `local` is true on any. One process: `local`.
  virtual bool any(bool local) { return local; }
};

struct LatencyOptions {
  /// Samples per timed forward (the batch the speed-up is asked for).
  TORCH_ARG(int64_t, batch) = 64;
  TORCH_ARG(torch::Device, device) = torch::kCPU;
  /// The dtype the layers compute in (autocast's for mixed precision).
  TORCH_ARG(torch::Dtype, dtype) = torch::kFloat;
  /// fp32 layers run with TF32 tensor-core math (precision tf32 on CUDA): their
  /// own table entries, since TF32 and fp32 convolutions differ in speed and in
  /// the widths they run fast. The caller sets the math mode; this only keys it.
  TORCH_ARG(bool, tf32) = false;
  /// Convs timed on channels-last inputs and weights (trainer.channels_last).
  TORCH_ARG(bool, channels_last) = false;
  /// File of the cached table, shared by devices (keys name theirs); "" = kept in memory only.
  TORCH_ARG(std::string, table) = "";
  /// Untimed runs before each measurement.
  TORCH_ARG(int64_t, warmup) = 1;
  /// Runs in each of the three timed means: at least `reps`, and enough for a
  /// mean to cover `min_time_us` of work, so that a small layer is not timed
  /// by its launch overhead or the clock's resolution. A measurement is the
  /// median of the three means; its distance to the nearer of the other two
  /// is its noise (one mean thrown off by a burst of load does not count).
  TORCH_ARG(int64_t, reps) = 1;
  TORCH_ARG(double, min_time_us) = 2000;
  /// Paired model timing: model_us times the model and a yardstick in
  /// alternating rounds, the yardstick over as much wall time as the model,
  /// and returns the yardstick's time x the median of the paired ratios, so
  /// that drift in the machine's load between measurements (30% seen on a
  /// shared 2-core machine) cancels. The yardstick is
  /// `reference` if set (e.g. the unpruned model kept aside), else a fixed
  /// matrix product in `dtype` on the device. false: the model alone.
  TORCH_ARG(bool, paired) = true;
  TORCH_ARG(std::function<void()>, reference) = nullptr;
  /// The yardstick's time that paired ratios are scaled by; 0 = measured at
  /// the first model_us. A caller timing one model over several objects (the
  /// pruning callback's steps) keeps yardstick_us() and passes it back, so
  /// that all its measurements share one scale.
  TORCH_ARG(double, yardstick_us) = 0;
  /// Microseconds since any fixed point; nullptr = the steady clock on the
  /// CPU and CUDA events on a GPU. Tests inject a clock the timed work advances.
  TORCH_ARG(std::function<double()>, clock_us) = nullptr;
};

/// Times layers and models on the device; layer times are cached in a table
/// keyed by device, dtype, layout and shape, loaded from and saved to
/// options().table(). A table that cannot be read is set aside with a warning
/// ("<table>.bad") and rebuilt; saving merges with what another process wrote
/// meanwhile and replaces the file atomically.
class MeasuredLatency : public LatencySource {
 public:
  explicit MeasuredLatency(LatencyOptions options = {});
  ~MeasuredLatency() override;
  MeasuredLatency(const MeasuredLatency&) = delete;
  MeasuredLatency& operator=(const MeasuredLatency&) = delete;

  double op_us(const LayerOp& op) override;
  double model_us(torch::nn::Module& model, const std::function<void()>& infer) override;
  double noise(bool op) const override { return op ? op_noise_ : model_noise_; }
  /// The paired yardstick's time (0 before the first paired model_us).
  double yardstick_us() const { return yardstick_us_; }

  /// Writes the table (also done by the destructor); no-op without a file.
  void save();
  /// Layers timed by this object (the rest came from the table).
  int64_t timed_ops() const { return timed_ops_; }
  /// The table's entries: "<device> | <dtype> | <layout> | <LayerOp::key>" -> microseconds.
  const std::map<std::string, double>& entries() const { return entries_; }
  /// What the keys call this device, e.g. "cpu AVX512 2 threads" or "cuda NVIDIA H200".
  const std::string& device_name() const { return device_name_; }
  const LatencyOptions& options() const { return options_; }

 private:
  std::string full_key(const LayerOp& op) const;
  struct Timing {
    double us = 0, spread = 0;  // the median of three means; its distance to the nearer other / median
  };
  /// Each of the three means covers at least `min_time_us` (< 0: the options').
  Timing time(const std::function<void()>& run, double min_time_us = -1);

  LatencyOptions options_;
  std::string device_name_;
  std::map<std::string, double> entries_;
  int64_t timed_ops_ = 0;
  bool dirty_ = false;
  double yardstick_us_ = 0;
  double op_noise_ = 0, model_noise_ = 0;
  std::vector<double> op_spreads_;
  std::function<void()> yardstick_;
  torch::Tensor yardstick_a_, yardstick_b_;
};

/// The device as latency-table keys name it: "cpu <ISA> <threads> threads" or "cuda <name>".
std::string latency_device_name(torch::Device device);

/// The channel multiple the device runs fast, the default of prune.round_to:
/// on CUDA 8 for fp16/bf16 and 4 for TF32 (tensor-core tiles: 16 bytes of k
/// per MMA row), 1 for plain fp32; on a CPU with AVX2 or AVX-512, 8 (oneDNN's
/// channel blocks are 8 or 16; 16 was measured too coarse for the latency
/// target on small ResNets), else 1.
int64_t default_round_to(torch::Device device, torch::Dtype dtype, bool tf32 = false);

}  // namespace ember::prune
