#pragma once
// Private: the counter-keyed SplitMix64 stream and Fisher-Yates shuffle the
// sharded dataset's order (shard_order.cpp) and the shard writer's plan
// (shard_writer.cpp) draw from: the same numbers on every machine.
#include <cstdint>
#include <utility>

namespace ember::data::detail {

// 128-bit integers (a GCC and clang extension; __extension__ keeps -Wpedantic quiet).
__extension__ typedef unsigned __int128 Uint128;
__extension__ typedef __int128 Int128;

/// SplitMix64's finaliser: a bijective mix of 64 bits.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// A SplitMix64 stream keyed on (seed, epoch, what, which): the same numbers
/// on every machine and in every process.
class Rng {
 public:
  Rng(uint64_t seed, int64_t epoch, uint64_t what, uint64_t which)
      : state_(mix64(mix64(mix64(seed ^ 0x656d626572ULL) + static_cast<uint64_t>(epoch)) + what) + which) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix64(state_);
  }
  /// Uniform in [0, n), n >= 1, without modulo bias (Lemire's method).
  uint64_t below(uint64_t n) {
    Uint128 m = static_cast<Uint128>(next()) * n;
    auto low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<Uint128>(next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  uint64_t state_;
};

template <typename T>
void shuffle(T* first, int64_t n, Rng& rng) {
  for (int64_t i = n - 1; i > 0; --i) std::swap(first[i], first[rng.below(static_cast<uint64_t>(i) + 1)]);
}

}  // namespace ember::data::detail
