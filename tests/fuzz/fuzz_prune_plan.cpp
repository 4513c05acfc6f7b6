// Pruning plans (prune::Plan::from_json, apply_plan): the JSON, the entries'
// consistency, and a plan applied to a small CNN (convolutions, batch norm,
// a depthwise convolution and a linear layer) beside CharGpt's self-attention
// (2 heads: head entries), with an SGD optimizer holding momentum. Accepted
// plans must round-trip through to_json, and the pruned model must still run
// forward.
#include <torch/torch.h>

#include "ember/models/char_gpt.h"
#include "ember/prune/plan.h"
#include "fuzz/fuzz_common.h"

namespace {
struct NetImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, dw{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Linear fc{nullptr};
  ember::models::CausalSelfAttention attn{nullptr};  // 8 wide, 2 heads of 4
  NetImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(8));
    dw = register_module("dw", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1).groups(8)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 6, 1)));
    fc = register_module("fc", torch::nn::Linear(6 * 4 * 4, 5));
    attn = register_module(
        "attn", ember::models::CausalSelfAttention(ember::models::CharGptOptions().n_embd(8).n_head(2)));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1(conv1(x)));
    x = conv2(dw(x));
    return fc(x.flatten(1));
  }
};
TORCH_MODULE(Net);
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember::prune;
  const std::string json(ember::fuzz::bytes_of(data, size));
  return ember::fuzz::run([&] {
    const Plan plan = Plan::from_json(json);
    EMBER_FUZZ_ASSERT(Plan::from_json(plan.to_json()).to_json() == plan.to_json());
    Net net;
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    // One step, so the optimizer holds momentum buffers to slice.
    (net->forward(torch::ones({2, 3, 4, 4})).sum() + net->attn->forward(torch::ones({1, 3, 8})).sum())
        .backward();
    sgd.step();
    apply_plan(*net, plan, &sgd);
    // A plan may leave the model inconsistent (its layers no longer chain):
    // forward then fails with LibTorch's shape error, which is the plan's
    // fault, not the reader's; what must hold is that applying it did not
    // crash. A consistent plan runs.
    try {
      net->forward(torch::ones({2, 3, 4, 4}));
    } catch (const c10::Error&) {
    }
    try {
      net->attn->forward(torch::ones({1, 3, 8}));
    } catch (const c10::Error&) {
    }
  });
}
