#pragma once
// Private: the seed of one dropout site's generator, keyed so that a mask is
// the same whatever the layout (pipeline.cpp: step, microbatch, piece;
// gpt2_tensor_parallel.cpp: forward call, site).
#include <cstdint>

#include "data/splitmix.h"

namespace ember::dist::detail {

/// (seed, a, b, c) mixed by SplitMix64's finaliser, one round per part.
inline uint64_t dropout_key(uint64_t seed, uint64_t a, uint64_t b, uint64_t c = 0) {
  using data::detail::mix64;
  return mix64(mix64(mix64(mix64(seed ^ 0x64726f706f7574ULL) + a) + b) + c);
}

}  // namespace ember::dist::detail
