#pragma once
// Batch-size finder: the largest batch that fits a memory budget, by doubling
// then bisection, and a recommended batch a safety margin below it.
//
//   core::MemoryMeter meter(device);
//   train::BatchSizeResult r = train::find_batch_size(
//       [&](int64_t batch) {           // a few real training steps at `batch`
//         meter.reset_peak();
//         const int64_t before = meter.current();
//         run_steps(batch);
//         return meter.peak() - before;
//       },
//       train::BatchSizeFinderOptions().budget_bytes(8LL << 30));
//   // r.largest fits; r.recommended leaves options.margin() of the budget free
//
// A size fits when `try_batch` returns a peak within the budget. A
// c10::OutOfMemoryError from it (CUDA, or a core::MemoryMeter's limit on the
// CPU) means it does not fit: the CUDA caching allocator's cached blocks are
// released and the search goes on. Steps at each size must include the optimizer's first step (it
// allocates the optimizer state) and be more than one step: the second step
// holds the previous step's state and the new activations.
//
// Rule for the recommendation: the peaks measured at the sizes that fit are
// taken as fixed + per_sample x batch (the line through the largest that fit
// and the largest that fit at most half of it); recommended is the largest
// batch whose line stays within (1 - margin) x budget, at most `largest`, at
// least 1.

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ember::train {

struct BatchSizeFinderOptions {
  /// First size tried; doubling goes on from it.
  TORCH_ARG(int64_t, start) = 1;
  /// Largest size tried (e.g. the training set's size).
  TORCH_ARG(int64_t, max_batch) = 1 << 16;
  /// Memory a batch may use, in bytes, as `try_batch` measures it (> 0; on a GPU,
  /// e.g. the device's total memory, which the OOM check also enforces).
  TORCH_ARG(int64_t, budget_bytes) = 0;
  /// Share of the budget the recommended batch leaves free.
  TORCH_ARG(double, margin) = 0.10;
};

/// One size tried.
struct BatchSizeTrial {
  int64_t batch = 0;
  bool fits = false;
  int64_t peak_bytes = -1;  ///< -1 = it ran out of memory
};

struct BatchSizeResult {
  int64_t largest = 0;      ///< largest size that fitted (0 = not even options.start)
  int64_t recommended = 0;  ///< see the rule at the top of this file
  int64_t budget_bytes = 0;
  double margin = 0;
  double per_sample_bytes = 0;         ///< slope of the line through the sizes that fit (0 = one point)
  double fixed_bytes = 0;              ///< its value at batch 0
  std::vector<BatchSizeTrial> trials;  ///< in the order tried
};

/// Runs the search. `try_batch(batch)` returns the peak bytes of a few
/// training steps at that size or throws c10::OutOfMemoryError. Bad options
/// are config errors; any other exception from `try_batch` propagates.
BatchSizeResult find_batch_size(const std::function<int64_t(int64_t batch)>& try_batch,
                                const BatchSizeFinderOptions& options);

}  // namespace ember::train
