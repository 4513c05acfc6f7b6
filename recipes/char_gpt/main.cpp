// char_gpt: a small GPT trained on bytes (vocabulary 256), by default on the
// text of Debian's fortunes package. Reports validation bits per byte,
// tokens/s and model FLOPs utilisation, and prints a generated sample.
// See README.md for the command and expected output.
#include <ember/ember.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>
#include <iostream>

#include "default_config.h"

namespace {

using namespace ember;
using models::CharGpt;
using models::CharGptOptions;
using models::SampleOptions;

class CharGptTask : public train::Task {
 public:
  CharGptTask(const core::Config& c, const recipe::RunContext& ctx) : block_(c.get_int("data.block_size")) {
    if (!c.get_string("data.tokens").empty()) {
      from_tokens(c, ctx);
      return;
    }
    // (the keys' bounds hold: block_size >= 1, stride >= 0, val_fraction in [0, 1))
    const std::string path = c.get_string("data.path");
    const int64_t stride = c.get_int("data.stride") == 0 ? block_ : c.get_int("data.stride");
    const double val_fraction = c.get_float("data.val_fraction");
    const torch::Tensor bytes = data::read_text_corpus(path);
    const int64_t n = bytes.size(0);
    const int64_t n_val = static_cast<int64_t>(std::llround(val_fraction * static_cast<double>(n)));
    const int64_t n_train = n - n_val;
    // At least 4 training windows and, with validation, one validation window.
    const int64_t min_train = block_ + 1 + 3 * stride;
    if (n_train < min_train || (val_fraction > 0 && n_val < block_ + 1))
      throw Error(ErrorKind::kData,
                  fmt::format("[char_gpt] data.path={}: {} bytes is too short for data.block_size={} "
                              "(stride {}, val_fraction {}): need {} bytes to train on{}; use a longer text "
                              "or a smaller block_size",
                              path, n, block_, stride, val_fraction, min_train,
                              val_fraction > 0 ? fmt::format(" and {} to validate on", block_ + 1) : ""));

    net_ = CharGpt(models::char_gpt_options_from_config(c).block_size(block_));
    net_->to(ctx.device());

    auto opts = data::TensorLoaderOptions()
                    .batch_size(recipe::train_batch_size(c, ctx))
                    .seed(ctx.seed())
                    .prefetch(c.get_int("data.prefetch"))
                    .device(ctx.device())
                    .num_replicas(ctx.world_size())  // data-parallel: this rank's shard
                    .rank(ctx.rank());
    auto eval_opts = opts;  // every rank validates on all windows
    eval_opts.batch_size(c.get_int("data.eval_batch_size")).shuffle(false).num_replicas(1).rank(0);
    train_ = std::make_unique<data::TensorLoader>(
        data::text_windows(bytes.narrow(0, 0, n_train), 0, block_, stride), opts);
    // Validation windows do not overlap, so each held-out byte is predicted once.
    if (n_val > 0)
      val_ = std::make_unique<data::TensorLoader>(
          data::text_windows(bytes.narrow(0, n_train, n_val), n_train, block_, block_), eval_opts);
    std::cerr << fmt::format("char_gpt: {} bytes from {} ({} train windows of {}+1 bytes, {} validation)\n",
                             n, path, train_->num_samples(), block_, val_ ? val_->num_samples() : 0);
  }

  /// llm.c token files (data.tokens, data.val_tokens): windows of block_size + 1
  /// tokens in the sharded datasets' elastic order (recipe/tokens.h).
  void from_tokens(const core::Config& c, const recipe::RunContext& ctx) {
    recipe::TokenData d = recipe::token_data_from_config(c, ctx, block_);
    vocab_ = d.vocab_size;
    net_ = CharGpt(models::char_gpt_options_from_config(c).block_size(block_).vocab_size(vocab_));
    net_->to(ctx.device());
    train_ = std::move(d.train);
    val_ = std::move(d.val);
    std::cerr << fmt::format(
        "char_gpt: {} token files ({} train windows of {}+1 tokens, {} validation), "
        "vocabulary {}\n",
        d.train_files, train_->num_samples(), block_, val_ ? val_->num_samples() : 0, vocab_);
  }

  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  int64_t tokens_per_sample() const override { return block_; }
  double train_flops_per_sample() const override {
    return static_cast<double>(net_->flops_per_token()) * static_cast<double>(block_);
  }
  /// batch.input: uint8 [B, T+1] (bytes) or int32 (tokens); predicts 1..T from 0..T-1.
  train::StepOutput training_step(const data::Batch& b) override {
    train::StepOutput out;  // loss only: no per-sample accuracy for a language model
    out.loss =
        recipe::next_token_loss(net_->forward(recipe::window_inputs(b.input, block_)), b.input, block_);
    return out;
  }
  data::Loader& train_loader() override { return *train_; }
  data::Loader* val_loader() override { return val_.get(); }

  CharGpt& net() { return net_; }
  int64_t block_size() const { return block_; }
  /// 256 for bytes; a token file's vocabulary otherwise.
  int64_t vocab_size() const { return vocab_; }
  bool tokens() const { return dynamic_cast<const data::TokenLoader*>(train_.get()) != nullptr; }

 private:
  int64_t block_;
  int64_t vocab_ = 256;
  CharGpt net_{nullptr};
  std::unique_ptr<data::Loader> train_, val_;
};

/// After training: validation bits per byte (the runner's val_loss is of the
/// final weights), tokens/s and the Monitor's MFU, and a text sample.
void finish(train::Task& task, const core::Config& c, const recipe::RunContext& ctx,
            const train::FitResult& fit, recipe::RunSummary& summary) {
  auto& t = dynamic_cast<CharGptTask&>(task);
  CharGpt& net = t.net();
  if (fit.last_val.samples > 0 && !t.tokens())
    summary.extra["val_bpb"] = fit.last_val.loss / std::log(2.0);  // nats per byte -> bits per byte
  summary.extra["flops_per_token"] = static_cast<double>(net->flops_per_token());
  summary.extra["tokens_per_second"] = summary.samples_per_second * static_cast<double>(t.block_size());
  // The Monitor's (training FLOPs per sample x samples/s / its peak: datasheet, measured matmul, or
  // mfu.peak_tflops; summary.json's monitor.peak_flops_source says which).
  if (const auto mfu = summary.monitor.find("mfu"); mfu != summary.monitor.end())
    summary.extra["mfu"] = mfu->second;

  const SampleOptions so = models::sample_options_from_config(c);
  const std::string prompt = c.get_string("sample.prompt");
  if (so.length() > 0 && t.vocab_size() != 256) {
    std::cout << "char_gpt: no text sample: the model's tokens are not bytes, and Ember has no tokenizer to "
                 "decode them\n";
  } else if (so.length() > 0) {
    const torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(ctx.seed());
    const std::string text = prompt + net->generate(prompt, so, gen);
    std::cout << fmt::format(
                     "--- char_gpt sample ({} bytes after the prompt, temperature {}, top_k {}) ---\n",
                     so.length(), so.temperature(), so.top_k())
              << text << (text.empty() || text.back() != '\n' ? "\n" : "") << "--- end of sample ---\n";
    train::write_file_atomic(ctx.run_dir() + "/sample.txt", text);
  }
}

}  // namespace

int main(int argc, char** argv) {
  recipe::RecipeSpec spec;
  spec.name = "char_gpt";
  spec.default_config = kDefaultConfig;
  spec.declare = [](core::Config& c) {
    c.declare("data.path", "/usr/share/games/fortunes",
              "a text file, or a folder whose regular files without an extension are concatenated by name",
              core::OnResume::kMayChange);
    recipe::declare_token_keys(c);
    c.declare("data.block_size", CharGptOptions().block_size(), "context length in bytes (T)",
              core::Bounds::between(1, 1 << 16));
    c.declare("data.stride", 0, "bytes between the starts of training windows (0 = block_size)",
              core::Bounds::between(0, 1 << 30));
    c.declare("data.val_fraction", 0.1, "the last fraction of the text, held out for validation (0 = none)",
              core::Bounds::from_below(0, 1));
    c.declare("data.batch_size", 16, "training windows per batch", core::Bounds::between(1, 1 << 20));
    c.declare("data.eval_batch_size", 64, "validation windows per batch", core::Bounds::between(1, 1 << 20),
              core::OnResume::kMayChange);
    c.declare("data.prefetch", -1, "batches prepared ahead by the loader thread (-1: 2 on CUDA, 0 on CPU)",
              core::Bounds::between(-1, 64), core::OnResume::kMayChange);
    models::declare_char_gpt_keys(c);
    prune::declare_pruning_keys(c, prune::PruningCallbackOptions().pruner(
                                       prune::PrunerOptions().ignored_layers({"wte"}).round_to(0)));
    models::declare_sample_keys(c);
    c.declare("sample.prompt", "Q:", "text the sample starts from", core::OnResume::kMayChange);
  };
  spec.make_task = [](const core::Config& c, const recipe::RunContext& ctx) {
    return std::make_unique<CharGptTask>(c, ctx);
  };
  // Structured pruning of the MLP hidden size (prune.epochs=[...] turns it on).
  // The token embedding is ignored, which keeps the residual stream's width;
  // the channel tracer leaves attention alone (the q/k/v view splits channels),
  // prune.heads removes whole heads (CharGpt's attention is a core::HeadedAttention).
  // Always registered: without steps it still replays a checkpoint's plan on resume.
  spec.add_callbacks = [](train::Trainer& trainer, train::Task&, const core::Config& c,
                          const recipe::RunContext&) {
    trainer.add_callback(std::make_shared<prune::PruningCallback>(prune::pruning_options_from_config(c)));
  };
  spec.finish = finish;
  return recipe::run_recipe(argc, argv, spec);
}
