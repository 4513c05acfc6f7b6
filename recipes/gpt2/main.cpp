// gpt2: GPT-2 (models::Gpt2, Hugging Face's GPT2LMHeadModel) trained on llm.c
// token files (data.tokens: nanoGPT's and llm.c's own data preparation write
// them, as does `tools/ember shards tokenize`), from scratch or from Hugging
// Face weights (model.pretrained), and written back at the end as a folder
// that GPT2LMHeadModel.from_pretrained loads (model.safetensors and
// config.json, with any heads removed listed as pruned_heads). Reports
// validation loss, tokens/s and MFU. gpu.toml is llm.c's GPT-2 124M
// reproduction. See README.md.
#include <ember/ember.h>
#include <fmt/format.h>

#include <iostream>

#include "default_config.h"

namespace {

using namespace ember;

// The model the model.* keys describe: a preset of Hugging Face's sizes, or
// model.n_layer/n_head/n_embd with model.preset="".
models::Gpt2Options gpt2_options(const core::Config& c, int64_t vocab, int64_t block) {
  const std::string preset = c.get_string("model.preset");
  models::Gpt2Options o;
  if (!preset.empty()) {
    try {
      o = models::Gpt2Options::preset(preset);
    } catch (const Error& e) {
      throw Error(ErrorKind::kConfig,
                  std::string("model.preset: ") + e.what() + " (or \"\" for model.n_layer...)");
    }
  } else {
    o.n_layer(c.get_int("model.n_layer")).n_head(c.get_int("model.n_head")).n_embd(c.get_int("model.n_embd"));
    if (o.n_embd() % o.n_head() != 0)
      throw Error(ErrorKind::kConfig, fmt::format("model.n_embd={} must be a multiple of model.n_head={}",
                                                  o.n_embd(), o.n_head()));
  }
  if (block > c.get_int("model.n_positions"))
    throw Error(
        ErrorKind::kConfig,
        fmt::format("data.block_size={} exceeds model.n_positions={}: the position table has a row per "
                    "token of a context (GPT-2's files have 1024)",
                    block, c.get_int("model.n_positions")));
  return o.vocab_size(vocab)
      .n_positions(c.get_int("model.n_positions"))
      .dropout(c.get_float("model.dropout"))
      .activation_checkpointing(
          core::ActivationCheckpointing()
              .every(c.get_int("model.activation_checkpoint_every"))
              .mode(core::parse_checkpoint_mode(c.get_string("model.activation_checkpoint"))));
}

// dist.microbatches, or 2 x dist.pipeline.
int64_t microbatches(const core::Config& c) {
  const int64_t m = c.get_int("dist.microbatches");
  return m > 0 ? m : 2 * c.get_int("dist.pipeline");
}

class Gpt2Task : public train::Task {
 public:
  Gpt2Task(const core::Config& c, const recipe::RunContext& ctx) : block_(c.get_int("data.block_size")) {
    recipe::TokenData d = recipe::token_data_from_config(c, ctx, block_);
    net_ = models::Gpt2(gpt2_options(c, d.vocab_size, block_));
    if (const std::string path = c.get_string("model.pretrained"); !path.empty()) {
      const train::LoadReport r =
          train::load_pretrained(*net_, path, train::PretrainedOptions().map(models::Gpt2Impl::hf_map()));
      if (!ctx.group() || ctx.group()->rank() == 0)  // the writer
        std::cerr << fmt::format("[gpt2] model.pretrained: {} tensors from {} file(s) of {}\n",
                                 r.loaded.size(), r.files.size(), path);
    }
    net_->to(ctx.device());
    // dist.tensor > 1: cut over the layout's tensor group when fit starts
    // (dist::ModelParallelTraining, added by add_callbacks); dist.pipeline >
    // 1: the other stages released then. Whole
    // before and after fit. Dropout masks keyed per replica.
    const uint64_t dropout_seed = ctx.seed() * 0x100000001b3ULL + static_cast<uint64_t>(ctx.rank());
    if (const auto& layout = ctx.layout(); layout && layout->degrees.tensor > 1)
      tp_ = std::make_shared<dist::Gpt2TensorParallel>(
          net_, layout->tensor,
          dist::TensorParallelOptions()
              .cut(false)
              .sequence_parallel(c.get_bool("dist.sequence_parallel"))
              .dropout_seed(dropout_seed));
    if (const auto& layout = ctx.layout(); layout && layout->degrees.pipeline > 1) {
      dist::PipelineOptions o(dist::parse_pipeline_schedule(c.get_string("dist.schedule")), microbatches(c));
      o.release_other_stages(false).tied_gradients_in_step(false).checkpoint_pieces(
          c.get_int("model.activation_checkpoint_every") > 0);
      if (c.get_float("model.dropout") > 0) o.dropout_seed(dropout_seed);
      pipe_ = std::make_shared<dist::PipelineRunner>(layout->pipeline, net_->pipeline_pieces(block_), o);
    }
    train_ = std::move(d.train);
    val_ = std::move(d.val);
    if (!ctx.group() || ctx.group()->rank() == 0)  // the writer
      std::cerr << fmt::format(
          "gpt2: {} token files ({} train windows of {}+1 tokens, {} validation), vocabulary {}\n",
          d.train_files, train_->num_samples(), block_, val_ ? val_->num_samples() : 0, d.vocab_size);
  }

  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  int64_t tokens_per_sample() const override { return block_; }
  /// This rank's share: a tensor-parallel rank computes 1/T of each
  /// sample's work, a stage about 1/P (MFU per GPU).
  double train_flops_per_sample() const override {
    const double parts = tp_     ? static_cast<double>(tp_->group()->size())
                         : pipe_ ? static_cast<double>(pipe_->plan().ranks)
                                 : 1.0;
    return static_cast<double>(net_->flops_per_token(block_)) * static_cast<double>(block_) / parts;
  }
  /// dist.pipeline > 1, while the stages are cut: the forwards and backwards
  /// of the batch's microbatches interleave across ranks in the schedule.
  bool backward_in_step() const override { return pipe_ && pipe_->is_cut(); }
  train::StepOutput training_backward_step(const data::Batch& b, const torch::Tensor& scale) override {
    train::StepOutput out;
    out.loss = pipe_->step(recipe::window_inputs(b.input, block_), targets(b.input), token_loss, scale)
                   .to(scale.device(), torch::kFloat32);
    return out;
  }
  train::StepOutput evaluation_step(const data::Batch& b) override {
    if (!pipe_ || !pipe_->is_cut()) return training_step(b);
    train::StepOutput out;
    out.loss = pipe_->evaluate(recipe::window_inputs(b.input, block_), targets(b.input), token_loss)
                   .to(torch::kFloat32);
    return out;
  }
  /// batch.input: int32 [B, T+1]; predicts tokens 1..T from 0..T-1.
  train::StepOutput training_step(const data::Batch& b) override {
    train::StepOutput out;  // loss only
    const torch::Tensor x = recipe::window_inputs(b.input, block_);
    if (tp_ && tp_->is_cut())  // the same batch on every rank of the tensor group
      out.loss = tp_->loss(x, targets(b.input));
    else
      out.loss = recipe::next_token_loss(net_->forward(x), b.input, block_);
    return out;
  }
  data::Loader& train_loader() override { return *train_; }
  data::Loader* val_loader() override { return val_.get(); }

  models::Gpt2& net() { return net_; }
  int64_t block_size() const { return block_; }
  const std::shared_ptr<dist::Gpt2TensorParallel>& tensor_parallel() const { return tp_; }
  const std::shared_ptr<dist::PipelineRunner>& pipeline() const { return pipe_; }

 private:
  torch::Tensor targets(const torch::Tensor& windows) const {
    return windows.narrow(1, 1, block_).to(torch::kLong);
  }
  static torch::Tensor token_loss(const torch::Tensor& logits, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape(-1));
  }

  int64_t block_;
  models::Gpt2 net_{nullptr};
  std::shared_ptr<dist::Gpt2TensorParallel> tp_;
  std::shared_ptr<dist::PipelineRunner> pipe_;
  std::unique_ptr<data::Loader> train_, val_;
};

// After training: tokens/s, MFU, and the folder from_pretrained loads.
void finish(train::Task& task, const core::Config& c, const recipe::RunContext& ctx, const train::FitResult&,
            recipe::RunSummary& summary) {
  auto& t = dynamic_cast<Gpt2Task&>(task);
  summary.extra["flops_per_token"] = static_cast<double>(t.net()->flops_per_token(t.block_size()));
  summary.extra["tokens_per_second"] = summary.samples_per_second * static_cast<double>(t.block_size());
  if (const auto mfu = summary.monitor.find("mfu"); mfu != summary.monitor.end())
    summary.extra["mfu"] = mfu->second;
  if (!c.get_bool("model.export") || ctx.run_dir().empty()) return;
  const std::string dir = ctx.run_dir() + "/hf";
  core::make_dirs(dir);
  train::save_pretrained(dir + "/model.safetensors", *t.net(), models::Gpt2Impl::hf_export_map());
  core::write_file_atomic(dir + "/config.json", t.net()->hf_config_json());
  std::cerr << fmt::format("[gpt2] wrote {} (GPT2LMHeadModel.from_pretrained loads it)\n", dir);
}

}  // namespace

int main(int argc, char** argv) {
  recipe::RecipeSpec spec;
  spec.name = "gpt2";
  spec.default_config = kDefaultConfig;
  spec.declare = [](core::Config& c) {
    recipe::declare_token_keys(c);
    c.declare("data.block_size", 1024, "context length in tokens (T)", core::Bounds::between(1, 1 << 16));
    c.declare("data.batch_size", 8, "training windows per batch", core::Bounds::between(1, 1 << 20));
    c.declare("data.eval_batch_size", 8, "validation windows per batch", core::Bounds::between(1, 1 << 20),
              core::OnResume::kMayChange);
    c.declare("model.preset", "gpt2",
              "gpt2 (124M) | gpt2-medium | gpt2-large | gpt2-xl, or \"\" for model.n_layer, n_head, n_embd");
    c.declare("model.n_layer", 12, "transformer blocks (model.preset=\"\")", core::Bounds::between(1, 1024));
    c.declare("model.n_head", 12, "attention heads (model.preset=\"\")", core::Bounds::between(1, 1024));
    c.declare("model.n_embd", 768, "width of the residual stream (model.preset=\"\")",
              core::Bounds::between(1, 1 << 16));
    c.declare("model.n_positions", 1024, "rows of the position table (at least data.block_size)",
              core::Bounds::between(1, 1 << 20));
    c.declare("model.dropout", 0.0, "dropout on embeddings, attention and residual branches",
              core::Bounds::between(0, 1));
    c.declare("model.activation_checkpoint_every", 0,
              "recompute every k-th block's activations in backward (0 = off)",
              core::Bounds::between(0, 1 << 20));
    c.declare("model.activation_checkpoint", "full", "full | light");
    c.declare(
        "model.pretrained", "",
        "Hugging Face GPT-2 weights to start from: a model.safetensors, a sharded checkpoint's index, or "
        "save_pretrained's folder (\"\": initialised as transformers does; a resumed run takes its "
        "checkpoint's weights)",
        core::OnResume::kMayChange);
    c.declare("model.export", true,
              "write <run.dir>/hf: model.safetensors and config.json for from_pretrained",
              core::OnResume::kMayChange);
  };
  spec.check = [](const core::Config& c, int64_t) {
    if (c.get_string("data.tokens").empty())
      throw Error(
          ErrorKind::kConfig,
          "[gpt2] data.tokens names no token files: tokenize a text first (tools/ember shards tokenize, or "
          "llm.c's and nanoGPT's data preparation) and pass data.tokens=DIR/train-{000000..N}.bin");
    const models::Gpt2Options o = gpt2_options(c, 50257, c.get_int("data.block_size"));  // before any work
    if (const int64_t tensor = c.get_int("dist.tensor"); tensor > 1) {
      if (o.activation_checkpointing().every() > 0)
        throw Error(
            ErrorKind::kConfig,
            "[gpt2] dist.tensor with model.activation_checkpoint_every > 0: activation checkpointing "
            "inside tensor-parallel blocks is not supported yet; set model.activation_checkpoint_every=0");
      if (o.n_head() < tensor)
        throw Error(ErrorKind::kConfig, fmt::format("[gpt2] dist.tensor={} needs at least as many heads, the "
                                                    "model has {}: lower dist.tensor",
                                                    tensor, o.n_head()));
      if (c.get_bool("dist.sequence_parallel") && c.get_int("data.block_size") % tensor != 0)
        throw Error(ErrorKind::kConfig,
                    fmt::format("[gpt2] dist.sequence_parallel=true cuts each window's {} tokens over "
                                "dist.tensor={} ranks: choose a data.block_size it divides",
                                c.get_int("data.block_size"), tensor));
    }
    if (c.get_int("dist.pipeline") > 1) {
      const int64_t every = o.activation_checkpointing().every();
      if (every > 1 || (every == 1 && o.activation_checkpointing().mode() != core::CheckpointMode::kFull))
        throw Error(ErrorKind::kConfig,
                    "[gpt2] dist.pipeline checkpoints every piece of a stage in full, or none: set "
                    "model.activation_checkpoint_every=1 (model.activation_checkpoint=full) or 0");
      if (c.get_int("data.batch_size") < microbatches(c))
        throw Error(
            ErrorKind::kConfig,
            fmt::format("[gpt2] dist.pipeline splits each batch into {} microbatches (dist.microbatches): "
                        "data.batch_size={} leaves some empty; give at least as many samples (a multiple "
                        "of them: equal microbatches)",
                        microbatches(c), c.get_int("data.batch_size")));
    }
    core::parse_checkpoint_mode(c.get_string("model.activation_checkpoint"));
  };
  spec.make_task = [](const core::Config& c, const recipe::RunContext& ctx) {
    return std::make_unique<Gpt2Task>(c, ctx);
  };
  spec.tensor_parallel = true;
  spec.pipeline_parallel = true;
  spec.add_callbacks = [](train::Trainer& trainer, train::Task& task, const core::Config&,
                          const recipe::RunContext& ctx) {
    auto& t = dynamic_cast<Gpt2Task&>(task);
    std::shared_ptr<dist::PartitionedModel> parts = t.tensor_parallel();
    if (!parts) parts = t.pipeline();
    if (parts) trainer.add_callback(std::make_shared<dist::ModelParallelTraining>(parts, ctx.layout()));
  };
  spec.finish = finish;
  return recipe::run_recipe(argc, argv, spec);
}
