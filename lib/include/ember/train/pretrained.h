#pragma once
// Pretrained weights into a model: the safetensors files PyTorch users have
// (torchvision and timm state dicts saved with safetensors, Hugging Face
// `model.safetensors` and sharded `model.safetensors.index.json`).
//
//   models::ResNet net(models::ResNetOptions().depth(50));
//   train::load_pretrained(*net, "resnet50.safetensors");         // strict
//   train::load_pretrained(*net, "hf_dir/", train::PretrainedOptions().reinit({"fc."}));
//
// The model names each tensor it needs (its parameters and buffers, as
// candle's VarBuilder asks for each by path): every one must be found, with
// its shape, unless it is listed to be left as initialised (`reinit`: a new
// head for another number of classes, the explicit way). In strict mode
// (default) the load is refused before any tensor is read when anything is
// missing, unexpected or of another shape, with ALL of them named and, for
// a missing name, the file's closest names. Shapes are checked against the
// header before anything is allocated, and tensors are read one at a time
// (peak memory: the model plus one tensor). A file's dtype may differ from
// the model's (bf16 or fp16 files into fp32 master weights): it is cast.
//
// WeightMap adapts another naming: `rename` maps a file name to the model's
// (an empty result drops the tensor, e.g. GPT-2's causal-mask buffers), and
// `transposed` names the 2-D model tensors the file stores transposed
// (GPT-2's Conv1D weights are [in, out]), and `resize` adapts a tensor whose
// shape is legitimately another (a ViT's position table made for another
// image size), decided from the shapes before anything is read and applied
// as the tensor is read. Tied tensors (one tensor under two names) need only
// one of their names in the file.
#include <torch/nn/module.h>

#include "ember/core/weight_map.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ember::train {

/// How a file's naming and layout map to a model's (core/weight_map.h).
using WeightMap = core::WeightMap;

struct PretrainedOptions {
  /// Refuse (ember::Error naming everything) unless every model tensor is
  /// loaded or reinitialised, every file tensor is used, and shapes agree.
  /// false: load what matches and return the report.
  TORCH_ARG(bool, strict) = true;
  /// Prefixes of model names left as initialised; file tensors under them
  /// are ignored (a new head: {"fc."} for a ResNet, {"head."} for a ViT).
  TORCH_ARG(std::vector<std::string>, reinit) = {};
  TORCH_ARG(WeightMap, map) = {};
};

struct LoadReport {
  std::vector<std::string> loaded;         ///< model names given their file tensor
  std::vector<std::string> reinitialised;  ///< model names left as initialised (reinit)
  std::vector<std::string> resized;        ///< model names loaded through WeightMap::resize
  std::vector<std::string> missing;        ///< model names the file lacks
  std::vector<std::string> unexpected;     ///< file names (after rename) the model lacks
  std::vector<std::string> mismatched;     ///< "name: file [..], model [..]"
  /// For the first 20 missing names, the file's closest names ("a, b, c").
  std::vector<std::string> missing_closest;
  std::vector<std::string> files;  ///< the safetensors files read
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  /// Every problem, one per line; for each missing name the closest file names.
  std::string describe() const;
};

/// The safetensors files of a checkpoint: `path` itself (a .safetensors
/// file), the files a `*.safetensors.index.json` names (its weight_map), or
/// in a directory its model.safetensors.index.json or model.safetensors.
/// Errors name what is missing or inconsistent.
std::vector<std::string> checkpoint_files(const std::string& path);

/// Loads `path` (see checkpoint_files) into `model`'s parameters and buffers
/// by name (`model.named_parameters()` and `named_buffers()`), as above.
/// Values are copied into the existing tensors (their device and dtype
/// kept), under NoGradGuard.
LoadReport load_pretrained(torch::nn::Module& model, const std::string& path,
                           const PretrainedOptions& options = {});

/// The way back: `model`'s parameters and buffers written to the safetensors
/// file `path` in another naming (a tied tensor once, under its first name).
/// `to_file.rename` maps a model name to the file's ("" leaves the tensor
/// out; unset: the same name) and `to_file.transposed` names the 2-D model
/// tensors the file stores transposed. The metadata is {"format": "pt"}, which
/// transformers' from_pretrained requires. Written atomically.
void save_pretrained(const std::string& path, torch::nn::Module& model, const WeightMap& to_file = {});

/// The Python callable that builds a model's unpruned network, for save_for_pytorch.
struct PytorchBuilder {
  std::string name;                    ///< a dotted path: "torchvision.models.resnet50", "timm.create_model"
  std::string kwargs_json;             ///< its keyword arguments as a JSON object: {"num_classes": 10}
  std::vector<int64_t> example_input;  ///< an input's shape for torch.export ([1, 3, 224, 224]); empty: none
};

/// A model handed to plain PyTorch, also after channel pruning: `dir`/model.safetensors
/// (save_pretrained with `to_file`) and `dir`/model.json naming `builder`.
/// tools/pytorch/ember_pruned.py builds the network with the builder, rebuilds
/// every layer whose tensors in the file have other sizes (the channels
/// Ember's pruner removed) and loads the file strict: no Ember needed.
void save_for_pytorch(const std::string& dir, torch::nn::Module& model, const PytorchBuilder& builder,
                      const WeightMap& to_file = {});

}  // namespace ember::train
