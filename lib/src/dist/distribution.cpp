// train::Distribution over a dist::ProcessGroup.
#include "ember/dist/distribution.h"

#include <torch/torch.h>

#include "core/check.h"

namespace ember::dist {
namespace {

class GroupDistribution : public train::Distribution {
 public:
  explicit GroupDistribution(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {}
  int64_t world_size() const override { return group_->size(); }
  int64_t rank() const override { return group_->rank(); }
  void all_reduce_sum(torch::Tensor& tensor) override { group_->all_reduce_sum_(tensor); }
  bool any(bool flag) override {
    torch::Tensor t = torch::full({1}, flag ? 1.0 : 0.0,
                                  torch::TensorOptions().dtype(torch::kFloat64).device(group_->device()));
    group_->all_reduce_sum_(t);
    return t.item<double>() > 0;
  }
  void check_same(const std::string& what, const std::string& value) override {
    group_->check_same_everywhere(what, value);
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace

std::shared_ptr<train::Distribution> make_distribution(std::shared_ptr<ProcessGroup> group) {
  EMBER_CHECK(group != nullptr, "[dist::make_distribution] no process group");
  return std::make_shared<GroupDistribution>(std::move(group));
}

}  // namespace ember::dist
