#pragma once
// A module that calls some of its children through members of its own lets a
// tool swap them for modules of another type that compute the same function
// differently (dist::convert_sync_batchnorm: a torch::nn::BatchNorm2d for a
// dist::SyncBatchNorm2d, the same tensors, statistics over every rank).
//
// Why a module must opt in: a LibTorch module calls a child through its typed
// member (`torch::nn::BatchNorm2d bn1_; ... bn1_(x)`), bound at compile time to
// BatchNorm2dImpl::forward. Module::replace_module changes the registry
// (parameters(), named_modules()) but not that call, so the old module would
// keep running unseen. A torch::nn::Sequential calls its entries through
// torch::nn::AnyModule, which a tool can replace in place; any other parent
// implements this interface (CifarResNet's BasicBlock does), or the tool
// refuses, naming the parent.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <string>
#include <vector>

namespace ember::core {

class SwappableChildren {
 public:
  virtual ~SwappableChildren() = default;
  /// Names of the registered children this module calls through members that
  /// swap_child can rebind.
  virtual std::vector<std::string> swappable_children() const = 0;
  /// Registers `module` as child `name` (one of swappable_children()) and
  /// calls it from now on. It must take the same arguments and compute the
  /// same function as the child it replaces.
  virtual void swap_child(const std::string& name, torch::nn::AnyModule module) = 0;
};

}  // namespace ember::core
