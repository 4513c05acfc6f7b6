#include "ember/train/task_cost.h"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "ember/core/model_cost.h"
#include "ember/core/snapshot.h"

namespace ember::train {

double forward_macs_per_sample(Task& task) {
  // Drawing the batch may use the random generators (augmentation): the run must not see it.
  const core::ModelSnapshot rng(*task.model(), core::ModelSnapshotOptions().parameters(false).buffers(false));
  data::Loader* loader = task.val_loader() ? task.val_loader() : task.test_loader();
  if (!loader) loader = &task.train_loader();
  loader->start_epoch(0, 0);
  std::optional<data::Batch> batch = loader->next();
  if (!batch || batch->size() == 0) return 0;
  const int64_t n = std::min<int64_t>(batch->size(), 2);
  const auto head = [n](const torch::Tensor& t) {
    return t.defined() && t.dim() > 0 ? t.narrow(0, 0, n) : t;
  };
  batch->input = head(batch->input);
  batch->target = head(batch->target);
  batch->index = head(batch->index);
  const core::ModelCost cost = core::count_cost(*task.model(), [&] {
    const StepOutput out = task.evaluation_step(*batch);
    return std::vector<torch::Tensor>{out.output.defined() ? out.output : out.loss};
  });
  return static_cast<double>(cost.macs) / static_cast<double>(n);
}

}  // namespace ember::train
