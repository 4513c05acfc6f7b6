#include <ember/core/config.h>
#include <ember/core/error.h>
#include <gtest/gtest.h>

using ember::core::Config;

namespace {
Config make() {
  Config c;
  c.declare("trainer.epochs", 10, "epochs");
  c.declare("optim.lr", 0.1, "rate");
  c.declare("optim.name", "sgd", "name");
  c.declare("trainer.progress", true, "progress");
  c.declare("data.mean", std::vector<double>{0.5, 0.25}, "mean");
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ember::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, DefaultsFileAndOverridesInPrecedenceOrder) {
  Config c = make();
  EXPECT_EQ(c.get_int("trainer.epochs"), 10);
  c.merge_toml("[trainer]\nepochs = 3\n[optim]\nlr = 1   # an int where a float is declared is fine\n",
               "file.toml");
  EXPECT_EQ(c.get_int("trainer.epochs"), 3);
  EXPECT_DOUBLE_EQ(c.get_float("optim.lr"), 1.0);
  c.set_override("trainer.epochs=7");
  c.set_override("optim.name=adamw");
  c.set_override("trainer.progress=false");
  c.set_override("data.mean=[0.1, 0.2, 0.3]");
  EXPECT_EQ(c.get_int("trainer.epochs"), 7);
  EXPECT_EQ(c.get_string("optim.name"), "adamw");
  EXPECT_FALSE(c.get_bool("trainer.progress"));
  EXPECT_EQ(c.get_float_list("data.mean"), (std::vector<double>{0.1, 0.2, 0.3}));
}

TEST(Config, UnknownKeySuggestsNearest) {
  Config c = make();
  const std::string e1 = error_of([&] { c.set_override("trainer.epoch=3"); });
  EXPECT_NE(e1.find("unknown key 'trainer.epoch'"), std::string::npos) << e1;
  EXPECT_NE(e1.find("did you mean 'trainer.epochs'"), std::string::npos) << e1;
  // The right leaf in the wrong table.
  const std::string e2 = error_of([&] { c.merge_toml("[optim]\nepochs = 3\n", "x.toml"); });
  EXPECT_NE(e2.find("x.toml"), std::string::npos) << e2;
  EXPECT_NE(e2.find("did you mean 'trainer.epochs'"), std::string::npos) << e2;
  // Nothing close: no suggestion.
  const std::string e3 = error_of([&] { c.set_override("completely.unrelated=1"); });
  EXPECT_EQ(e3.find("did you mean"), std::string::npos) << e3;
}

TEST(Config, BadValuesNameTheKey) {
  Config c = make();
  EXPECT_NE(
      error_of([&] { c.set_override("trainer.epochs=3.5"); }).find("trainer.epochs=3.5: expected an integer"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] { c.set_override("optim.lr=fast"); }).find("optim.lr=fast: expected a finite number"),
      std::string::npos);
  EXPECT_NE(error_of([&] { c.set_override("optim.lr=nan"); }).find("finite"), std::string::npos);
  EXPECT_NE(error_of([&] { c.set_override("trainer.progress=maybe"); }).find("true or false"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.set_override("noequals"); }).find("key=value"), std::string::npos);
  EXPECT_NE(error_of([&] {
              c.merge_toml("[trainer]\nepochs = \"ten\"\n", "f.toml");
            }).find("trainer.epochs must be of type int"),
            std::string::npos);
  const std::string syntax = error_of([&] { c.merge_toml("[trainer\nepochs = 3\n", "broken.toml"); });
  EXPECT_NE(syntax.find("broken.toml:1:"), std::string::npos) << syntax;
  // A failed override leaves the old value.
  EXPECT_EQ(c.get_int("trainer.epochs"), 10);
}

TEST(Config, ResolvedTomlRoundTripsAndHashes) {
  Config a = make();
  a.set_override("optim.lr=0.025");
  a.set_override("optim.name=a \"quoted\" name");
  Config b = make();
  b.merge_toml(a.to_toml(), "resolved");
  EXPECT_EQ(a.to_toml(), b.to_toml());
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_EQ(b.get_string("optim.name"), "a \"quoted\" name");
  b.set_override("trainer.epochs=11");
  EXPECT_NE(a.hash(), b.hash());
}

TEST(Config, HelpListsEveryKeyWithDefault) {
  Config c = make();
  const std::string h = c.help();
  for (const auto& k : c.keys()) EXPECT_NE(h.find(k + "="), std::string::npos) << k;
  EXPECT_NE(h.find("trainer.epochs=10"), std::string::npos);
}

TEST(Config, MissingFileIsAClearError) {
  Config c = make();
  EXPECT_NE(error_of([&] { c.merge_toml_file("/nonexistent/x.toml"); }).find("cannot open config file"),
            std::string::npos);
}

#include <ember/recipe/host_malloc.h>

TEST(HostMalloc, TuningIsAcceptedByGlibc) {
#if defined(__GLIBC__)
  EXPECT_TRUE(ember::recipe::tune_host_malloc());
  EXPECT_TRUE(ember::recipe::tune_host_malloc(std::size_t{1} << 40))
      << "above glibc's maximum: clamped, not rejected";
  std::vector<float> big(std::size_t{8} << 20);  // 32 MiB: still served and usable
  big.back() = 1.0f;
  EXPECT_EQ(big.back(), 1.0f);
#else
  GTEST_SKIP() << "not glibc";
#endif
}
