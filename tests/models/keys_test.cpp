// The models' keys: each default is the options struct's (or the recipe's
// own), the options read back are the values set, a bad combination is a
// config error before any work.
#include <ember/core/error.h>
#include <ember/models/keys.h>
#include <ember/train/keys.h>
#include <gtest/gtest.h>

using namespace ember;
using namespace ember::models;

TEST(ModelKeys, DefaultsAreTheOptionsStructsAndReadBack) {
  core::Config c;
  declare_cifar_resnet_keys(c);
  EXPECT_EQ(c.get_int("model.width"), CifarResNetOptions().width());
  EXPECT_EQ(c.get_int("model.blocks"), CifarResNetOptions().blocks());
  c.set_override("model.width=8");
  c.set_override("model.blocks=5");
  const CifarResNetOptions r = cifar_resnet_options_from_config(c);
  EXPECT_EQ(r.width(), 8);
  EXPECT_EQ(r.blocks(), 5);
  EXPECT_EQ(r.num_classes(), CifarResNetOptions().num_classes()) << "the data's, set by the caller";
  // A recipe's own defaults (image_folder: width 32, 2 blocks per stage).
  core::Config own;
  declare_cifar_resnet_keys(own, CifarResNetOptions().width(32).blocks(2));
  EXPECT_EQ(cifar_resnet_options_from_config(own).width(), 32);
  EXPECT_EQ(cifar_resnet_options_from_config(own).blocks(), 2);
  EXPECT_THROW(own.set_override("model.blocks=0"), Error);

  core::Config f;
  declare_fashion_net_keys(f);
  EXPECT_EQ(f.get_int("model.width"), FashionNetOptions().width());
  EXPECT_EQ(f.get_int("model.hidden"), FashionNetOptions().hidden());
  EXPECT_EQ(f.get_float("model.dropout"), FashionNetOptions().dropout());
  f.set_override("model.hidden=64");
  f.set_override("model.dropout=0.5");
  EXPECT_EQ(fashion_net_options_from_config(f).hidden(), 64);
  EXPECT_EQ(fashion_net_options_from_config(f).dropout(), 0.5);

  core::Config s;
  declare_sample_keys(s);
  EXPECT_EQ(s.get_int("sample.length"), SampleOptions().length());
  EXPECT_EQ(s.get_float("sample.temperature"), SampleOptions().temperature());
  EXPECT_EQ(s.get_int("sample.top_k"), SampleOptions().top_k());
  s.set_override("sample.top_k=0");
  EXPECT_EQ(sample_options_from_config(s).top_k(), 0);
}

TEST(ModelKeys, CharGptKeysRefuseWidthsThatHeadsDoNotDivide) {
  core::Config c;
  declare_char_gpt_keys(c);
  const CharGptOptions d;
  EXPECT_EQ(c.get_int("model.n_layer"), d.n_layer());
  EXPECT_EQ(c.get_int("model.n_head"), d.n_head());
  EXPECT_EQ(c.get_int("model.n_embd"), d.n_embd());
  EXPECT_EQ(c.get_float("model.dropout"), d.dropout());
  c.set_override("model.n_head=2");
  c.set_override("model.n_embd=16");
  EXPECT_NO_THROW(c.validate());
  const CharGptOptions o = char_gpt_options_from_config(c);
  EXPECT_EQ(o.n_head(), 2);
  EXPECT_EQ(o.n_embd(), 16);
  EXPECT_EQ(o.block_size(), d.block_size()) << "the data's context length, set by the caller";
  c.set_override("model.n_embd=15");
  try {
    c.validate();  // before any work
    ADD_FAILURE() << "n_embd 15 with 2 heads accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("model.n_embd=15 a multiple of n_head"), std::string::npos)
        << e.what();
  }
}

// Activation checkpointing: the same two keys for both block models, their
// defaults from the options, the mode a name parsed at the config boundary,
// and both listed by --help.
TEST(ModelKeys, ActivationCheckpointKeysReadBackIntoTheOptions) {
  core::Config c;
  declare_char_gpt_keys(c);
  EXPECT_EQ(c.get_int("model.activation_checkpoint_every"),
            CharGptOptions().activation_checkpointing().every());
  EXPECT_EQ(c.get_string("model.activation_checkpoint"), "full");
  EXPECT_NE(c.help().find("model.activation_checkpoint_every"), std::string::npos);
  EXPECT_EQ(c.on_resume("model.activation_checkpoint_every"), core::OnResume::kMayChange)
      << "memory and time only: the gradients are the same";
  c.set_override("model.activation_checkpoint_every=2");
  c.set_override("model.activation_checkpoint=light");
  const core::ActivationCheckpointing a = char_gpt_options_from_config(c).activation_checkpointing();
  EXPECT_EQ(a.every(), 2);
  EXPECT_EQ(a.mode(), core::CheckpointMode::kLight);
  EXPECT_THROW(c.set_override("model.activation_checkpoint_every=-1"), Error);

  core::Config r;
  declare_cifar_resnet_keys(
      r, CifarResNetOptions().activation_checkpointing(core::ActivationCheckpointing().every(3)));
  EXPECT_EQ(cifar_resnet_options_from_config(r).activation_checkpointing().every(), 3)
      << "the recipe's default";
  r.set_override("model.activation_checkpoint=partial");
  try {
    r.validate();  // before any work
    ADD_FAILURE() << "an unknown mode accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("model.activation_checkpoint=\"partial\""), std::string::npos)
        << e.what();
  }
}

// Full checkpointing restores the CUDA generators for each recompute, which
// torch cannot read during a graph capture: with trainer.cuda_graph=true it
// is a config error before any work (the capture would fail at its first
// step, blaming an .item()); light checkpointing and checkpointing off are
// accepted.
TEST(ModelKeys, FullCheckpointingWithCudaGraphsIsRefusedBeforeAnyWork) {
  for (const bool resnet : {false, true}) {
    core::Config c;
    train::declare_trainer_keys(c);
    if (resnet)
      declare_cifar_resnet_keys(c);
    else
      declare_char_gpt_keys(c);
    c.set_override("trainer.cuda_graph=true");
    c.set_override("model.activation_checkpoint_every=0");
    EXPECT_NO_THROW(c.validate()) << "checkpointing off";
    c.set_override("model.activation_checkpoint_every=2");
    c.set_override("model.activation_checkpoint=light");
    EXPECT_NO_THROW(c.validate()) << "light draws no random numbers";
    c.set_override("model.activation_checkpoint=full");
    try {
      c.validate();
      ADD_FAILURE() << "full checkpointing with a CUDA graph accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kConfig);
      const std::string what = e.what();
      EXPECT_NE(what.find("model.activation_checkpoint=full (every 2 blocks) with trainer.cuda_graph=true"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("model.activation_checkpoint=light"), std::string::npos) << what;
    }
    c.set_override("trainer.cuda_graph=false");
    EXPECT_NO_THROW(c.validate()) << "full checkpointing eager";
  }
}
