// The models' config keys: model.* and sample.*.
#include "ember/models/keys.h"

#include <string>

#include "core/check.h"

namespace ember::models {

using core::Bounds;

namespace {

core::ActivationCheckpointing activation_checkpointing_from_config(const core::Config& c);

// model.activation_checkpoint_every and model.activation_checkpoint. They
// change memory and time, not what is trained (the gradients are those
// without checkpointing), so a resumed run may change them.
void declare_activation_checkpoint_keys(core::Config& c, const core::ActivationCheckpointing& d,
                                        const char* blocks) {
  c.declare("model.activation_checkpoint_every", d.every(),
            std::string("recompute the activations of every k-th ") + blocks +
                " in backward instead of keeping them (blocks 0, k, 2k, ...; 0 = off)",
            Bounds::between(0, 1 << 16), core::OnResume::kMayChange);
  c.declare("model.activation_checkpoint", core::to_string(d.mode()),
            "what those blocks recompute: full (the whole block) or light (its norms and activations)",
            core::OnResume::kMayChange);
  // Full checkpointing restores the random generators for each recompute;
  // a CUDA generator's state cannot be read while a graph is being captured
  // (torch refuses it), so the captured step would fail. Light checkpointing
  // draws no random numbers and captures.
  c.add_check([](const core::Config& config) {
    if (!config.has("trainer.cuda_graph") || !config.get_bool("trainer.cuda_graph")) return;
    const core::ActivationCheckpointing a = activation_checkpointing_from_config(config);
    EMBER_CHECK_KIND(
        kConfig, a.every() == 0 || a.mode() != core::CheckpointMode::kFull,
        "[models] model.activation_checkpoint=full (every {} blocks) with trainer.cuda_graph=true: full "
        "checkpointing restores the CUDA random generators' states before each recompute, and torch cannot "
        "read them while a CUDA graph is being captured; use model.activation_checkpoint=light (recomputes "
        "norms and activations only, captures), model.activation_checkpoint_every=0, or "
        "trainer.cuda_graph=false",
        a.every());
  });
}

core::ActivationCheckpointing activation_checkpointing_from_config(const core::Config& c) {
  return core::ActivationCheckpointing()
      .every(c.get_int("model.activation_checkpoint_every"))
      .mode(c.get_parsed("model.activation_checkpoint", core::parse_checkpoint_mode));
}

}  // namespace

void declare_cifar_resnet_keys(core::Config& c, const CifarResNetOptions& d) {
  c.declare("model.width", d.width(), "channels of the first stage (the others have 2x and 4x)",
            Bounds::between(1, 1 << 12));
  c.declare("model.blocks", d.blocks(),
            "basic blocks per stage (3 = ResNet-20, 5 = ResNet-32, 9 = ResNet-56)", Bounds::between(1, 64));
  declare_activation_checkpoint_keys(c, d.activation_checkpointing(), "residual block");
  c.add_check(
      [](const core::Config& config) { cifar_resnet_options_from_config(config); });  // the mode's name
}

CifarResNetOptions cifar_resnet_options_from_config(const core::Config& c) {
  return CifarResNetOptions()
      .width(c.get_int("model.width"))
      .blocks(c.get_int("model.blocks"))
      .activation_checkpointing(activation_checkpointing_from_config(c));
}

void declare_fashion_net_keys(core::Config& c, const FashionNetOptions& d) {
  c.declare("model.width", d.width(), "channels of the first conv block (the second has 2x)",
            Bounds::between(1, 1 << 12));
  c.declare("model.hidden", d.hidden(), "units of the hidden linear layer", Bounds::between(1, 1 << 16));
  c.declare("model.dropout", d.dropout(), "dropout before each linear layer", Bounds::from_below(0, 1));
}

FashionNetOptions fashion_net_options_from_config(const core::Config& c) {
  return FashionNetOptions()
      .width(c.get_int("model.width"))
      .hidden(c.get_int("model.hidden"))
      .dropout(c.get_float("model.dropout"));
}

void declare_char_gpt_keys(core::Config& c, const CharGptOptions& d) {
  c.declare("model.n_layer", d.n_layer(), "transformer blocks", Bounds::between(1, 256));
  c.declare("model.n_head", d.n_head(), "attention heads (must divide n_embd)", Bounds::between(1, 256));
  c.declare("model.n_embd", d.n_embd(), "width of the residual stream", Bounds::between(1, 1 << 15));
  c.declare("model.dropout", d.dropout(), "dropout on embeddings, attention and residual branches",
            Bounds::from_below(0, 1));
  declare_activation_checkpoint_keys(c, d.activation_checkpointing(), "transformer block");
  c.add_check([](const core::Config& config) { char_gpt_options_from_config(config); });
}

CharGptOptions char_gpt_options_from_config(const core::Config& c) {
  CharGptOptions o;
  o.n_layer(c.get_int("model.n_layer"))
      .n_head(c.get_int("model.n_head"))
      .n_embd(c.get_int("model.n_embd"))
      .dropout(c.get_float("model.dropout"))
      .activation_checkpointing(activation_checkpointing_from_config(c));
  EMBER_CHECK_KIND(kConfig, o.n_layer() >= 1 && o.n_head() >= 1 && o.n_embd() % o.n_head() == 0,
                   "[models::CharGpt] model.n_layer={} and model.n_head={} must be >= 1, and model.n_embd={} "
                   "a multiple of n_head",
                   o.n_layer(), o.n_head(), o.n_embd());
  return o;
}

void declare_sample_keys(core::Config& c, const SampleOptions& d) {
  // The text sample after training: a resumed run may change it.
  constexpr auto kMayChange = core::OnResume::kMayChange;
  c.declare("sample.length", d.length(), "bytes generated after training (0 = no sample)",
            Bounds::between(0, 1 << 20), kMayChange);
  c.declare("sample.temperature", d.temperature(), "sampling temperature (0 = greedy)",
            Bounds::between(0, 100), kMayChange);
  c.declare("sample.top_k", d.top_k(), "sample among the k most likely bytes (0 = all)",
            Bounds::between(0, 256), kMayChange);
}

SampleOptions sample_options_from_config(const core::Config& c) {
  return SampleOptions()
      .length(c.get_int("sample.length"))
      .temperature(c.get_float("sample.temperature"))
      .top_k(c.get_int("sample.top_k"));
}

}  // namespace ember::models
