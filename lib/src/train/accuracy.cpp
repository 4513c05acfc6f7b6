#include "ember/train/accuracy.h"

#include <torch/torch.h>

#include <cmath>

#include "core/check.h"
#include "ember/version.h"

#if EMBER_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "train/cuda/accuracy_kernel.h"
#endif

namespace ember::train {
namespace {

void check_inputs(const torch::Tensor& logits, const torch::Tensor& targets) {
  EMBER_CHECK(logits.dim() == 2, "[train::count_correct] logits must be [N, C], got {}D", logits.dim());
  EMBER_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0),
              "[train::count_correct] targets must be [N] with N = {}, got [{}]", logits.size(0),
              fmt::join(targets.sizes(), ", "));
  EMBER_CHECK(c10::isFloatingType(logits.scalar_type()),
              "[train::count_correct] logits must be floating point, got {}",
              c10::toString(logits.scalar_type()));
  EMBER_CHECK(c10::isIntegralType(targets.scalar_type(), /*includeBool=*/false),
              "[train::count_correct] targets must be integer class indices, got {}",
              c10::toString(targets.scalar_type()));
  EMBER_CHECK(logits.device() == targets.device(), "[train::count_correct] logits on {} but targets on {}",
              logits.device().str(), targets.device().str());
  EMBER_CHECK(logits.size(0) == 0 || logits.size(1) > 0,
              "[train::count_correct] logits [{}, 0] have no classes", logits.size(0));
}

// Rows of x [n, c] whose first arg-max (NaN counts as the largest, as
// torch.argmax) equals the target. A plain loop: no dispatcher round-trips.
template <typename T>
int64_t count_on_host(const T* x, const int64_t* y, int64_t n, int64_t c) {
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i, x += c) {
    int64_t best = 0;
    for (int64_t j = 1; j < c && !std::isnan(x[best]); ++j)
      if (x[j] > x[best] || std::isnan(x[j])) best = j;
    correct += best == y[i];
  }
  return correct;
}

}  // namespace

torch::Tensor count_correct_reference(const torch::Tensor& logits, const torch::Tensor& targets) {
  check_inputs(logits, targets);
  // fp32 and fp64 as they are, the half types widened (exactly) to fp64.
  const bool as_is = logits.scalar_type() == torch::kFloat || logits.scalar_type() == torch::kDouble;
  const torch::Tensor x = logits.to(torch::kCPU, as_is ? logits.scalar_type() : torch::kDouble).contiguous();
  const torch::Tensor y = targets.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t correct = n == 0 ? 0
                          : x.scalar_type() == torch::kFloat
                              ? count_on_host(x.data_ptr<float>(), y.data_ptr<int64_t>(), n, c)
                              : count_on_host(x.data_ptr<double>(), y.data_ptr<int64_t>(), n, c);
  return torch::tensor(correct, torch::TensorOptions().dtype(torch::kInt64)).to(logits.device());
}

torch::Tensor count_correct(const torch::Tensor& logits, const torch::Tensor& targets) {
  check_inputs(logits, targets);
  if (!logits.is_cuda()) return count_correct_reference(logits, targets);
#if EMBER_WITH_CUDA_KERNELS
  const c10::cuda::CUDAGuard guard(logits.device());
  const torch::Tensor x = logits.contiguous();
  const torch::Tensor t = targets.to(torch::kInt64).contiguous();
  torch::Tensor out = torch::zeros({}, logits.options().dtype(torch::kInt64));
  if (x.size(0) == 0 || x.size(1) == 0) return out;
  cuda::DType dtype;
  switch (x.scalar_type()) {
    case torch::kFloat:
      dtype = cuda::DType::kFloat32;
      break;
    case torch::kDouble:
      dtype = cuda::DType::kFloat64;
      break;
    case torch::kHalf:
      dtype = cuda::DType::kFloat16;
      break;
    case torch::kBFloat16:
      dtype = cuda::DType::kBFloat16;
      break;
    default:
      return count_correct_reference(logits, targets);
  }
  cuda::launch_count_correct(x.data_ptr(), dtype, t.data_ptr<int64_t>(), x.size(0), x.size(1),
                             reinterpret_cast<unsigned long long*>(out.data_ptr<int64_t>()),
                             c10::cuda::getCurrentCUDAStream().stream());
  return out;
#else
  ember::detail::fail(
      "[train::count_correct] logits are on {}, but this Ember was built without CUDA "
      "(EMBER_CUDA=OFF or no nvcc); rebuild with CUDA or move the tensors to the CPU",
      logits.device().str());
#endif
}

}  // namespace ember::train
