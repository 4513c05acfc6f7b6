// RunContext: what the runner decided, read by the recipe's hooks.
#include "ember/recipe/run_context.h"

namespace ember::recipe {

int64_t train_batch_size(const core::Config& config, const RunContext& context) {
  return context.batch_size() ? *context.batch_size() : config.get_int("data.batch_size");
}

}  // namespace ember::recipe
