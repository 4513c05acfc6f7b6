#include "ember/recipe/host_malloc.h"

#include <climits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ember::recipe {

bool tune_host_malloc(std::size_t mmap_threshold) {
#if defined(__GLIBC__)
  // mallopt rejects an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on
  // 64-bit glibc): clamp to it. Setting either value also turns glibc's
  // dynamic threshold off; the trim threshold alone would pin the mmap
  // threshold at 128 KiB, which is slower still (70 ms per step above).
  const std::size_t cap = std::size_t{32} << 20;
  const int threshold = static_cast<int>(mmap_threshold < cap ? mmap_threshold : cap);
  const bool ok = mallopt(M_MMAP_THRESHOLD, threshold) == 1;
  return mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1 && ok;
#else
  (void)mmap_threshold;
  return false;
#endif
}

}  // namespace ember::recipe
