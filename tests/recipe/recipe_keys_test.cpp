// The keys every recipe shares take their defaults from the options they fill.
#include <ember/core/config.h>
#include <ember/recipe/recipe.h>
#include <ember/train/batch_size_finder.h>
#include <ember/train/lr_finder.h>
#include <gtest/gtest.h>

using namespace ember;

TEST(RecipeKeys, FinderKeysTakeTheirDefaultsFromTheOptions) {
  core::Config c;
  recipe::declare_recipe_keys(c);
  const train::LrFinderOptions lr;
  EXPECT_EQ(c.get_float("lr_find.min_lr"), lr.min_lr());
  EXPECT_EQ(c.get_float("lr_find.max_lr"), lr.max_lr());
  EXPECT_EQ(c.get_int("lr_find.steps"), lr.steps());
  EXPECT_EQ(c.get_float("lr_find.smoothing"), lr.smoothing());
  EXPECT_EQ(c.get_float("lr_find.divergence"), lr.divergence());
  const train::BatchSizeFinderOptions bs;
  EXPECT_EQ(c.get_float("bs_find.margin"), bs.margin());
  EXPECT_EQ(c.get_int("bs_find.start"), bs.start());
  // The tool's own meaning of 0: the training set's size, the memory found free.
  EXPECT_EQ(c.get_int("bs_find.max_batch"), 0);
  EXPECT_EQ(c.get_float("bs_find.budget_gib"), 0.0);
}
