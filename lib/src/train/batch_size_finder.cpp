#include "ember/train/batch_size_finder.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "ember/version.h"

#if EMBER_WITH_CUDA_KERNELS
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace ember::train {

BatchSizeResult find_batch_size(const std::function<int64_t(int64_t)>& try_batch,
                                const BatchSizeFinderOptions& o) {
  EMBER_CHECK_KIND(kConfig, o.start() >= 1, "[train::find_batch_size] start must be >= 1, got {}", o.start());
  EMBER_CHECK_KIND(kConfig, o.max_batch() >= o.start(),
                   "[train::find_batch_size] max_batch ({}) must be >= start ({})", o.max_batch(), o.start());
  EMBER_CHECK_KIND(kConfig, o.budget_bytes() > 0,
                   "[train::find_batch_size] budget_bytes must be > 0 (the memory a batch may use), got {}",
                   o.budget_bytes());
  EMBER_CHECK_KIND(kConfig, o.margin() >= 0 && o.margin() < 1,
                   "[train::find_batch_size] margin must be in [0, 1), got {}", o.margin());
  BatchSizeResult r;
  r.budget_bytes = o.budget_bytes();
  r.margin = o.margin();
  const auto fits = [&](int64_t batch) {
    BatchSizeTrial t;
    t.batch = batch;
    try {
      t.peak_bytes = try_batch(batch);
      t.fits = t.peak_bytes <= o.budget_bytes();
    } catch (const c10::OutOfMemoryError&) {
      t.fits = false;
      t.peak_bytes = -1;
    }
#if EMBER_WITH_CUDA_KERNELS
    // What the failed (or too large) size left cached would crowd the next one.
    if (!t.fits) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    r.trials.push_back(t);
    return t.fits;
  };

  // Doubling: `lo` fits, `hi` does not (0 = nothing failed yet).
  int64_t lo = 0, hi = 0;
  for (int64_t b = o.start();; b = b > o.max_batch() / 2 ? o.max_batch() : 2 * b) {
    if (!fits(b)) {
      hi = b;
      break;
    }
    lo = b;
    if (b == o.max_batch()) break;
  }
  if (lo == 0) return r;  // not even the first size
  // Bisection between the largest that fitted and the smallest that did not.
  while (hi != 0 && hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid;
  }
  r.largest = lo;

  // The line through the largest size that fitted and the largest at most half
  // of it (doubling tried one): points far apart, so that a CUDA allocator's
  // rounding does not make the slope. Sizes closer together only when nothing
  // smaller fitted.
  std::vector<BatchSizeTrial> ok;
  for (const BatchSizeTrial& t : r.trials)
    if (t.fits) ok.push_back(t);
  std::sort(ok.begin(), ok.end(), [](const auto& a, const auto& b) { return a.batch > b.batch; });
  const double usable = (1.0 - o.margin()) * static_cast<double>(o.budget_bytes());
  if (ok.size() >= 2) {
    const BatchSizeTrial& a = ok[0];
    const BatchSizeTrial* b = &ok.back();
    for (const BatchSizeTrial& t : ok)
      if (2 * t.batch <= a.batch) {
        b = &t;
        break;
      }
    r.per_sample_bytes =
        static_cast<double>(a.peak_bytes - b->peak_bytes) / static_cast<double>(a.batch - b->batch);
    r.fixed_bytes = static_cast<double>(a.peak_bytes) - r.per_sample_bytes * static_cast<double>(a.batch);
  }
  if (r.per_sample_bytes > 0) {
    const double n = std::floor((usable - r.fixed_bytes) / r.per_sample_bytes);
    r.recommended = std::clamp<int64_t>(static_cast<int64_t>(std::max(n, 0.0)), 0, r.largest);
  } else {  // one point, or memory that does not grow with the batch: a margin on the size
    r.recommended = std::max<int64_t>(
        1, static_cast<int64_t>(std::floor(static_cast<double>(r.largest) * (1.0 - o.margin()))));
  }
  if (r.recommended == 0) r.recommended = std::min<int64_t>(r.largest, 1);
  return r;
}

}  // namespace ember::train
