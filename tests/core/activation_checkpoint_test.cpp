// Activation checkpointing (core::checkpoint, linear_after, conv2d_after and
// the models' per-block policy): gradients bitwise those of the model without
// checkpointing (dropout, batch norm, autocast included), hooks fired once,
// nothing kept alive by a graph that never runs backward, and the mistakes
// found in other implementations each caught by a case here.
#include <ATen/autocast_mode.h>
#include <ember/amp/autocast.h>
#include <ember/core/activation_checkpoint.h>
#include <ember/core/blocks.h>
#include <ember/core/error.h>
#include <ember/core/memory.h>
#include <ember/models/char_gpt.h>
#include <ember/models/cifar_resnet.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cuda_test.h"
#include "tolerance.h"

#if EMBER_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

using namespace ember;
using core::ActivationCheckpointing;
using core::CheckpointMode;

namespace {

/// What one training step leaves: the loss, every gradient and buffer by
/// name, and the CPU generator's state after backward.
struct Step {
  torch::Tensor loss;
  std::map<std::string, torch::Tensor> grads, buffers;
  torch::Tensor rng_after;
};

/// One forward + backward of `model` (seeded) with `policy`; grads zeroed first.
template <typename Model>
Step run_step(Model& model, const ActivationCheckpointing& policy,
              const std::function<torch::Tensor(Model&)>& loss_of, uint64_t seed = 7) {
  model->set_activation_checkpointing(policy);
  model->zero_grad();
  torch::manual_seed(seed);
  Step s;
  s.loss = loss_of(model);
  s.loss.backward();
  s.rng_after = at::detail::getDefaultCPUGenerator().get_state();
  for (const auto& p : model->named_parameters()) s.grads[p.key()] = p.value().grad().clone();
  for (const auto& b : model->named_buffers()) s.buffers[b.key()] = b.value().clone();
  return s;
}

/// Every tensor of `b` equal to `a`'s, bit for bit (same keys).
void expect_bitwise(const std::map<std::string, torch::Tensor>& a,
                    const std::map<std::string, torch::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << what << ": " << name;
    EXPECT_TRUE(torch::equal(t, b.at(name)))
        << what << ": " << name << " differs by up to "
        << (t.to(torch::kDouble) - b.at(name)).abs().max().item<double>();
  }
}

void expect_same_step(const Step& ref, const Step& got, const std::string& what) {
  EXPECT_TRUE(torch::equal(ref.loss, got.loss))
      << what << ": loss " << ref.loss.item<double>() << " vs " << got.loss.item<double>();
  expect_bitwise(ref.grads, got.grads, what + " gradients");
  expect_bitwise(ref.buffers, got.buffers, what + " buffers");
  EXPECT_TRUE(torch::equal(ref.rng_after, got.rng_after)) << what << ": the CPU generator after backward";
}

/// Every parameter moved off its initial value: GPT-2's initialisation has
/// zero biases and unit norm weights, under which different roundings of a
/// bias add (addmm's fused one against mm then +=) agree; after a step they do not.
template <typename Model>
void perturb(Model& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
}

/// 3 blocks, `width` wide, 16 tokens.
models::CharGpt small_gpt(double dropout, int64_t width = 32) {
  torch::manual_seed(0);
  models::CharGpt model(
      models::CharGptOptions().n_layer(3).n_head(4).n_embd(width).block_size(16).dropout(dropout));
  perturb(model);
  return model;
}

torch::Tensor gpt_loss(models::CharGpt& model) {
  torch::Generator gen = at::detail::createCPUGenerator(11);
  const torch::Device device = model->wte->weight.device();
  const torch::Tensor idx = torch::randint(256, {4, 16}, gen, torch::kLong).to(device);
  const torch::Tensor targets = torch::randint(256, {4, 16}, gen, torch::kLong).to(device);
  const torch::Tensor logits = model->forward(idx);
  return torch::nn::functional::cross_entropy(logits.view({-1, 256}), targets.view({-1}));
}

models::CifarResNet small_resnet() {
  torch::manual_seed(0);
  models::CifarResNet model(models::CifarResNetOptions().width(8).blocks(2));
  perturb(model);
  return model;
}

torch::Tensor resnet_loss(models::CifarResNet& model) {
  torch::Generator gen = at::detail::createCPUGenerator(13);
  const torch::Tensor x = torch::randn({6, 3, 16, 16}, gen);
  const torch::Tensor y = torch::randint(10, {6}, gen, torch::kLong);
  return torch::nn::functional::cross_entropy(model->forward(x), y);
}

ActivationCheckpointing off() {
  return ActivationCheckpointing();
}
ActivationCheckpointing full(int64_t every = 1) {
  return ActivationCheckpointing().every(every);
}
ActivationCheckpointing light(int64_t every = 1) {
  return ActivationCheckpointing().every(every).mode(CheckpointMode::kLight);
}

/// How many nodes named `name` the graph behind `t` holds.
int count_nodes(const torch::Tensor& t, const std::string& name) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  if (t.grad_fn()) todo.push_back(t.grad_fn().get());
  int n = 0;
  while (!todo.empty()) {
    torch::autograd::Node* fn = todo.back();
    todo.pop_back();
    if (!seen.insert(fn).second) continue;
    if (fn->name() == name) ++n;
    for (const auto& e : fn->next_edges())
      if (e.function) todo.push_back(e.function.get());
  }
  return n;
}

}  // namespace

// Dropout in the embeddings, attention and residual branches: the recompute
// must draw the forward's masks (RNG restored) and leave the generator where
// the run without checkpointing leaves it (the caller's state put back).
TEST(ActivationCheckpoint, CharGptFullIsBitwiseTheUncheckpointedStepWithDropout) {
  models::CharGpt model = small_gpt(0.2);
  const Step ref = run_step<models::CharGpt>(model, off(), gpt_loss);
  expect_same_step(ref, run_step<models::CharGpt>(model, full(), gpt_loss), "every block");
  expect_same_step(ref, run_step<models::CharGpt>(model, full(2), gpt_loss), "blocks 0 and 2");
}

// 128 wide: at 32, MKL happens to round addmm's fused bias add as mm then
// `+= bias` (what LibTorch's Linear does for 3-D inputs); at 128 it does not,
// and a light node that ran at::linear instead of the module's forward fails here.
TEST(ActivationCheckpoint, CharGptLightIsBitwiseTheUncheckpointedStepWithDropout) {
  models::CharGpt model = small_gpt(0.2, 128);
  const Step ref = run_step<models::CharGpt>(model, off(), gpt_loss);
  expect_same_step(ref, run_step<models::CharGpt>(model, light(), gpt_loss), "light, every block");
}

// Batch norm: the gradients, and the running statistics updated once (the
// recompute's update is undone), as without checkpointing.
TEST(ActivationCheckpoint, CifarResNetIsBitwiseAndUpdatesRunningStatisticsOnce) {
  for (const auto& [name, policy] : std::vector<std::pair<std::string, ActivationCheckpointing>>{
           {"full", full()}, {"full every 3", full(3)}, {"light", light()}}) {
    models::CifarResNet model = small_resnet();
    const Step ref = run_step<models::CifarResNet>(model, off(), resnet_loss);
    models::CifarResNet fresh = small_resnet();  // the same initial statistics as `model` had
    expect_same_step(ref, run_step<models::CifarResNet>(fresh, policy, resnet_loss), name);
    EXPECT_EQ(ref.buffers.at("stages.0.bn1.num_batches_tracked").item<int64_t>(), 1);
  }
}

// Forward under bf16 autocast, backward outside it (as the Trainer does): the
// recompute runs under the forward's autocast state, so it casts what the
// forward cast.
TEST(ActivationCheckpoint, AutocastBf16OnTheCpuGivesTheUncheckpointedGradients) {
  const std::function<torch::Tensor(models::CharGpt&)> autocast_loss = [](models::CharGpt& m) {
    amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    return gpt_loss(m);
  };
  models::CharGpt model = small_gpt(0.1);
  const Step ref = run_step<models::CharGpt>(model, off(), autocast_loss);
  ASSERT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  expect_same_step(ref, run_step<models::CharGpt>(model, full(), autocast_loss), "full under autocast");
  expect_same_step(ref, run_step<models::CharGpt>(model, light(), autocast_loss), "light under autocast");

  const std::function<torch::Tensor(models::CifarResNet&)> autocast_resnet = [](models::CifarResNet& m) {
    amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    return resnet_loss(m);
  };
  models::CifarResNet a = small_resnet(), b = small_resnet();
  expect_same_step(run_step<models::CifarResNet>(a, off(), autocast_resnet),
                   run_step<models::CifarResNet>(b, light(), autocast_resnet), "resnet light under autocast");
}

// The recompute draws the forward's random numbers: the gradient of
// sum(x * mask) is the mask the forward drew. Without the RNG restore the
// recompute draws a fresh mask and this fails.
TEST(ActivationCheckpoint, TheRecomputeDrawsTheForwardsRandomNumbers) {
  const torch::Tensor x = torch::rand({1000}).add_(1).requires_grad_();
  const torch::Tensor y =
      core::checkpoint([](const torch::Tensor& t) { return torch::dropout(t, 0.5, /*train=*/true); }, x, {});
  torch::rand({10});  // the caller draws between forward and backward
  const torch::Tensor rng_before_backward = at::detail::getDefaultCPUGenerator().get_state();
  y.sum().backward();
  const torch::Tensor forward_mask = (y.detach() != 0).to(torch::kFloat) * 2;  // kept / (1 - p)
  EXPECT_TRUE(torch::equal(x.grad(), forward_mask));
  EXPECT_TRUE(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), rng_before_backward))
      << "the caller's generator is put back after the recompute";
}

namespace {

/// Counts the calls of a grad accumulator's post hook (what c10d::Reducer registers).
struct CountingPostHook : torch::autograd::FunctionPostHook {
  explicit CountingPostHook(int* calls) : calls_(calls) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    ++*calls_;
    return outputs;
  }
  int* calls_;
};

/// A weight used by two checkpointed pieces and once outside them (as a tied embedding).
struct TiedImpl : torch::nn::Module {
  TiedImpl() {
    shared = register_module("shared", torch::nn::Linear(8, 8));
    other = register_module("other", torch::nn::Linear(8, 8));
  }
  torch::Tensor forward(const torch::Tensor& x, bool checkpointed) {
    const std::shared_ptr<torch::nn::LinearImpl> s = shared.ptr(), o = other.ptr();
    const core::TensorFn piece = [s, o](const torch::Tensor& t) {
      return torch::tanh(o->forward(s->forward(t)));
    };
    const std::vector<torch::Tensor> params{s->weight, s->bias, o->weight, o->bias};
    torch::Tensor h = checkpointed ? core::checkpoint(piece, x, params) : piece(x);
    h = checkpointed ? core::checkpoint(piece, h, params) : piece(h);
    return shared(h).pow(2).sum();
  }
  torch::nn::Linear shared{nullptr}, other{nullptr};
};
TORCH_MODULE(Tied);

}  // namespace

// Parameter gradients leave the checkpoint as outputs of its node, so each
// parameter's AccumulateGrad runs once per backward with the sum of all its
// uses: its post hook (DDP's ready signal) and its tensor hook fire once.
// An implementation that calls backward() inside backward fires them per
// checkpointed use; one that lets the inner grad() run the tensor hooks
// fires those twice.
TEST(ActivationCheckpoint, EachParametersHooksFireOncePerBackwardAlsoWhenTied) {
  torch::manual_seed(3);
  Tied model;
  model->to(torch::kFloat64);  // the gradients are compared within rounding, below
  const torch::Tensor x = torch::randn({5, 8}, torch::kFloat64);
  model->forward(x, false).backward();
  std::map<std::string, torch::Tensor> ref;
  for (const auto& p : model->named_parameters()) ref[p.key()] = p.value().grad().clone();

  model->zero_grad();
  std::map<std::string, int> post_calls, tensor_calls;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // held, as c10d::Reducer holds them
  for (const auto& p : model->named_parameters()) {
    post_calls[p.key()] = tensor_calls[p.key()] = 0;
    accumulators.push_back(torch::autograd::impl::grad_accumulator(p.value()));
    accumulators.back()->add_post_hook(std::make_unique<CountingPostHook>(&post_calls[p.key()]));
    int* calls = &tensor_calls[p.key()];
    p.value().register_hook([calls](const torch::Tensor&) { ++*calls; });
  }
  const torch::Tensor loss = model->forward(x, true);
  EXPECT_EQ(count_nodes(loss, "ember::core::CheckpointBackward"), 2);
  loss.backward();
  for (const auto& [name, n] : post_calls) EXPECT_EQ(n, 1) << name << ": grad accumulator post hook";
  for (const auto& [name, n] : tensor_calls) EXPECT_EQ(n, 1) << name << ": tensor hook";
  std::map<std::string, torch::Tensor> got;
  for (const auto& p : model->named_parameters()) got[p.key()] = p.value().grad().clone();
  // Three contributions to shared's gradient, summed by the engine in an order
  // that may differ from the uncheckpointed graph's: equal up to rounding. Each
  // contribution is the same computation (the recompute repeats the forward);
  // reordering a sum of 3 terms: 2 roundings of the terms' magnitude, allowed
  // 512 times the sum's (cancellation) in float64: ~2e-13 of the gradient.
  for (const auto& [name, g] : ref)
    EXPECT_TRUE(test_util::near(got.at(name), g,
                                test_util::rounding_bound(torch::kFloat64, 2 * 512, test_util::max_abs(g))))
        << name;
}

// The graph owns the closure (and through it the module) and the saved
// input: they live while the output may still be backpropagated and go with
// it when backward never runs (no raw pointer to a closure that is gone, no leak).
TEST(ActivationCheckpoint, NothingOutlivesAnOutputWhoseBackwardNeverRan) {
  auto linear = std::make_shared<torch::nn::LinearImpl>(4, 4);
  const std::weak_ptr<torch::nn::LinearImpl> module_alive = linear;
  auto closure_token = std::make_shared<int>(0);  // owned by the closure alone once reset below
  const std::weak_ptr<int> closure_alive = closure_token;
  torch::Tensor x = torch::randn({2, 4});
  torch::Tensor y = core::checkpoint(
      *linear, [linear, closure_token](const torch::Tensor& t) { return linear->forward(t).relu(); }, x);
  EXPECT_EQ(x.storage().use_count(), 2) << "the saved input: an alias of x's storage";
  // The caller drops everything but the output: the graph still recomputes.
  linear.reset();
  closure_token.reset();
  EXPECT_FALSE(module_alive.expired());
  EXPECT_FALSE(closure_alive.expired());

  y.reset();  // backward never ran
  EXPECT_TRUE(module_alive.expired()) << "the module outlived the graph";
  EXPECT_TRUE(closure_alive.expired()) << "the closure outlived the graph";
  EXPECT_EQ(x.storage().use_count(), 1) << "the saved input outlived the graph";
}

TEST(ActivationCheckpoint, AnInPlaceChangeOfTheSavedInputIsRefusedNamingIt) {
  torch::nn::Linear linear(4, 4);
  core::Recomputed fn = core::Recomputed::of(
      *linear, [l = linear.ptr()](const torch::Tensor& t) { return l->forward(t); }, "encoder block 7");
  torch::Tensor x = torch::randn({2, 4});
  const torch::Tensor y = core::checkpoint(std::move(fn), x);
  x.add_(1);  // after the forward, before backward
  try {
    y.sum().backward();
    ADD_FAILURE() << "a changed input was recomputed from";
  } catch (const std::exception& e) {  // the engine rethrows what the node threw
    const std::string what = e.what();
    EXPECT_NE(
        what.find("encoder block 7: its input was modified in place after the forward (version 0, now 1)"),
        std::string::npos)
        << what;
  }
}

TEST(ActivationCheckpoint, DoubleBackwardAndASecondBackwardAreRefusedWithWhatToDo) {
  torch::nn::Linear linear(3, 3);
  const torch::Tensor x = torch::randn({2, 3}, torch::requires_grad());
  const auto fn = [l = linear.ptr()](const torch::Tensor& t) { return l->forward(t).tanh(); };
  const torch::Tensor y = core::checkpoint(*linear, fn, x).sum();
  try {
    torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    ADD_FAILURE() << "create_graph through a checkpoint accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(
        std::string(e.what()).find("double backward (create_graph=true) through an activation checkpoint is "
                                   "not supported"),
        std::string::npos)
        << e.what();
  }
  y.backward();
  try {
    y.backward();
    ADD_FAILURE() << "a second backward through a released checkpoint accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("pass retain_graph=true to the first backward"), std::string::npos)
        << e.what();
  }
}

namespace {
struct CountingBlockHooks : core::BlockHooks {
  void before_block(int64_t index, torch::nn::Module&) override { before.push_back(index); }
  void after_block(int64_t index, torch::nn::Module&, const torch::Tensor& output) override {
    after.push_back(index);
    outputs_require_grad.push_back(output.requires_grad());
  }
  std::vector<int64_t> before, after;
  std::vector<bool> outputs_require_grad;
};
}  // namespace

// Checkpointing is for training: eval and no_grad run the blocks as they
// are. Every k-th block from the first is checkpointed; the BlockHooks run
// around each block's forward and not during the recompute.
TEST(ActivationCheckpoint, ThePolicyPicksBlocksZeroKTwoKOnlyWhenTrainingWithGrad) {
  models::CharGpt model = small_gpt(0.0);
  const torch::Tensor idx = torch::randint(256, {2, 16}, torch::kLong);
  const std::string node = "ember::core::CheckpointBackward";
  EXPECT_EQ(count_nodes(model->forward(idx), node), 0) << "off by default";
  model->set_activation_checkpointing(full(2));
  EXPECT_EQ(count_nodes(model->forward(idx), node), 2) << "blocks 0 and 2 of 3";
  model->set_activation_checkpointing(full(1));
  EXPECT_EQ(count_nodes(model->forward(idx), node), 3);
  model->set_activation_checkpointing(full(5));
  EXPECT_EQ(count_nodes(model->forward(idx), node), 1) << "block 0";
  model->set_activation_checkpointing(light(1));
  EXPECT_EQ(count_nodes(model->forward(idx), node), 0);
  EXPECT_EQ(count_nodes(model->forward(idx), "ember::core::LinearAfterBackward"), 9) << "3 per block";

  model->set_activation_checkpointing(full(1));
  model->eval();
  EXPECT_EQ(count_nodes(model->forward(idx), node), 0) << "eval";
  model->train();
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(model->forward(idx).requires_grad()) << "no_grad";
  }

  auto hooks = std::make_shared<CountingBlockHooks>();
  model->set_block_hooks(hooks);
  const torch::Tensor loss = model->forward(idx).sum();
  EXPECT_EQ(hooks->before, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(hooks->after, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(hooks->outputs_require_grad, (std::vector<bool>{true, true, true})) << "the checkpoint's output";
  loss.backward();
  EXPECT_EQ(hooks->before.size(), 3u) << "the recompute ran the hooks";
  EXPECT_THROW(model->set_activation_checkpointing(ActivationCheckpointing().every(-1)), c10::Error);
}

// What checkpointing is for: after the forward, less is kept for backward.
// Bytes counted by core::MemoryMeter (CPU allocations), not timed.
TEST(ActivationCheckpoint, FullKeepsLessThanLightWhichKeepsLessThanNone) {
  models::CharGpt model = small_gpt(0.0);
  const torch::Tensor idx = torch::randint(256, {4, 16}, torch::kLong);
  std::map<std::string, int64_t> kept;
  for (const auto& [name, policy] : std::vector<std::pair<std::string, ActivationCheckpointing>>{
           {"none", off()}, {"full", full()}, {"light", light()}}) {
    model->set_activation_checkpointing(policy);
    core::MemoryMeter meter(torch::kCPU);
    const torch::Tensor logits = model->forward(idx);
    kept[name] = meter.current();  // the logits and what the graph saved
  }
  EXPECT_LT(kept["full"], kept["light"]);
  EXPECT_LT(kept["light"], kept["none"]);
  // light drops ln_1's, ln_2's and the GELU's outputs: 6 d floats a token per block.
  EXPECT_GE(kept["none"] - kept["light"], 3 * (4 * 16) * (6 * 32) * 4);
}

TEST(ActivationCheckpoint, ModesParseFromTheirNames) {
  EXPECT_EQ(core::parse_checkpoint_mode("full"), CheckpointMode::kFull);
  EXPECT_EQ(core::parse_checkpoint_mode("light"), CheckpointMode::kLight);
  EXPECT_STREQ(core::to_string(CheckpointMode::kLight), "light");
  try {
    core::parse_checkpoint_mode("partial");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("'partial'; choose full"), std::string::npos) << e.what();
  }
}

// The CUDA side (not yet run: no GPU here). The recompute draws the forward's
// numbers from the CUDA generator, and puts the caller's state back.
TEST(ActivationCheckpointCuda, TheRecomputeDrawsTheForwardsCudaRandomNumbers) {
  EMBER_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  const torch::Tensor x = torch::rand({4096}, cuda).add_(1).requires_grad_();
  const torch::Tensor y =
      core::checkpoint([](const torch::Tensor& t) { return torch::dropout(t, 0.5, /*train=*/true); }, x, {});
  torch::rand({10}, cuda);
  at::Generator gen = at::globalContext().defaultGenerator(cuda);
  const torch::Tensor before_backward = gen.get_state();
  y.sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), (y.detach() != 0).to(torch::kFloat) * 2));
  EXPECT_TRUE(torch::equal(gen.get_state(), before_backward));
}

// CharGpt on the GPU with dropout under bf16 autocast: the forward's loss bit
// for bit (the same kernels on the same shapes and random numbers), the
// gradients to bfloat16's precision. Under autocast a weight's gradient is a
// bfloat16 matmul result (2^-8 relative rounding) summed in float32, and the
// light mode's formulas and CUDA's non-deterministic backward kernels
// (attention's atomics) round in another order: an element near zero can
// differ by more than 2^-8 of itself, so each tensor is compared as a whole,
// ||g - g_ref|| <= 4 x 2^-8 x ||g_ref|| (a few roundings per layer, 2 layers).
TEST(ActivationCheckpointCuda, CharGptFullAndLightUnderAutocastMatchTheUncheckpointedStep) {
  EMBER_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  models::CharGpt model = small_gpt(0.1, 128);
  model->to(cuda);
  const auto step = [&](const ActivationCheckpointing& policy) {
    model->set_activation_checkpointing(policy);
    model->zero_grad();
    torch::manual_seed(7);
    torch::Tensor loss;
    {
      amp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
      loss = gpt_loss(model);
    }
    loss.backward();
    std::map<std::string, torch::Tensor> grads;
    for (const auto& p : model->named_parameters()) grads[p.key()] = p.value().grad().cpu();
    return std::make_pair(loss.item<double>(), grads);
  };
  const auto ref = step(off());
  for (const auto& policy : {full(), light()}) {
    const auto got = step(policy);
    EXPECT_EQ(ref.first, got.first) << "the loss";
    for (const auto& [name, g] : ref.second) {
      const double err = (got.second.at(name) - g).norm().item<double>(), scale = g.norm().item<double>();
      EXPECT_LE(err, 4 * std::ldexp(1.0, -8) * scale) << name;
    }
  }
}

#if EMBER_WITH_CUDA_KERNELS
// A checkpoint that preserves the random generators' states, called while a
// CUDA graph is being captured: refused with its cause (torch cannot read a
// CUDA generator's state during a capture), not torch's internal assert; one
// that does not preserve them captures.
TEST(ActivationCheckpointCuda, PreservingRngInsideAGraphCaptureNamesItsCause) {
  EMBER_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  const torch::Tensor x = torch::rand({256}, cuda).requires_grad_();
  const auto f = [](const torch::Tensor& t) { return t.sin(); };
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  torch::cuda::synchronize();  // x is ready before the side stream reads it
  const c10::cuda::CUDAStreamGuard on_side(side);
  {  // warm-up outside the capture: the autograd engine's and the allocator's first calls
    core::Recomputed r;
    r.forward = f;
    r.options.preserve_rng_state(false);
    core::checkpoint(r, x).sum().backward();
  }
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  std::string error;
  try {
    core::checkpoint(f, x, {});  // preserve_rng_state: true, the default
  } catch (const Error& e) {
    error = e.what();
  }
  core::Recomputed no_rng;
  no_rng.forward = f;
  no_rng.options.preserve_rng_state(false);
  const torch::Tensor y = core::checkpoint(no_rng, x);
  graph.capture_end();
  EXPECT_NE(error.find("cannot run inside a CUDA graph capture"), std::string::npos) << error;
  EXPECT_TRUE(y.defined());
}
#endif
