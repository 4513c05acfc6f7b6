#pragma once
// Philox4x32-10: the counter-based random number generator of Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3" (SC'11), as in Random123 and
// cuRAND. A pure function of (counter, key): the same numbers on the CPU and
// in a CUDA kernel, in any order, on any number of threads. Augmentation keys
// it on (seed) and counts on (sample index, epoch, draw block), so a sample's
// random parameters do not depend on batch size, batch split, device or
// thread count.
//
// Header-only and usable from .cu files (no LibTorch types).

#include <cstdint>

#include "ember/core/host_device.h"

namespace ember::augment {

struct Philox4x32 {
  uint32_t v[4];
};

/// Ten rounds of Philox4x32 on `counter` with the 64-bit key (key0, key1).
EMBER_HOST_DEVICE Philox4x32 philox4x32_10(Philox4x32 counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  Philox4x32 c = counter;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c.v[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = Philox4x32{{hi1 ^ c.v[1] ^ key0, lo1, hi0 ^ c.v[3] ^ key1, lo0}};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return c;
}

/// A uint32 to a float in [0, 1): the top 24 bits, so every value is exact in fp32.
EMBER_HOST_DEVICE float uniform01(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

/// Four uniforms in [0, 1) for draw block `block` of sample `sample` in `epoch`
/// under `seed`. Distinct (sample, epoch, block) give independent streams.
EMBER_HOST_DEVICE void sample_uniforms(uint64_t seed, uint64_t sample, uint32_t epoch, uint32_t block,
                                       float out[4]) {
  const Philox4x32 r = philox4x32_10(
      Philox4x32{{static_cast<uint32_t>(sample), static_cast<uint32_t>(sample >> 32), epoch, block}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  for (int i = 0; i < 4; ++i) out[i] = uniform01(r.v[i]);
}

}  // namespace ember::augment
