#pragma once
// Divergence: a loss or weights gone NaN/infinite. The Trainer watches the
// loss on the device (no host sync per step), reads the watch every few
// steps without a sync (one read behind), and stops with ErrorKind::kDiverged and a diagnosis; a checkpoint
// is never written over with non-finite weights.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <optional>
#include <string>

#include "train/host_read.h"

namespace ember::train::divergence {

/// "parameter 'fc1.weight'" or "buffer 'bn1.running_var'": the first tensor of
/// `module` holding a NaN or an infinity; "" if none. One host sync.
std::string first_nonfinite_tensor(const torch::nn::Module& module);

/// The parameters (up to 3, in registration order) whose gradient holds a NaN
/// or an infinity, as "'fc1.weight', 'fc1.bias'"; "" if none. One host sync.
std::string nonfinite_gradients(const torch::nn::Module& module);

/// What to try, appended to every divergence message.
std::string advice();

/// The message of a checkpoint refused because `tensor` (first_nonfinite_tensor) is not finite at `step`.
std::string weights_message(const std::string& tensor, int64_t step, const std::string& checkpoint);

/// Record of the loss per optimizer step: the current run of non-finite
/// losses and the last finite one. record() only queues device work (tensor
/// ops, in place: a CUDA graph can capture it); read() syncs once;
/// request_read() and poll_read() read without a sync, one request behind.
/// A CPU loss is recorded on the host, unless Record::kTensorOps asks for the
/// device path on any device (a graph step, real or emulated, must not keep
/// state on the host).
class DivergenceWatch {
 public:
  enum class Record { kAuto, kTensorOps };
  struct State {
    int64_t streak = 0;             ///< non-finite losses in a row, up to the last recorded step
    int64_t last_finite_step = -1;  ///< -1: none yet
    double last_finite_loss = 0.0;
    int64_t step = 0;  ///< the step of the last record
  };
  explicit DivergenceWatch(Record record = Record::kAuto) : mode_(record) {}
  /// The loss of optimizer step `step`; on the device path `step` is read only
  /// by the first record (the device counts from there: one record per step).
  void record(const torch::Tensor& loss, int64_t step);
  State read() const;
  /// Queues a copy of the state to the host (no sync); nothing while one is pending.
  void request_read();
  /// The state of the last request, once the device made the copy; nullopt before.
  std::optional<State> poll_read();
  /// The state of the last request, waiting for the copy; nullopt when none
  /// was requested. Data-parallel ranks read this way: every rank then judges
  /// the same records at the same step.
  std::optional<State> wait_read();

 private:
  static State parse(const torch::Tensor& host);
  Record mode_;
  // float64 [4]: streak, last finite step, last finite loss, step; and [1, 0, 0, 1].
  torch::Tensor state_, one_more_;
  HostRead pending_;
  // A loss on the CPU: the same state on the host (nothing to sync there).
  State host_;
  bool on_host_ = false;
};

}  // namespace ember::train::divergence
