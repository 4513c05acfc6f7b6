#pragma once
// Floating comparisons in the tests: the rule, and the one helper that applies it.
//
// The torch wheel's BLAS, oneDNN and vectorised ATen kernels choose their code by CPU
// vendor, instruction set (AVX-512, AVX2, SSE) and thread count, so two different
// computations of one mathematical value (another GEMM inner dimension or blocking,
// another reduction order, fused against unfused, a pruned against a zeroed layer)
// can differ by a few units of rounding that move between machines. Hence every
// floating comparison in ember_tests is one of three kinds:
//
//  1. The same computation: the same op sequence on the same shapes, dtype, device
//     and thread count (a rerun, a resume at the same world size, a clone, a replay).
//     Compared bitwise (torch::equal), with a comment saying why it is the same.
//  2. Two computations of one value: |a - b| <= rounding_bound(dtype, roundings, scale)
//     = roundings * eps(dtype) * scale, where `roundings` counts the rounded
//     operations along the longest chain feeding one element (a sum or dot product of
//     n terms: n; layers add up; S steps multiply) and `scale` is the magnitude of
//     what is rounded (max |reference|, or the sum of |terms| where terms cancel).
//     Each rounding errs by at most eps / 2 of what it rounds, and each of the two
//     computations may err either way: eps per rounding. Where the test is about an
//     identity (pruning equivalences, sharded against one process, SyncBatchNorm
//     against BatchNorm) it runs in float64, where the same rule leaves ~1e-12 of room.
//  3. A computation against an exact value or a float64 formula: the same rule (eps
//     per rounding, twice what one side needs), or for sampled quantities a statistical
//     bound (standard errors of the estimate), which is no rounding tolerance.
//
// No bound is tuned to what one machine printed. Set EMBER_TEST_LOG_DIFFS=1 to have
// near() print each comparison's largest difference and its bound (ratio included)
// to stderr: how the suite measures the margin under each forced dispatch level.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace ember::test_util {

/// The distance from 1 to the next representable number of a floating `dtype`:
/// 2^-23 (float32), 2^-52 (float64), 2^-10 (float16), 2^-7 (bfloat16).
inline double eps(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat64:
      return std::ldexp(1.0, -52);
    case torch::kFloat32:
      return std::ldexp(1.0, -23);
    case torch::kFloat16:
      return std::ldexp(1.0, -10);
    case torch::kBFloat16:
      return std::ldexp(1.0, -7);
    default:
      throw std::invalid_argument(std::string("test_util::eps: not a floating dtype: ") +
                                  c10::toString(dtype));
  }
}

/// The largest |a - b| two computations of one value in `dtype` may show: `roundings`
/// (the longest chain of rounded operations into one element) x eps(dtype) x `scale`
/// (the magnitude of what is rounded). See the rule at the top of this file.
inline double rounding_bound(torch::ScalarType dtype, double roundings, double scale) {
  return roundings * eps(dtype) * scale;
}

/// max |t| as a double (0 for an empty tensor).
inline double max_abs(const torch::Tensor& t) {
  return t.numel() == 0 ? 0.0 : t.detach().abs().max().to(torch::kFloat64).item<double>();
}

/// max |a - b| as a double (a and b broadcast; 0 when empty).
inline double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return max_abs(a.detach().to(torch::kFloat64) - b.detach().to(torch::kFloat64));
}

/// A gtest predicate: max |a - b| <= bound, same shapes. The failure names the largest
/// difference, where it is, both values and the bound.
/// EXPECT_TRUE(test_util::near(got, want, test_util::rounding_bound(torch::kFloat64, 64, scale)));
inline ::testing::AssertionResult near(const torch::Tensor& a, const torch::Tensor& b, double bound) {
  if (a.sizes() != b.sizes()) {
    std::ostringstream s;
    s << "shapes differ: " << a.sizes() << " and " << b.sizes();
    return ::testing::AssertionFailure() << s.str();
  }
  const torch::Tensor d = (a.detach().to(torch::kFloat64) - b.detach().to(torch::kFloat64)).abs().flatten();
  const double diff = d.numel() == 0 ? 0.0 : d.max().item<double>();
  if (std::getenv("EMBER_TEST_LOG_DIFFS")) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "[diff] %s.%s max|a-b| %.3e bound %.3e (%.3g of it)\n",
                 info ? info->test_suite_name() : "?", info ? info->name() : "?", diff, bound,
                 bound > 0 ? diff / bound : 0.0);
  }
  if (diff <= bound && !std::isnan(diff)) return ::testing::AssertionSuccess();
  std::ostringstream s;
  if (std::isnan(diff)) {
    s << "a NaN where the other has a number or NaN (bound " << bound << ")";
  } else {
    const int64_t at = d.argmax().item<int64_t>();
    s << "max |a - b| = " << diff << " > bound " << bound << " at flat index " << at
      << " (a = " << a.detach().flatten()[at].item<double>()
      << ", b = " << b.detach().flatten()[at].item<double>() << ")";
  }
  return ::testing::AssertionFailure() << s.str();
}

/// The scalar form: |a - b| <= bound (for values read with item<double>()).
inline ::testing::AssertionResult near(double a, double b, double bound) {
  return near(torch::tensor(a, torch::kFloat64), torch::tensor(b, torch::kFloat64), bound);
}

}  // namespace ember::test_util
