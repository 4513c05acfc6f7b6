#include "ember/data/dataset.h"

namespace ember::data {

TensorDataset TensorDataset::head(int64_t n) const {
  if (n < 0 || n >= size()) return *this;
  return {inputs.narrow(0, 0, n), targets.narrow(0, 0, n)};
}

TensorDataset TensorDataset::gather(const torch::Tensor& indices) const {
  return {inputs.index_select(0, indices), targets.index_select(0, indices)};
}

}  // namespace ember::data
