// train::Distribution over a dist::ProcessGroup.
#include "ember/dist/distribution.h"

#include <torch/torch.h>

#include "core/check.h"

namespace ember::dist {
namespace {

class GroupDistribution : public train::Distribution {
 public:
  GroupDistribution(std::shared_ptr<ProcessGroup> group, int64_t copies)
      : group_(std::move(group)), copies_(copies) {}
  int64_t world_size() const override { return group_->size(); }
  int64_t rank() const override { return group_->rank(); }
  int64_t sample_copies() const override { return copies_; }
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
  int64_t copies_;
};

}  // namespace

std::shared_ptr<train::Distribution> make_distribution(std::shared_ptr<ProcessGroup> group,
                                                       int64_t sample_copies) {
  EMBER_CHECK(group != nullptr, "[dist::make_distribution] no process group");
  EMBER_CHECK(sample_copies >= 1 && group->size() % sample_copies == 0,
              "[dist::make_distribution] {} copies of each sample do not divide {} ranks", sample_copies,
              group->size());
  return std::make_shared<GroupDistribution>(std::move(group), sample_copies);
}

}  // namespace ember::dist
