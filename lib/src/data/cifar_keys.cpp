// The CIFAR config key (data.variant).
#include "ember/data/cifar.h"

namespace ember::data {

void declare_cifar_keys(core::Config& c, const CifarOptions& d) {
  c.declare("data.variant", to_string(d.variant()), "cifar10 | cifar100 (fine labels)");
  c.add_check([](const core::Config& config) { cifar_options_from_config(config); });
}

CifarOptions cifar_options_from_config(const core::Config& c) {
  return CifarOptions().variant(c.get_parsed("data.variant", parse_cifar_variant));
}

}  // namespace ember::data
