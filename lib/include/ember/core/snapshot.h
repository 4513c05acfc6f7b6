#pragma once
// Snapshots of what a measurement or a sweep changes and must put back: the
// random generators (RngState) and a model's values, modes and gradients
// (ModelSnapshot). Pruning's measurements, the finders, the task's cost count
// and checkpoints use these, so that every one of them restores every device.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ember::core {

/// LibTorch's default random generators: the CPU's and every CUDA device's.
struct RngState {
  torch::Tensor cpu;
  std::vector<torch::Tensor> cuda;  ///< by device index (empty without CUDA)

  /// The generators' states now.
  static RngState capture();
  /// Sets the generators back to these states (the CUDA devices captured).
  void restore() const;
  /// Into an archive as "rng_cpu" and "rng_cuda_<i>" (a checkpoint's keys).
  void write(torch::serialize::OutputArchive& archive) const;
  /// From those keys; a CUDA device the archive does not hold (a checkpoint
  /// written without CUDA) keeps its state. Throws LibTorch's error without "rng_cpu".
  static RngState read(torch::serialize::InputArchive& archive);
};

struct ModelSnapshotOptions {
  /// The parameters' values (put back by name: a parameter that is gone or
  /// changed shape is an error).
  TORCH_ARG(bool, parameters) = true;
  /// The buffers' values (batch-norm statistics...), by name as parameters.
  TORCH_ARG(bool, buffers) = true;
  /// Gradients: set aside at the snapshot (the model starts with none) and put back.
  TORCH_ARG(bool, set_aside_grads) = false;
  /// Gradients are cleared at restore (what the snapshot's user made is dropped).
  TORCH_ARG(bool, clear_grads) = false;
  /// The random generators (RngState).
  TORCH_ARG(bool, rng) = true;
};

/// Takes what the options name from `model` and puts it back with restore(),
/// or on destruction if restore() was not called (a failure there is written
/// to stderr instead of thrown). Every module's train/eval mode is always
/// kept. The model must outlive the snapshot.
class ModelSnapshot {
 public:
  explicit ModelSnapshot(torch::nn::Module& model, ModelSnapshotOptions options = ModelSnapshotOptions());
  ~ModelSnapshot();
  ModelSnapshot(const ModelSnapshot&) = delete;
  ModelSnapshot& operator=(const ModelSnapshot&) = delete;

  /// Puts everything back now (once; throws ember::Error if a tensor is gone or changed shape).
  void restore();

 private:
  torch::nn::Module& model_;
  ModelSnapshotOptions options_;
  bool restored_ = false;
  std::vector<std::pair<std::string, torch::Tensor>> values_;  // "p:" / "b:" + name
  std::vector<std::pair<torch::Tensor, torch::Tensor>> grads_;
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes_;
  RngState rng_;
};

}  // namespace ember::core
