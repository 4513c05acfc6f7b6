#pragma once
// The models' config keys (model.*, and sample.* of CharGpt's generate), each
// with its default taken from the model's options struct, and the options
// read back from them. A recipe declares the keys of the model it trains,
// with its own defaults where they differ; what the data decides (classes,
// input channels, context length) is set on the options afterwards:
//
//   spec.declare = [](core::Config& c) {
//     models::declare_cifar_resnet_keys(c, models::CifarResNetOptions().blocks(2));
//   };
//   ... models::CifarResNet net(models::cifar_resnet_options_from_config(c).num_classes(classes));

#include "ember/core/config.h"
#include "ember/models/char_gpt.h"
#include "ember/models/cifar_resnet.h"
#include "ember/models/fashion_net.h"

namespace ember::models {

/// model.width, model.blocks, model.activation_checkpoint_every (residual
/// blocks), model.activation_checkpoint (full or light).
void declare_cifar_resnet_keys(core::Config& config, const CifarResNetOptions& defaults = {});
/// CifarResNetOptions with width and blocks from the keys; num_classes and
/// in_channels are the struct's defaults (the caller sets them from its data).
CifarResNetOptions cifar_resnet_options_from_config(const core::Config& config);

/// model.width, model.hidden, model.dropout.
void declare_fashion_net_keys(core::Config& config, const FashionNetOptions& defaults = {});
FashionNetOptions fashion_net_options_from_config(const core::Config& config);

/// model.n_layer, model.n_head, model.n_embd, model.dropout,
/// model.activation_checkpoint_every (transformer blocks),
/// model.activation_checkpoint (full or light); registers
/// char_gpt_options_from_config with the config's checks.
void declare_char_gpt_keys(core::Config& config, const CharGptOptions& defaults = {});
/// CharGptOptions from the keys (n_embd must be a multiple of n_head: a config
/// error otherwise); vocab_size and block_size are the struct's defaults (the
/// caller sets the context length from its data).
CharGptOptions char_gpt_options_from_config(const core::Config& config);

/// sample.length, sample.temperature, sample.top_k: CharGptImpl::generate's settings.
void declare_sample_keys(core::Config& config, const SampleOptions& defaults = {});
SampleOptions sample_options_from_config(const core::Config& config);

}  // namespace ember::models
