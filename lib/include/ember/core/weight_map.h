#pragma once
// How a checkpoint's naming and layout map to a model's: the WeightMap that
// train::load_pretrained and train::save_pretrained take (train/pretrained.h).
// In core/ so that a model (models/) can state its own map beside its names
// (models::Gpt2Impl::hf_map, models::ViTImpl::timm_map).
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ember::core {

struct WeightMap {
  /// File name -> model name ("" drops the tensor). Unset: the same name.
  std::function<std::string(const std::string&)> rename;
  /// Model names whose file tensor is the transpose of the model's (2-D).
  std::function<bool(const std::string&)> transposed;
  /// For a model tensor whose file shape (after any transpose) differs from
  /// the model's: whether `apply` can make one from the other (checked for
  /// every such tensor before anything is read; false: a shape mismatch).
  struct Resize {
    std::function<bool(const std::string& model_name, const std::vector<int64_t>& file_shape,
                       const std::vector<int64_t>& model_shape)>
        accepts;
    /// The file's tensor (as read, transposed if marked) -> the model's shape.
    std::function<torch::Tensor(const std::string& model_name, const torch::Tensor& file_tensor,
                                const std::vector<int64_t>& model_shape)>
        apply;
  } resize;
};

}  // namespace ember::core
