#include <ember/augment/philox.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using ember::augment::Philox4x32;
using ember::augment::philox4x32_10;

namespace {
void expect_kat(Philox4x32 ctr, uint32_t k0, uint32_t k1, Philox4x32 want) {
  const Philox4x32 got = philox4x32_10(ctr, k0, k1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], want.v[i]) << "word " << i;
}
}  // namespace

TEST(Philox, KnownAnswersOfRandom123) {
  // Random123's kat_vectors for philox4x32_10.
  expect_kat({{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  expect_kat({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu,
             {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  expect_kat({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
             {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

TEST(Philox, UniformsAreInRangeAndUniform) {
  // 4 x 50000 draws over 10 bins: chi-square with 9 degrees of freedom
  // stays below 27.9 with probability 0.999.
  std::vector<int> bins(10, 0);
  float u[4];
  for (uint64_t s = 0; s < 50000; ++s) {
    ember::augment::sample_uniforms(1234, s, 3, 0, u);
    for (float x : u) {
      ASSERT_GE(x, 0.0f);
      ASSERT_LT(x, 1.0f);
      ++bins[static_cast<int>(x * 10)];
    }
  }
  double chi2 = 0;
  for (int b : bins) chi2 += (b - 20000.0) * (b - 20000.0) / 20000.0;
  EXPECT_LT(chi2, 27.9);
}

TEST(Philox, StreamsDependOnEveryKeyPart) {
  float base[4], other[4];
  ember::augment::sample_uniforms(1, 2, 3, 4, base);
  const auto differs = [&](uint64_t seed, uint64_t sample, uint32_t epoch, uint32_t block) {
    ember::augment::sample_uniforms(seed, sample, epoch, block, other);
    return base[0] != other[0] || base[1] != other[1] || base[2] != other[2] || base[3] != other[3];
  };
  EXPECT_FALSE(differs(1, 2, 3, 4)) << "a pure function";
  EXPECT_TRUE(differs(1ull << 33, 2, 3, 4)) << "the seed's high word counts";
  EXPECT_TRUE(differs(1, 2 + (1ull << 32), 3, 4)) << "the sample's high word counts";
  EXPECT_TRUE(differs(1, 2, 4, 4));
  EXPECT_TRUE(differs(1, 2, 3, 5));
}

TEST(Philox, SampleUniformsMapTheirArgumentsAsDocumented) {
  // (seed, sample, epoch, block) are the key (seed low, seed high) and the
  // counter (sample low, sample high, epoch, block); a uniform is the top 24
  // bits over 2^24. Chosen so that key and counter are Random123's vectors
  // above: the expected floats come from its published outputs, not from
  // philox4x32_10, so a counter off by one, swapped words or another scaling fail.
  const auto expect_uniforms = [](uint64_t seed, uint64_t sample, uint32_t epoch, uint32_t block,
                                  Philox4x32 published) {
    float got[4];
    ember::augment::sample_uniforms(seed, sample, epoch, block, got);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(got[i], static_cast<float>(published.v[i] >> 8) / 16777216.0f) << "uniform " << i;
  };
  expect_uniforms(0, 0, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  expect_uniforms(~0ull, ~0ull, 0xffffffffu, 0xffffffffu,
                  {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  expect_uniforms(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x13198a2eu, 0x03707344u,
                  {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}
