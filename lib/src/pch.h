// Precompiled header for Ember's own targets: LibTorch's front end is ~25 s
// of parsing per file without it.
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>
