#pragma once
// Divergence: a loss or weights gone NaN/infinite. The Trainer watches the
// loss on the device (no host sync per step), reads the watch every few
// steps, and stops with ErrorKind::kDiverged and a diagnosis; a checkpoint is
// never written over with non-finite weights.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>

namespace ember::train::divergence {

/// "parameter 'fc1.weight'" or "buffer 'bn1.running_var'": the first tensor of
/// `module` holding a NaN or an infinity; "" if none. One host sync.
std::string first_nonfinite_tensor(const torch::nn::Module& module);

/// The parameters (up to 3, in registration order) whose gradient holds a NaN
/// or an infinity, as "'fc1.weight', 'fc1.bias'"; "" if none. One host sync.
std::string nonfinite_gradients(const torch::nn::Module& module);

/// What to try, appended to every divergence message.
std::string advice();

/// Device-side record of the loss per optimizer step: the current run of
/// non-finite losses and the last finite one. record() only queues device
/// work; read() syncs once. A CPU loss is recorded on the host.
class DivergenceWatch {
 public:
  struct State {
    int64_t streak = 0;             ///< non-finite losses in a row, up to the last recorded step
    int64_t last_finite_step = -1;  ///< -1: none yet
    double last_finite_loss = 0.0;
  };
  void record(const torch::Tensor& loss, int64_t step);
  State read() const;

 private:
  torch::Tensor state_;     // float64 [3]: streak, last finite step, last finite loss
  torch::Tensor one_more_;  // [1, 0, 0]
  // A loss on the CPU: the same state on the host (nothing to sync there).
  State host_;
  bool on_host_ = false;
};

}  // namespace ember::train::divergence
