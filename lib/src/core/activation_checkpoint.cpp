// Activation checkpointing as autograd nodes of Ember's own (see the header
// for what they do). A node owns what its backward needs: the recomputed
// function (a std::function, so the closure and what it captures live as
// long as the graph), the saved input (a detached alias, with the version it
// had), the random generators' and autocast's states of the forward. Its
// next edges are those of the input and of every parameter, built by
// collect_next_edges as LibTorch's own functions do, so the engine hands each
// parameter's gradient to its AccumulateGrad like any other node's output.
#include "ember/core/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <iostream>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/check.h"
#include "ember/core/enum_names.h"
#include "ember/core/snapshot.h"
#include "ember/version.h"

#if EMBER_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace ember::core {
namespace {

using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

/// Autocast's thread-local state for the two device types Ember trains on,
/// and whether casts of weights are cached.
struct AutocastState {
  bool cpu = false;
  bool cuda = false;
  bool cache = true;
  at::ScalarType cpu_dtype = at::kBFloat16;
  at::ScalarType cuda_dtype = at::kHalf;

  static AutocastState capture() {
    AutocastState s;
    s.cpu = at::autocast::is_autocast_enabled(at::kCPU);
    s.cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    s.cache = at::autocast::is_autocast_cache_enabled();
    return s;
  }
  void apply() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
    at::autocast::set_autocast_cache_enabled(cache);
  }
  /// The dtype autocast runs a linear or a convolution in on `device`, if it is on there.
  std::optional<at::ScalarType> lower_precision_on(c10::DeviceType device) const {
    if (device == at::kCPU && cpu) return cpu_dtype;
    if (device == at::kCUDA && cuda) return cuda_dtype;
    return std::nullopt;
  }
};

/// Whether this thread's current CUDA stream is capturing a graph.
bool capturing_cuda_graph() {
#if EMBER_WITH_CUDA_KERNELS
  return torch::cuda::is_available() &&
         c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  return false;
#endif
}

/// What the recompute must see as the forward saw it.
struct ForwardState {
  std::optional<RngState> rng;  ///< before the forward; none without preserve_rng_state
  AutocastState autocast;

  static ForwardState capture(bool with_rng, const std::string& name) {
    ForwardState s;
    // torch refuses to read a CUDA generator's seed and offset during a
    // capture (CUDAGeneratorImpl::current_seed asserts it is not capturing),
    // and a captured recompute would need the graph's own offsets anyway.
    EMBER_CHECK_KIND(kConfig, !with_rng || !capturing_cuda_graph(),
                     "[core::checkpoint] {}: a checkpoint that preserves the random generators' states "
                     "(full activation checkpointing) cannot run inside a CUDA graph capture: torch cannot "
                     "read a CUDA generator's state while capturing. Use light checkpointing "
                     "(model.activation_checkpoint=light), CheckpointOptions::preserve_rng_state(false) "
                     "for a forward that draws no random numbers, or trainer.cuda_graph=false",
                     name);
    if (with_rng) s.rng = RngState::capture();
    s.autocast = AutocastState::capture();
    return s;
  }
};

/// The forward's generators and autocast state for the life of the scope;
/// the caller's back after it (also when the recompute throws). It counts as
/// an autocast region, as torch.autocast does: leaving the outermost one
/// clears the casts cached inside it.
class RecomputeScope {
 public:
  explicit RecomputeScope(const ForwardState& forward) : caller_autocast_(AutocastState::capture()) {
    if (forward.rng) {
      caller_rng_ = RngState::capture();
      forward.rng->restore();
    }
    forward.autocast.apply();
    at::autocast::increment_nesting();
  }
  ~RecomputeScope() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    caller_autocast_.apply();
    if (!caller_rng_) return;
    try {
      caller_rng_->restore();
    } catch (const std::exception& e) {  // a destructor must not throw; say it rather than hide it
      std::cerr << "[core::checkpoint] could not put the random generators back after a recompute: "
                << e.what() << "\n";
    }
  }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  AutocastState caller_autocast_;
  std::optional<RngState> caller_rng_;
};

/// Buffers copied before the recompute and written back after it: batch norm
/// in training mode updates its running statistics on every forward, and the
/// recompute is not a step. All are written back: the batch-norm kernels
/// update the statistics through their data, without moving the version
/// counter, so a change cannot be told from it. Written back only after the
/// recompute's grad(): autograd saved the running statistics, and an
/// in-place write before would fail its version check.
class BufferKeeper {
 public:
  explicit BufferKeeper(const std::vector<torch::Tensor>& buffers) {
    torch::NoGradGuard no_grad;
    for (const auto& b : buffers)
      if (b.defined()) kept_.push_back({b, b.clone()});
  }
  void restore() {
    torch::NoGradGuard no_grad;
    for (auto& k : kept_) k.buffer.copy_(k.value);
    kept_.clear();
  }
  ~BufferKeeper() {
    try {
      restore();
    } catch (const std::exception& e) {
      std::cerr << "[core::checkpoint] could not put a buffer back after a recompute: " << e.what() << "\n";
    }
  }
  BufferKeeper(const BufferKeeper&) = delete;
  BufferKeeper& operator=(const BufferKeeper&) = delete;

 private:
  struct Kept {
    torch::Tensor buffer, value;
  };
  std::vector<Kept> kept_;
};

/// The tensor hooks of the parameters (register_hook; a leaf's live on its
/// AccumulateGrad), set aside while the recompute's grad() runs. The engine
/// runs a captured node's tensor hooks, so they would fire there and again
/// when the outer AccumulateGrad receives the summed gradient: once per
/// checkpointed use plus once. Post hooks (c10d::Reducer's) do not run on a
/// capture. The parameters are the nodes' only users during backward.
class TensorHooksSetAside {
 public:
  explicit TensorHooksSetAside(const std::vector<torch::Tensor>& params) {
    std::unordered_set<Node*> seen;
    for (const auto& p : params) {
      std::shared_ptr<Node> fn = torch::autograd::impl::gradient_edge(p).function;
      if (!fn || !seen.insert(fn.get()).second) continue;
      Aside a{fn, {}, {}};
      a.pre.swap(fn->tensor_pre_hooks());
      a.retains.swap(fn->retains_grad_hooks());
      if (!a.pre.empty() || !a.retains.empty()) aside_.push_back(std::move(a));
    }
  }
  ~TensorHooksSetAside() {
    for (auto& a : aside_) {
      a.fn->tensor_pre_hooks().swap(a.pre);
      a.fn->retains_grad_hooks().swap(a.retains);
    }
  }
  TensorHooksSetAside(const TensorHooksSetAside&) = delete;
  TensorHooksSetAside& operator=(const TensorHooksSetAside&) = delete;

 private:
  struct Aside {
    std::shared_ptr<Node> fn;
    std::vector<std::unique_ptr<torch::autograd::FunctionPreHook>> pre;
    std::unordered_map<size_t, std::unique_ptr<torch::autograd::FunctionPreHook>> retains;
  };
  std::vector<Aside> aside_;
};

/// The parameters that require grad, each once (a tied weight listed twice
/// would have its gradient counted twice).
std::vector<torch::Tensor> trainable_once(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  std::unordered_set<const void*> seen;
  for (const auto& p : params)
    if (p.defined() && p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

bool any_requires_grad(const torch::Tensor& input, const std::vector<torch::Tensor>& params) {
  if (input.requires_grad()) return true;
  for (const auto& p : params)
    if (p.requires_grad()) return true;
  return false;
}

void check_version(const torch::Tensor& saved, int64_t version, const std::string& where, const char* what) {
  EMBER_CHECK(saved._version() == version,
              "[core::checkpoint] {}: {} was modified in place after the forward (version {}, now {}); the "
              "recompute in backward needs it as it was. Make the in-place operation on it out of place "
              "(x = x + y, not x += y), or run it after backward",
              where, what, version, saved._version());
}

/// The output of a node: a fresh alias of `y` (never the input itself or a
/// view of it, whose autograd history must stay theirs) whose grad_fn is `node`.
torch::Tensor attach(const torch::Tensor& y, const std::shared_ptr<Node>& node, const std::string& where) {
  EMBER_CHECK(
      y.defined() && (y.is_floating_point() || y.is_complex()),
      "[core::checkpoint] {}: the forward returned {}; a checkpointed forward must return a floating-point "
      "tensor (its gradient flows back through the recompute)",
      where, y.defined() ? std::string("a tensor of dtype ") + c10::toString(y.scalar_type()) : "nothing");
  torch::Tensor out = y.detach();
  torch::autograd::set_history(out, node);
  return out;
}

/// Shared by the nodes: the recomputed function, the saved input and the forward's state.
class RecomputeNode : public Node {
 public:
  RecomputeNode(Recomputed fn, const torch::Tensor& input, ForwardState state)
      : fn_(std::move(fn)),
        saved_input_(input.detach()),
        input_version_(input._version()),
        state_(std::move(state)) {}

  void release_variables() override {
    fn_.forward = nullptr;
    fn_.params.clear();
    fn_.options.buffers({}).keep_alive(nullptr);
    saved_input_.reset();
  }

 protected:
  const std::string& where() const { return fn_.options.name(); }

  /// Refuses what the recompute cannot do, before it starts.
  void check_usable() const {
    EMBER_CHECK(fn_.forward,
                "[core::checkpoint] {}: backward ran through this checkpoint a second time, after the first "
                "released it; pass retain_graph=true to the first backward",
                where());
    EMBER_CHECK(
        !torch::GradMode::is_enabled(),
        "[core::checkpoint] {}: double backward (create_graph=true) through an activation checkpoint is not "
        "supported; turn activation checkpointing off for it (model.activation_checkpoint_every=0)",
        where());
    check_version(saved_input_, input_version_, where(), "its input");
  }

  /// The saved input, detached, requiring grad when the engine wants its gradient.
  torch::Tensor fresh_input() {
    torch::Tensor x = saved_input_.detach();
    if (task_should_compute_output(0)) x.requires_grad_(true);
    return x;
  }

  /// fn.forward(x) as in the forward (generators, autocast), with grad when `with_grad`.
  torch::Tensor recompute(const torch::Tensor& x, bool with_grad) {
    RecomputeScope scope(state_);
    torch::AutoGradMode grad_mode(with_grad);
    return fn_.forward(x);
  }

  /// Gradients of `y` (given `grad_y`) for x (output 0) and fn's params
  /// (outputs 1..n) where the engine wants them, into `out`.
  void backprop_fn(const torch::Tensor& y, const torch::Tensor& grad_y, const torch::Tensor& x,
                   variable_list& out) {
    if (!y.requires_grad()) return;  // nothing it read requires grad now
    variable_list wrt;
    std::vector<size_t> slots;
    if (x.requires_grad()) {
      wrt.push_back(x);
      slots.push_back(0);
    }
    for (size_t i = 0; i < fn_.params.size(); ++i)
      if (task_should_compute_output(1 + i)) {
        wrt.push_back(fn_.params[i]);
        slots.push_back(1 + i);
      }
    if (wrt.empty()) return;
    EMBER_CHECK(
        y.sizes() == grad_y.sizes(),
        "[core::checkpoint] {}: the recompute returned shape {} but the forward {}; a checkpointed forward "
        "must do the same thing twice",
        where(), fmt::format("{}", y.sizes()), fmt::format("{}", grad_y.sizes()));
    variable_list grads;
    {
      TensorHooksSetAside aside(fn_.params);
      grads = torch::autograd::grad({y}, wrt, {grad_y}, /*retain_graph=*/false, /*create_graph=*/false,
                                    /*allow_unused=*/true);
    }
    for (size_t k = 0; k < slots.size(); ++k) out[slots[k]] = grads[k];
  }

  bool fn_wanted() const {
    for (size_t i = 0; i <= fn_.params.size(); ++i)
      if (task_should_compute_output(i)) return true;
    return false;
  }

  Recomputed fn_;
  torch::Tensor saved_input_;
  int64_t input_version_;
  ForwardState state_;
};

class CheckpointBackward : public RecomputeNode {
 public:
  using RecomputeNode::RecomputeNode;
  std::string name() const override { return "ember::core::CheckpointBackward"; }

  variable_list apply(variable_list&& grads) override {
    check_usable();
    variable_list out(num_outputs());
    if (!grads[0].defined() || !fn_wanted()) return out;
    BufferKeeper buffers(fn_.options.buffers());
    const torch::Tensor x = fresh_input();
    const torch::Tensor y = recompute(x, /*with_grad=*/true);
    backprop_fn(y, grads[0], x, out);
    buffers.restore();
    return out;
  }
};

/// y = op(fn(x), weight, bias) for a linear or a convolution: the op's own
/// gradients come from the recomputed a = fn(x), cast as autocast cast it in
/// the forward, by the formulas autograd's node for the op uses.
class OpAfterBackward : public RecomputeNode {
 public:
  OpAfterBackward(Recomputed fn, const torch::Tensor& input, ForwardState state, const torch::Tensor& weight,
                  const torch::Tensor& bias, std::optional<at::ScalarType> cast_to)
      : RecomputeNode(std::move(fn), input, std::move(state)),
        weight_(weight),
        bias_(bias),
        weight_version_(weight._version()),
        cast_to_(cast_to) {}

  void release_variables() override {
    RecomputeNode::release_variables();
    weight_.reset();
    bias_.reset();
  }

  variable_list apply(variable_list&& grads) override {
    check_usable();
    check_version(weight_, weight_version_, where(), "the weight of the linear/convolution after it");
    variable_list out(num_outputs());
    const torch::Tensor& g = grads[0];
    if (!g.defined()) return out;
    const size_t w_slot = 1 + fn_.params.size(), b_slot = w_slot + 1;
    const bool want_fn = fn_wanted();
    BufferKeeper buffers(fn_.options.buffers());
    const torch::Tensor x = fresh_input();
    const torch::Tensor a = recompute(x, want_fn);
    const torch::Tensor a_op = cast(a.detach()), w_op = cast(weight_);
    OpGrads og = op_backward(g, a_op, w_op,
                             {want_fn && a.requires_grad(), task_should_compute_output(w_slot),
                              bias_.defined() && task_should_compute_output(b_slot)});
    // Autocast's cast back (ToCopyBackward): the gradient in the tensor's own dtype.
    if (og.weight.defined()) out[w_slot] = og.weight.to(weight_.scalar_type());
    if (og.bias.defined()) out[b_slot] = og.bias.to(bias_.scalar_type());
    if (og.input.defined()) backprop_fn(a, og.input.to(a.scalar_type()), x, out);
    buffers.restore();
    return out;
  }

 protected:
  struct OpGrads {
    torch::Tensor input, weight, bias;
  };
  virtual OpGrads op_backward(const torch::Tensor& g, const torch::Tensor& a, const torch::Tensor& w,
                              std::array<bool, 3> mask) const = 0;

  /// What autocast's cached_cast did to the op's argument in the forward.
  torch::Tensor cast(const torch::Tensor& t) const {
    if (!cast_to_ || !at::autocast::is_eligible(t, t.device().type()) || t.scalar_type() == *cast_to_)
      return t;
    return t.to(*cast_to_);
  }

  torch::Tensor weight_, bias_;
  int64_t weight_version_;
  std::optional<at::ScalarType> cast_to_;
};

class LinearAfterBackward : public OpAfterBackward {
 public:
  using OpAfterBackward::OpAfterBackward;
  std::string name() const override { return "ember::core::LinearAfterBackward"; }

 protected:
  // The forward is LinearImpl::forward, LibTorch's F::linear: addmm(bias, a, W^T)
  // for a 2-D input, else a.matmul(W^T) (a contiguous input folded to
  // a2d.mm(W^T)) and then `+= bias`. For a row-major a2d and the column-major
  // W^T, autograd's AddmmBackward0 and MmBackward0 compute the same:
  //   grad a2d = g2d.mm(W)                                   (mm_mat1_backward)
  //   grad W^T = (g2d^T.mm(a2d))^T, so grad W = g2d^T.mm(a2d) (mm_mat2_backward, TBackward)
  // and the bias, broadcast over the output g, gets g summed to its shape (the
  // engine's sum_to) before autocast's cast back.
  OpGrads op_backward(const torch::Tensor& g, const torch::Tensor& a, const torch::Tensor& w,
                      std::array<bool, 3> mask) const override {
    const torch::Tensor g2d = g.reshape({-1, g.size(-1)});
    const torch::Tensor a2d = a.reshape({-1, a.size(-1)});
    OpGrads r;
    if (mask[0]) r.input = g2d.mm(w).reshape(a.sizes());
    if (mask[1]) r.weight = g2d.t().mm(a2d);
    if (mask[2]) r.bias = at::sum_to(g, bias_.sizes());
    return r;
  }
};

class Conv2dAfterBackward : public OpAfterBackward {
 public:
  Conv2dAfterBackward(Recomputed fn, const torch::Tensor& input, ForwardState state,
                      const torch::Tensor& weight, const torch::Tensor& bias,
                      std::optional<at::ScalarType> cast_to, const torch::nn::detail::ConvNdOptions<2>& conv)
      : OpAfterBackward(std::move(fn), input, std::move(state), weight, bias, cast_to),
        stride_(at::IntArrayRef(conv.stride()).vec()),
        padding_(at::IntArrayRef(std::get<torch::ExpandingArray<2>>(conv.padding())).vec()),
        dilation_(at::IntArrayRef(conv.dilation()).vec()),
        groups_(conv.groups()) {}
  std::string name() const override { return "ember::core::Conv2dAfterBackward"; }

 protected:
  // torch::conv2d is at::convolution, whose ConvolutionBackward0 calls exactly this.
  OpGrads op_backward(const torch::Tensor& g, const torch::Tensor& a, const torch::Tensor& w,
                      std::array<bool, 3> mask) const override {
    std::optional<at::IntArrayRef> bias_sizes;
    if (bias_.defined()) bias_sizes = bias_.sizes();
    auto [gi, gw, gb] =
        at::convolution_backward(g, a, w, bias_sizes, stride_, padding_, dilation_,
                                 /*transposed=*/false, /*output_padding=*/{0, 0}, groups_, mask);
    return {gi, gw, gb};
  }

 private:
  std::vector<int64_t> stride_, padding_, dilation_;
  int64_t groups_;
};

/// The node's next edges: the input, fn's parameters, then `extra` (an op's weight and bias).
edge_list next_edges(const torch::Tensor& input, const std::vector<torch::Tensor>& params,
                     const std::vector<torch::Tensor>& extra = {}) {
  variable_list all{input};
  all.insert(all.end(), params.begin(), params.end());
  all.insert(all.end(), extra.begin(), extra.end());
  return torch::autograd::collect_next_edges(all);
}

/// The light nodes' common forward: a = fn(x) and y = op(a) under no_grad, and the node.
template <typename NodeT, typename Op, typename... Extra>
torch::Tensor op_after(Recomputed fn, const torch::Tensor& input, const torch::Tensor& weight,
                       const torch::Tensor& bias, const Op& op, const Extra&... extra) {
  EMBER_CHECK(fn.forward, "[core::checkpoint] {}: no forward function given", fn.options.name());
  EMBER_CHECK(input.defined(), "[core::checkpoint] {}: the input is undefined", fn.options.name());
  fn.params = trainable_once(fn.params);
  if (!torch::GradMode::is_enabled() || !(any_requires_grad(input, fn.params) || weight.requires_grad() ||
                                          (bias.defined() && bias.requires_grad())))
    return op(fn.forward(input));
  ForwardState state = ForwardState::capture(fn.options.preserve_rng_state(), fn.options.name());
  torch::Tensor a, y;
  {
    torch::NoGradGuard no_grad;
    a = fn.forward(input);
    y = op(a);
  }
  const std::optional<at::ScalarType> cast_to = state.autocast.lower_precision_on(a.device().type());
  const std::string where = fn.options.name();
  edge_list edges = next_edges(input, fn.params, {weight, bias});
  std::shared_ptr<NodeT> node(
      new NodeT(std::move(fn), input, std::move(state), weight, bias, cast_to, extra...),
      torch::autograd::deleteNode);
  node->set_next_edges(std::move(edges));
  return attach(y, node, where);
}

}  // namespace

Recomputed Recomputed::of(torch::nn::Module& module, TensorFn forward, std::string name) {
  Recomputed r;
  r.forward = std::move(forward);
  r.params = trainable_once(module.parameters());
  r.options.name(std::move(name)).buffers(module.buffers()).keep_alive(module.weak_from_this().lock());
  return r;
}

torch::Tensor checkpoint(Recomputed fn, const torch::Tensor& input) {
  EMBER_CHECK(fn.forward, "[core::checkpoint] {}: no forward function given", fn.options.name());
  EMBER_CHECK(input.defined(), "[core::checkpoint] {}: the input is undefined", fn.options.name());
  fn.params = trainable_once(fn.params);
  if (!torch::GradMode::is_enabled() || !any_requires_grad(input, fn.params)) return fn.forward(input);
  // The generators before the forward: the recompute must draw what it drew.
  ForwardState state = ForwardState::capture(fn.options.preserve_rng_state(), fn.options.name());
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = fn.forward(input);
  }
  const std::string where = fn.options.name();
  edge_list edges = next_edges(input, fn.params);
  std::shared_ptr<CheckpointBackward> node(new CheckpointBackward(std::move(fn), input, std::move(state)),
                                           torch::autograd::deleteNode);
  node->set_next_edges(std::move(edges));
  return attach(y, node, where);
}

torch::Tensor checkpoint(TensorFn forward, const torch::Tensor& input, std::vector<torch::Tensor> params) {
  Recomputed r;
  r.forward = std::move(forward);
  r.params = std::move(params);
  return checkpoint(std::move(r), input);
}

torch::Tensor checkpoint(torch::nn::Module& module, TensorFn forward, const torch::Tensor& input) {
  return checkpoint(Recomputed::of(module, std::move(forward)), input);
}

torch::Tensor linear_after(Recomputed fn, const torch::Tensor& input, const torch::nn::Linear& linear) {
  // The module's own forward, so that the result is what it computes without
  // checkpointing (F::linear is not at::linear: mm then `+= bias` for 3-D inputs).
  const std::shared_ptr<torch::nn::LinearImpl> module = linear.ptr();
  return op_after<LinearAfterBackward>(std::move(fn), input, module->weight, module->bias,
                                       [&](const torch::Tensor& a) { return module->forward(a); });
}

torch::Tensor conv2d_after(Recomputed fn, const torch::Tensor& input, const torch::nn::Conv2d& conv) {
  const torch::nn::detail::ConvNdOptions<2>& o = conv->options;
  EMBER_CHECK(
      std::holds_alternative<torch::ExpandingArray<2>>(o.padding()) &&
          std::holds_alternative<torch::enumtype::kZeros>(o.padding_mode()),
      "[core::conv2d_after] {}: the convolution must have explicit padding and padding_mode zeros (kSame, "
      "kValid and other padding modes are not supported); use core::checkpoint for it instead",
      fn.options.name());
  // The module's forward: with zeros padding, torch::conv2d, i.e. at::convolution.
  const std::shared_ptr<torch::nn::Conv2dImpl> module = conv.ptr();
  return op_after<Conv2dAfterBackward>(
      std::move(fn), input, module->weight, module->bias,
      [&](const torch::Tensor& a) { return module->forward(a); }, o);
}

namespace {
constexpr EnumNames<CheckpointMode, 2> kCheckpointModeNames{
    "activation checkpointing mode",
    {{{CheckpointMode::kFull, "full"}, {CheckpointMode::kLight, "light"}}},
    "full: recompute whole blocks; light: recompute norms and activations only"};
}  // namespace

const char* to_string(CheckpointMode mode) {
  return kCheckpointModeNames.name(mode);
}

CheckpointMode parse_checkpoint_mode(const std::string& name) {
  return kCheckpointModeNames.parse(name, "core::parse_checkpoint_mode");
}

}  // namespace ember::core
