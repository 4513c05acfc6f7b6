// One rank of the multi-process DDP tests (tests/dist/ddp_test.py starts
// them with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set, as torchrun does).
//
//   ember_ddp_worker --out FILE [--batch B] [--epochs E] [--accumulate K]
//                    [--precision P] [--inject-inf-step S] [--die-at-step S]
//                    [--hang-at-step S] [--timeout-s T] [--config-tag X]
//                    [--device D] [--backend B] [--force-group 1]
//                    [--unused-param 1] [--find-unused 1] [--batchnorm 1]
//                    [--sharding S] [--model blob|blocks] [--optimizer sgd|adamw]
//                    [--clip C] [--odd 1] [--samples N] [--run-dir D] [--resume 1]
//                    [--checkpoint-every K] [--check-collectives 1]
//                    [--dtype float32|float64]
//
// --sharding (dist.sharding: none, optimizer, gradients, parameters) trains
// with dist::ShardedDataParallel; --model blocks is BlockNet, a core::
// BlockModel (three residual blocks) that parameter sharding gathers per
// block; --odd 1 adds a 7-element parameter so no unit divides by the
// world size; --checkpoint-every K recomputes every K-th block's activations
// in backward (BlockNet). With --run-dir the Trainer checkpoints there at each
// epoch end (and --resume 1 continues from its last checkpoint).
// --check-collectives 1 only checks reduce-scatter and all-gather, then exits.
// --dtype float64 trains the model in double precision (parameters, inputs,
// gradients, optimizer state; fp32 precision only): the tests that check two
// different computations equal mathematically (DDP and one process, every
// sharding stage and DDP, a resume at another world size) compare them there,
// at a bound derived from float64's epsilon (tests/tolerance.py).
//
// Trains BlobNet (no dropout: ranks must draw nothing differently) on 256
// Gaussian-blob samples, each rank on its shard with batch B; a single
// process with batch B x WORLD_SIZE sees the same samples per step. Writes
// the final parameters to FILE.rank<R>.safetensors and, on rank 0, a line
// of JSON with the step counts to FILE.rank0.json.
#include <ember/core/blocks.h>
#include <ember/ember.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <thread>

#include "../train/test_task.h"

namespace {
using namespace ember;

struct Args {
  std::string out;
  int64_t batch = 16, epochs = 2, accumulate = 1, inject_inf_step = -1, die_at_step = -1, hang_at_step = -1;
  int64_t samples = 256, checkpoint_every = 0;
  double timeout_s = 60, clip = 0;
  std::string precision = "fp32", config_tag = "same", device = "cpu", backend = "auto";
  std::string sharding = "none", model = "blob", optimizer = "sgd", run_dir, dtype = "float32";
  bool unused_param = false, find_unused = false, force_group = false, batchnorm = false, odd = false,
       resume = false, check_collectives = false;
};

// The collectives sharding builds on, with values that tell the chunks and
// the reductions apart: rank r sends 100 r + i at position i. Compared
// bitwise: every value, sum and max is an integer below 2^24, exact in
// float32 whatever order Gloo adds in.
void check_collectives(dist::ProcessGroup& group) {
  const int64_t world = group.size(), rank = group.rank(), chunk = 5;
  const torch::TensorOptions on = torch::TensorOptions().dtype(torch::kFloat32).device(group.device());
  const torch::Tensor position = torch::arange(world * chunk, on);
  const torch::Tensor mine = position + 100.0 * static_cast<double>(rank);
  double rank_sum = 0;
  for (int64_t r = 0; r < world; ++r) rank_sum += 100.0 * static_cast<double>(r);
  const torch::Tensor my_positions = position.narrow(0, rank * chunk, chunk);
  const std::vector<std::pair<dist::ProcessGroup::Reduce, torch::Tensor>> expected{
      {dist::ProcessGroup::Reduce::kSum, my_positions * static_cast<double>(world) + rank_sum},
      {dist::ProcessGroup::Reduce::kMax, my_positions + 100.0 * static_cast<double>(world - 1)}};
  for (const auto& [op, want] : expected) {
    torch::Tensor in = mine.clone(), out = torch::empty({chunk}, on);
    group.start_reduce_scatter(out, in, op).wait();
    if (!torch::equal(out, want))
      throw std::runtime_error("reduce-scatter gave rank " + std::to_string(rank) + " the wrong chunk");
    if (!torch::equal(in, mine)) throw std::runtime_error("reduce-scatter changed its input");
  }
  torch::Tensor piece = torch::full({chunk}, static_cast<float>(rank), on),
                all = torch::empty({world * chunk}, on);
  group.start_all_gather(all, piece).wait();
  if (!torch::equal(all, torch::arange(world, on).repeat_interleave(chunk)))
    throw std::runtime_error("all-gather put the chunks in the wrong places");
}

// Three residual blocks run through core::BlockModel (parameter sharding
// gathers each block's parameters around it).
struct BlockNetImpl : torch::nn::Module, core::BlockModel {
  explicit BlockNetImpl(bool odd) {
    stem = register_module(
        "stem",
        torch::nn::Linear(8, 32));  // (not "in": checkpoints are TorchScript archives, where it is a keyword)
    for (int i = 0; i < 3; ++i)
      layers.push_back(register_module("block" + std::to_string(i), torch::nn::Linear(32, 32)));
    head = register_module("head", torch::nn::Linear(32, 4));
    if (odd) extra = register_parameter("odd", torch::zeros({7}));
  }
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (const auto& l : layers) out.push_back(l.ptr());
    return out;
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(stem->forward(x));
    for (size_t i = 0; i < layers.size(); ++i) {
      torch::nn::Linear& l = layers[i];
      h = run_block(
          static_cast<int64_t>(i), *l, [&](const torch::Tensor& t) { return t + torch::relu(l->forward(t)); },
          h);
    }
    torch::Tensor y = head->forward(h);
    return extra.defined() ? y + extra.narrow(0, 0, 4) * extra.narrow(0, 3, 4) + extra.narrow(0, 0, 4) : y;
  }
  torch::nn::Linear stem{nullptr}, head{nullptr};
  std::vector<torch::nn::Linear> layers;
  torch::Tensor extra;
};
TORCH_MODULE(BlockNet);

class ShardedBlobTask : public train::Task {
 public:
  ShardedBlobTask(const Args& a, const dist::LaunchEnv& env)
      : args_(a), dtype_(a.dtype == "float64" ? torch::kFloat64 : torch::kFloat32) {
    torch::manual_seed(1234 + env.rank);  // different initial weights per rank: DDP must broadcast rank 0's
    if (a.model == "blocks") {
      blocks_ = BlockNet(a.odd);
      blocks_->set_activation_checkpointing(core::ActivationCheckpointing().every(a.checkpoint_every));
      blocks_->to(torch::Device(a.device), dtype_);
    } else {
      net_ = test_util::BlobNet();
      net_->drop->options.p(0.0);
      if (a.unused_param)
        net_->register_module("unused", torch::nn::Linear(8, 8));  // never in the forward pass
      if (a.batchnorm)
        bn_ = net_->register_module("bn", torch::nn::BatchNorm1d(32));  // running stats per rank
      if (a.odd) odd_ = net_->register_parameter("odd", torch::zeros({7}));
      net_->to(torch::Device(a.device), dtype_);
    }
    auto lo = data::TensorLoaderOptions()
                  .batch_size(a.batch)
                  .seed(7)
                  .prefetch(0)
                  .num_replicas(env.world_size)
                  .rank(env.rank)
                  .device(torch::Device(a.device));
    train_ = std::make_unique<data::TensorLoader>(test_util::make_blobs(a.samples, 1), lo);
  }
  std::shared_ptr<torch::nn::Module> model() override {
    return blocks_ ? std::static_pointer_cast<torch::nn::Module>(blocks_.ptr()) : net_.ptr();
  }
  train::StepOutput training_step(const data::Batch& b) override {
    const torch::Tensor x = b.input.to(dtype_);  // (the blobs are float32)
    auto logits = blocks_ ? blocks_->forward(x)
                  : bn_   ? net_->fc2->forward(torch::relu(bn_->forward(net_->fc1->forward(x))))
                          : net_->forward(x);
    if (odd_.defined()) logits = logits + odd_.narrow(0, 0, 4) * odd_.narrow(0, 3, 4) + odd_.narrow(0, 0, 4);
    auto loss = torch::nn::functional::cross_entropy(logits, b.target);
    ++batches_;
    if (args_.inject_inf_step >= 0 && rank_inject_ && batches_ == args_.inject_inf_step * args_.accumulate)
      loss = loss * std::numeric_limits<float>::infinity();
    return {loss, logits, b.target};
  }
  data::Loader& train_loader() override { return *train_; }
  bool rank_inject_ = false;

 private:
  Args args_;
  torch::ScalarType dtype_;
  test_util::BlobNet net_{nullptr};
  BlockNet blocks_{nullptr};
  torch::nn::BatchNorm1d bn_{nullptr};
  torch::Tensor odd_;
  std::unique_ptr<data::TensorLoader> train_;
  int64_t batches_ = 0;
};

/// Makes this rank die or hang at a chosen step (failure tests).
class Saboteur : public train::Callback {
 public:
  Saboteur(int64_t die, int64_t hang) : die_(die), hang_(hang) {}
  std::string name() const override { return "saboteur"; }
  void on_step_end(train::Trainer&, const train::StepInfo& info) override {
    if (info.step == die_) {
      // Some time into the step, as a crash would be: the heartbeat has published it (within ~10 ms).
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::fprintf(stderr, "worker: dying at step %lld\n", static_cast<long long>(info.step));
      std::_Exit(9);
    }
    if (info.step == hang_) std::this_thread::sleep_for(std::chrono::minutes(10));
  }

 private:
  int64_t die_, hang_;
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--out")
      a.out = v;
    else if (k == "--batch")
      a.batch = std::stoll(v);
    else if (k == "--epochs")
      a.epochs = std::stoll(v);
    else if (k == "--accumulate")
      a.accumulate = std::stoll(v);
    else if (k == "--precision")
      a.precision = v;
    else if (k == "--inject-inf-step")
      a.inject_inf_step = std::stoll(v);
    else if (k == "--die-at-step")
      a.die_at_step = std::stoll(v);
    else if (k == "--hang-at-step")
      a.hang_at_step = std::stoll(v);
    else if (k == "--timeout-s")
      a.timeout_s = std::stod(v);
    else if (k == "--config-tag")
      a.config_tag = v;
    else if (k == "--device")
      a.device = v;
    else if (k == "--backend")
      a.backend = v;
    else if (k == "--unused-param")
      a.unused_param = v == "1";
    else if (k == "--find-unused")
      a.find_unused = v == "1";
    else if (k == "--force-group")
      a.force_group = v == "1";
    else if (k == "--batchnorm")
      a.batchnorm = v == "1";
    else if (k == "--sharding")
      a.sharding = v;
    else if (k == "--model")
      a.model = v;
    else if (k == "--optimizer")
      a.optimizer = v;
    else if (k == "--clip")
      a.clip = std::stod(v);
    else if (k == "--odd")
      a.odd = v == "1";
    else if (k == "--samples")
      a.samples = std::stoll(v);
    else if (k == "--run-dir")
      a.run_dir = v;
    else if (k == "--resume")
      a.resume = v == "1";
    else if (k == "--checkpoint-every")
      a.checkpoint_every = std::stoll(v);
    else if (k == "--check-collectives")
      a.check_collectives = v == "1";
    else if (k == "--dtype")
      a.dtype = v;
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (a.dtype != "float32" && a.dtype != "float64") {
    std::fprintf(stderr, "--dtype %s: expected float32 or float64\n", a.dtype.c_str());
    return 2;
  }
  if (a.dtype == "float64" &&
      a.precision != "fp32") {  // autocast leaves float64 alone: it would not be mixed
    std::fprintf(stderr, "--dtype float64 trains in double: --precision must be fp32, not %s\n",
                 a.precision.c_str());
    return 2;
  }
  std::shared_ptr<dist::ProcessGroup> group;
  try {
    at::set_num_threads(1);
    const dist::LaunchEnv env = dist::launch_env();
    ShardedBlobTask task(a, env);
    task.rank_inject_ = env.rank == env.world_size - 1;  // the last rank sees inf
    train::TrainerOptions o;
    o.epochs(a.epochs).accumulate_grad_batches(a.accumulate).precision(amp::parse_precision(a.precision));
    if (a.optimizer == "adamw")
      o.optimizer().kind(optim::OptimizerKind::kAdamW).lr(0.01).weight_decay(0.1);
    else
      o.optimizer().kind(optim::OptimizerKind::kSgd).lr(0.1).momentum(0.9).weight_decay(0.0);
    o.clip_grad_norm(a.clip);
    if (!a.run_dir.empty()) o.run_dir(a.run_dir).checkpoint_every(1);
    if (a.resume) o.resume(train::ResumeFrom::latest());
    if (env.distributed() ||
        a.force_group) {  // force: a group of one (NCCL on one GPU initialises and trains)
      dist::ProcessGroupOptions po;
      po.timeout(std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000)));
      po.device(torch::Device(a.device));
      po.backend(dist::parse_backend(a.backend));
      group = dist::ProcessGroup::create(env, po);
      group->check_same_everywhere("config", a.config_tag);
      if (a.check_collectives) {
        check_collectives(*group);
        return 0;
      }
      o.distribution(dist::make_distribution(group));
    }
    train::Trainer trainer(o);
    if (group) {
      trainer.add_callback(std::make_shared<Saboteur>(a.die_at_step, a.hang_at_step));
      const dist::Sharding sharding = dist::parse_sharding(a.sharding);
      if (sharding == dist::Sharding::kNone)
        trainer.add_callback(std::make_shared<dist::DistributedDataParallel>(
            group, dist::DdpOptions().find_unused_parameters(a.find_unused)));
      else
        trainer.add_callback(std::make_shared<dist::ShardedDataParallel>(
            group, dist::ShardingOptions().stage(sharding).bucket_cap_mb(0.004)));  // several units
    }
    const train::FitResult fit = trainer.fit(task);
    train::save_safetensors(a.out + ".rank" + std::to_string(env.rank) + ".safetensors", *task.model());
    if (env.rank == 0) {
      std::ofstream(a.out + ".rank0.json")
          << "{\"steps\": " << fit.steps << ", \"skipped_steps\": " << fit.skipped_steps
          << ", \"train_loss\": " << fit.last_train.loss << ", \"backend\": \""
          << (group ? dist::to_string(group->backend()) : "none") << "\"}\n";
    }
  } catch (const Error& e) {  // Ember's own errors say what is wrong already
    std::fprintf(stderr, "error: %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(1);
  } catch (const std::exception& e) {  // a collective failed: say which rank
    std::fprintf(stderr, "error: %s\n", group ? group->explain_failure(e.what()).c_str() : e.what());
    std::fflush(stderr);
    std::_Exit(1);  // do not wait in destructors for peers that are gone
  }
  return 0;
}
