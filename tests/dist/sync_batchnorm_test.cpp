// dist::SyncBatchNorm on several ranks (threads, each with a Gloo group over
// one in-process store): forward, backward and running statistics equal
// torch::nn::BatchNorm's on the ranks' batches together (double, unequal
// batch sizes); eval mode and one rank are BatchNorm's own forward;
// convert_sync_batchnorm swaps what it can reach and refuses the rest; the
// pruner slices a synchronised batch norm as it slices a batch norm.
#include <ember/core/error.h>
#include <ember/dist/process_group.h>
#include <ember/dist/sync_batchnorm.h>
#include <ember/models/cifar_resnet.h>
#include <ember/models/fashion_net.h>
#include <ember/prune/pruner.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <functional>
#include <sstream>
#include <thread>

#include "dist/thread_ranks.h"
#include "tolerance.h"
#include "train/test_task.h"

namespace ember::dist {
namespace {

using test_util::max_abs;
using test_util::near;
using test_util::on_thread_ranks;
using test_util::rounding_bound;

/// How much centring x magnifies the rounding of its batch statistics: max |x| over the smallest
/// per-channel standard deviation (channels on dim 1). An error of n eps max|x| in a mean of n
/// terms is n eps cond of the spread; so is the variance's, and the normalised output's.
double centring_condition(const torch::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return max_abs(x) / torch::sqrt(torch::var(x, dims, /*unbiased=*/false)).min().item<double>();
}

/// Roundings of a batch norm's statistics and output over n values a channel, computed two ways
/// (partial sums all-reduced, against one sum): the mean and the variance, n terms each, magnified
/// by centring_condition, and 4 elementwise operations (centre, scale by 1/std, affine).
double batch_norm_roundings(int64_t n, double cond) {
  return 2.0 * n * cond + 4;
}

/// A batch norm of `channels` with random weight and bias (double).
torch::nn::BatchNorm2d random_bn(int64_t channels, std::optional<double> momentum) {
  torch::nn::BatchNorm2d bn(torch::nn::BatchNormOptions(channels).momentum(momentum));
  bn->to(torch::kFloat64);
  torch::NoGradGuard no_grad;
  bn->weight.uniform_(0.5, 1.5);
  bn->bias.normal_();
  return bn;
}

struct RankResult {
  torch::Tensor y, dx, dw, db, running_mean, running_var, batches;
};

// Two steps on the same module (the running statistics compound), each rank
// on its slice of one batch; the reference is BatchNorm on the whole batch.
void check_against_batch_norm(const std::vector<int64_t>& sizes, std::optional<double> momentum) {
  const int64_t world = static_cast<int64_t>(sizes.size()), channels = 3;
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  torch::manual_seed(7);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  // Offset and scaled per channel: the means matter.
  std::vector<torch::Tensor> xs, gs;
  for (int step = 0; step < 2; ++step) {
    xs.push_back(torch::randn({total, channels, 4, 5}, f64) * 3 + 10);
    gs.push_back(torch::randn({total, channels, 4, 5}, f64));
  }
  torch::nn::BatchNorm2d init = random_bn(channels, momentum);
  auto ref = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(init->clone());
  std::vector<torch::Tensor> ref_y, ref_dx;
  for (int step = 0; step < 2; ++step) {
    ref->zero_grad();
    const torch::Tensor x = xs[step].clone().requires_grad_();
    const torch::Tensor y = ref->forward(x);
    (y * gs[step]).sum().backward();
    ref_y.push_back(y.detach());
    ref_dx.push_back(x.grad());
  }
  std::vector<std::vector<RankResult>> results(static_cast<size_t>(world));
  on_thread_ranks(world, [&](const std::shared_ptr<ProcessGroup>& group) {
    const int64_t r = group->rank();
    int64_t offset = 0;
    for (int64_t i = 0; i < r; ++i) offset += sizes[i];
    auto copy = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(init->clone());
    SyncBatchNorm2d bn(*copy, group);
    for (int step = 0; step < 2; ++step) {
      bn->zero_grad();
      const torch::Tensor x = xs[step].narrow(0, offset, sizes[r]).clone().requires_grad_();
      const torch::Tensor y = bn(x);
      (y * gs[step].narrow(0, offset, sizes[r])).sum().backward();
      results[r].push_back({y.detach(), x.grad(), bn->weight.grad().clone(), bn->bias.grad().clone(),
                            bn->running_mean.clone(), bn->running_var.clone(),
                            bn->num_batches_tracked.clone()});
    }
  });
  if (::testing::Test::HasFailure()) return;
  // Float64: the ranks' partial statistics all-reduced against BatchNorm's sums over the whole
  // batch: two computations, within batch_norm_roundings of each quantity's magnitude. The weight
  // and bias gradients are sums of n terms dy * xhat and dy: of the magnitude of sum |dy| max|xhat|.
  const int64_t n = total * 4 * 5;
  for (int step = 0; step < 2; ++step) {
    const double k = batch_norm_roundings(n, centring_condition(xs[step]));
    const double xhat_max =
        max_abs(ref_y[step] - ref->bias.view({1, channels, 1, 1})) / ref->weight.abs().min().item<double>();
    const double grad_scale = max_abs(gs[step].abs().sum({0, 2, 3})) * std::max(1.0, xhat_max);
    std::vector<torch::Tensor> y, dx;
    torch::Tensor dw = torch::zeros({channels}, f64), db = torch::zeros({channels}, f64);
    for (int64_t r = 0; r < world; ++r) {
      const RankResult& res = results[r][step];
      y.push_back(res.y);
      dx.push_back(res.dx);
      dw += res.dw;  // DDP would average them: each rank's loss is its share here, so they add up
      db += res.db;
      if (step == 1) {  // every rank ends with the statistics of the whole batches (2 steps: 2k)
        EXPECT_TRUE(near(res.running_mean, ref->running_mean,
                         rounding_bound(torch::kFloat64, 2 * k, max_abs(ref->running_mean))))
            << "rank " << r;
        EXPECT_TRUE(near(res.running_var, ref->running_var,
                         rounding_bound(torch::kFloat64, 2 * k, max_abs(ref->running_var))))
            << "rank " << r;
        EXPECT_EQ(res.batches.item<int64_t>(), 2);
      }
    }
    EXPECT_TRUE(near(torch::cat(y), ref_y[step], rounding_bound(torch::kFloat64, k, max_abs(ref_y[step]))))
        << "step " << step;
    // The backward pass: two more sums of n terms over the forward's values.
    EXPECT_TRUE(
        near(torch::cat(dx), ref_dx[step], rounding_bound(torch::kFloat64, 2 * k, max_abs(ref_dx[step]))))
        << "step " << step;
    if (step == 1) {  // the reference's gradients are those of its last step
      EXPECT_TRUE(near(dw, ref->weight.grad(), rounding_bound(torch::kFloat64, 2 * k, grad_scale)));
      EXPECT_TRUE(near(db, ref->bias.grad(), rounding_bound(torch::kFloat64, 2 * k, grad_scale)));
    }
  }
}

TEST(SyncBatchNorm, TwoRanksOfUnequalBatchesAreBatchNormOnTheirBatchTogether) {
  check_against_batch_norm({3, 5}, 0.1);
}

TEST(SyncBatchNorm, FourRanksWithACumulativeAverageAreBatchNormOnTheirBatchTogether) {
  check_against_batch_norm({2, 3, 4, 1}, std::nullopt);  // momentum None: 1 / batches
}

// [N, C] inputs (BatchNorm1d), float32, equal batches: the combined batch's
// statistics to float precision.
TEST(SyncBatchNorm, OneDimensionalFloatInputs) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({8, 6}) * 2 + 1;
  torch::nn::BatchNorm1d ref(6);
  const torch::Tensor want = ref(x).detach();
  std::vector<torch::Tensor> got(2);
  on_thread_ranks(2, [&](const std::shared_ptr<ProcessGroup>& group) {
    SyncBatchNorm1d bn(torch::nn::BatchNormOptions(6), group);
    got[group->rank()] = bn(x.narrow(0, 4 * group->rank(), 4)).detach();
  });
  if (HasFailure()) return;
  // Two computations of one normalisation in float32 (tolerance.h): 8 values a channel.
  EXPECT_TRUE(
      near(torch::cat(got), want,
           rounding_bound(torch::kFloat32, batch_norm_roundings(8, centring_condition(x)), max_abs(want))));
}

// Eval mode: no collective (rank 0 normalises twice, rank 1 once: a
// collective would wait for a partner and fail within the 5 s timeout).
TEST(SyncBatchNorm, EvalModeIsBatchNormWithoutCommunication) {
  torch::nn::BatchNorm2d init = random_bn(3, 0.1);
  init->running_mean.normal_();
  init->running_var.uniform_(0.5, 2);
  init->eval();
  on_thread_ranks(
      2,
      [&](const std::shared_ptr<ProcessGroup>& group) {
        auto copy = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(init->clone());
        SyncBatchNorm2d bn(*copy, group);
        EXPECT_FALSE(bn->is_training());
        for (int64_t i = 0; i <= 1 - group->rank(); ++i) {
          const torch::Tensor x = torch::randn({2 + group->rank(), 3, 4, 4}, torch::kFloat64);
          EXPECT_TRUE(torch::equal(bn(x), copy->forward(x)));
        }
      },
      std::chrono::seconds(5));
}

// One rank (a Gloo group of one, or the module without a group's
// communication): BatchNorm's forward, bit for bit, running statistics too.
TEST(SyncBatchNorm, OneRankIsBatchNorm) {
  on_thread_ranks(1, [&](const std::shared_ptr<ProcessGroup>& group) {
    torch::nn::BatchNorm2d ref = random_bn(3, 0.1);
    auto copy = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(ref->clone());
    SyncBatchNorm2d bn(*copy, group);
    const torch::Tensor x = torch::randn({4, 3, 5, 5}, torch::kFloat64);
    EXPECT_TRUE(torch::equal(bn(x), ref(x)));
    EXPECT_TRUE(torch::equal(bn->running_mean, ref->running_mean));
    EXPECT_TRUE(torch::equal(bn->running_var, ref->running_var));
  });
}

std::vector<std::string> sync_batch_norm_names(torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& m : model.named_modules())
    if (dynamic_cast<SyncBatchNorm1dImpl*>(m.value().get()) ||
        dynamic_cast<SyncBatchNorm2dImpl*>(m.value().get()) ||
        dynamic_cast<SyncBatchNorm3dImpl*>(m.value().get()))
      names.push_back(m.key());
  return names;
}

std::vector<std::string> batch_norm_names(torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& m : model.named_modules())
    if (m.value()->as<torch::nn::BatchNorm2d>()) names.push_back(m.key());
  return names;
}

// The swapped modules hold the same parameters (the same tensors), share the
// buffers' storage, keep names, options and modes; the model's forward calls
// them: on two replicas the running variance is unbiased over 2 n samples.
TEST(SyncBatchNorm, ConvertSwapsEveryBatchNormItCanReachKeepingItsTensors) {
  const auto group = ProcessGroup::create_replicas(0, 2, {});
  for (const bool resnet : {false, true}) {
    torch::manual_seed(1);
    std::shared_ptr<torch::nn::Module> model, twin;
    std::function<torch::Tensor(const torch::Tensor&)> forward, twin_forward;
    if (resnet) {
      models::CifarResNet a(models::CifarResNetOptions().width(4).blocks(1).in_channels(1));
      torch::manual_seed(1);
      models::CifarResNet b(models::CifarResNetOptions().width(4).blocks(1).in_channels(1));
      model = a.ptr(), twin = b.ptr();
      forward = [a](const torch::Tensor& x) mutable { return a(x); };
      twin_forward = [b](const torch::Tensor& x) mutable { return b(x); };
    } else {
      models::FashionNet a(models::FashionNetOptions().width(4).dropout(0));
      torch::manual_seed(1);
      models::FashionNet b(models::FashionNetOptions().width(4).dropout(0));
      model = a.ptr(), twin = b.ptr();
      forward = [a](const torch::Tensor& x) mutable { return a(x); };
      twin_forward = [b](const torch::Tensor& x) mutable { return b(x); };
    }
    // Float64: in train mode a synchronised batch norm computes its statistics otherwise than
    // BatchNorm (per-rank var_mean, all-reduced), two computations of one value (tolerance.h).
    model->to(torch::kFloat64), twin->to(torch::kFloat64);
    const std::vector<std::string> bns = batch_norm_names(*model);
    std::map<std::string, const void*> params, buffers;
    for (const auto& p : model->named_parameters()) params[p.key()] = p.value().unsafeGetTensorImpl();
    for (const auto& b : model->named_buffers()) buffers[b.key()] = b.value().data_ptr();
    EXPECT_EQ(convert_sync_batchnorm(*model, group), static_cast<int64_t>(bns.size()));
    EXPECT_EQ(sync_batch_norm_names(*model), bns) << "resnet " << resnet;
    EXPECT_EQ(bns.size(), resnet ? 9u : 4u);  // stem, 3 x (bn1, bn2), 2 shortcuts; FashionNet's four
    for (const auto& p : model->named_parameters())
      EXPECT_EQ(params.at(p.key()), p.value().unsafeGetTensorImpl());
    for (const auto& b : model->named_buffers()) EXPECT_EQ(buffers.at(b.key()), b.value().data_ptr());
    EXPECT_EQ(convert_sync_batchnorm(*model, group), 0);  // already synchronised
    const torch::Tensor x = torch::randn({6, 1, 28, 28}, torch::kFloat64);
    model->eval(), twin->eval();
    // Bitwise: in eval mode the synchronised module runs BatchNorm's own forward.
    EXPECT_TRUE(torch::equal(forward(x), twin_forward(x)));
    model->train(), twin->train();
    const torch::Tensor y = forward(x), want = twin_forward(x);
    // The longer chain of roundings into an output (the ResNet's): 9 train-mode batch norms over
    // 6 x 784, 6 x 196 or 6 x 49 values a channel (3 each; 18.5k), x 5 for the centring
    // (batch_norm_roundings), convolutions of 9 to 144 terms and the classifier: ~1e5; x 64 for
    // the growth of relative errors through the layers.
    constexpr double kRoundings = 1e5 * 64;
    EXPECT_TRUE(near(y, want, rounding_bound(torch::kFloat64, kRoundings, max_abs(want))));
    std::map<std::string, torch::Tensor> twin_buffers;
    for (const auto& b : twin->named_buffers()) twin_buffers[b.key()] = b.value();
    for (const std::string& bn : bns) {
      // A running mean is a mean of inputs of magnitude |mean| + std, with std <= sqrt(10 running_var)
      // after one step at momentum 0.1 (running_var = 0.9 + 0.1 var).
      const torch::Tensor mean = model->named_buffers()[bn + ".running_mean"],
                          var = model->named_buffers()[bn + ".running_var"];
      const double scale = max_abs(mean) + std::sqrt(10 * max_abs(var));
      const double bound = rounding_bound(torch::kFloat64, kRoundings, scale);
      // Unbiased over 2 x 6 samples (the replica's too), not 6: differs by ~1e-5 of the value.
      EXPECT_FALSE(near(var, twin_buffers.at(bn + ".running_var"), bound))
          << bn << " was not called through its synchronised forward";
      EXPECT_TRUE(near(mean, twin_buffers.at(bn + ".running_mean"), bound)) << bn;
    }
  }
}

TEST(SyncBatchNorm, ConvertKeepsOptionsModesAndDimensions) {
  const auto group = ProcessGroup::create_replicas(0, 2, {});
  torch::nn::Sequential seq(
      torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(5).momentum(std::nullopt).eps(1e-3)),
      torch::nn::BatchNorm3d(torch::nn::BatchNormOptions(2).affine(false)),
      torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(4).track_running_stats(false)));
  seq[1]->eval();
  EXPECT_EQ(convert_sync_batchnorm(*seq, group), 3);
  auto* one = dynamic_cast<SyncBatchNorm1dImpl*>(seq[0].get());
  auto* three = dynamic_cast<SyncBatchNorm3dImpl*>(seq[1].get());
  auto* two = dynamic_cast<SyncBatchNorm2dImpl*>(seq[2].get());
  ASSERT_TRUE(one && two && three);
  EXPECT_FALSE(one->options.momentum().has_value());
  EXPECT_EQ(one->options.eps(), 1e-3);
  EXPECT_TRUE(one->is_training());
  EXPECT_FALSE(three->options.affine());
  EXPECT_FALSE(three->weight.defined());
  EXPECT_FALSE(three->is_training());
  EXPECT_FALSE(two->options.track_running_stats());
  EXPECT_FALSE(two->running_mean.defined());
  EXPECT_EQ(seq->named_children()[0].key(), "0");
  std::ostringstream printed;
  printed << *seq;
  EXPECT_NE(printed.str().find("ember::dist::SyncBatchNorm1d(5, eps=0.001, momentum=None"), std::string::npos)
      << printed.str();
  // A clone is synchronised too, with tensors of its own.
  const auto copy = std::dynamic_pointer_cast<SyncBatchNorm1dImpl>(one->clone());
  ASSERT_TRUE(copy);
  EXPECT_NE(copy->weight.data_ptr(), one->weight.data_ptr());
  EXPECT_TRUE(torch::equal(copy->weight, one->weight));
  EXPECT_EQ(copy->group(), group);
}

struct TypedMemberNet : torch::nn::Module {
  TypedMemberNet() {
    head =
        register_module("head", torch::nn::Sequential(torch::nn::Conv2d(1, 2, 1), torch::nn::BatchNorm2d(2)));
    bn = register_module("bn", torch::nn::BatchNorm2d(2));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn(head->forward(x)); }
  torch::nn::Sequential head{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};

// A batch norm called through a typed member would keep running unsynchronised:
// refused, naming it, before anything changes (the Sequential's is left too).
TEST(SyncBatchNorm, ConvertRefusesBatchNormsItCannotReach) {
  const auto group = ProcessGroup::create_replicas(0, 2, {});
  auto net = std::make_shared<TypedMemberNet>();
  const std::string error = test_util::error_of([&] { convert_sync_batchnorm(*net, group); });
  EXPECT_NE(error.find("bn (torch::nn::BatchNorm2dImpl) cannot be swapped: its parent the model"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("core::SwappableChildren"), std::string::npos) << error;
  EXPECT_TRUE(sync_batch_norm_names(*net).empty());
  torch::nn::BatchNorm2d alone(3);
  EXPECT_NE(test_util::error_of([&] { convert_sync_batchnorm(*alone, group); }).find("the model itself is a"),
            std::string::npos);
}

// The pruner traces a synchronised batch norm as a batch norm (eval mode: no
// communication), plans the same channels and slices its tensors and options.
TEST(SyncBatchNorm, PrunedAsBatchNorm) {
  const auto group = ProcessGroup::create_replicas(0, 2, {});
  std::vector<std::string> plans;
  for (const bool sync : {false, true}) {
    torch::manual_seed(5);
    models::CifarResNet net(models::CifarResNetOptions().width(8).blocks(1).in_channels(1));
    if (sync) {
      EXPECT_EQ(convert_sync_batchnorm(*net, group), 9);
    }
    const torch::Tensor x = torch::randn({2, 1, 12, 12});
    prune::Pruner pruner(
        *net, [&] { return std::vector<torch::Tensor>{net(x)}; },
        prune::PrunerOptions().print_warnings(false));
    pruner.step(0.5);
    plans.push_back(pruner.plan().to_json());
    if (!sync) continue;
    EXPECT_EQ(sync_batch_norm_names(*net).size(), 9u);
    for (const auto& m : net->modules())
      if (auto* bn = dynamic_cast<SyncBatchNorm2dImpl*>(m.get())) {
        EXPECT_EQ(bn->options.num_features(), bn->weight.size(0));
        EXPECT_EQ(bn->running_mean.size(0), bn->weight.size(0));
        EXPECT_EQ(bn->running_var.size(0), bn->weight.size(0));
        EXPECT_LE(bn->weight.size(0), 16);
      }
    net->train();
    EXPECT_EQ(net(x).sizes(), (std::vector<int64_t>{2, 10}));  // still runs, synchronised, after slicing
  }
  EXPECT_EQ(plans[0], plans[1]);
  EXPECT_NE(plans[0].find("stages.0.bn1.weight"), std::string::npos);
}

}  // namespace
}  // namespace ember::dist

namespace ember::dist {
namespace {

// A ResNet (stride-2 stages, projection shortcuts) in double: the gradients
// averaged over 2 ranks of 3 samples each (what DDP applies) are one
// process's on the 6 samples together.
TEST(SyncBatchNorm, ResNetGradientsOnTwoRanksAreOneProcesssOnTheWholeBatch) {
  const auto options = models::CifarResNetOptions().width(4).blocks(1).in_channels(1);
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({6, 1, 12, 12}, torch::kFloat64);
  const torch::Tensor target = torch::randint(10, {6});
  torch::manual_seed(2);
  models::CifarResNet ref(options);
  ref->to(torch::kFloat64);
  torch::nn::functional::cross_entropy(ref(x), target).backward();
  // The ranks' replicas are built here, one after the other: seeding and drawing the global
  // generator in the rank threads at once would interleave their draws (different weights).
  std::vector<models::CifarResNet> nets;
  for (int64_t r = 0; r < 2; ++r) {
    torch::manual_seed(2);
    nets.emplace_back(options);
    nets.back()->to(torch::kFloat64);
    const auto want = ref->parameters();
    const auto got = nets.back()->parameters();
    for (size_t i = 0; i < want.size(); ++i) ASSERT_TRUE(torch::equal(got[i], want[i])) << "replica " << r;
  }
  std::vector<std::vector<torch::Tensor>> grads(2);
  on_thread_ranks(2, [&](const std::shared_ptr<ProcessGroup>& group) {
    const int64_t r = group->rank();
    models::CifarResNet net = nets[r];
    convert_sync_batchnorm(*net, group);
    torch::nn::functional::cross_entropy(net(x.narrow(0, 3 * r, 3)), target.narrow(0, 3 * r, 3)).backward();
    for (const auto& p : net->parameters()) grads[r].push_back(p.grad().clone());
  });
  if (HasFailure()) return;
  // Two computations of one gradient in float64 (tolerance.h). The longest chain into a gradient:
  // the forward's 9 batch norms over 6 x 144, 6 x 36 or 6 x 9 values a channel (3 each; 3.4k), x 5
  // for the centring (batch_norm_roundings), convolutions of 9 to 144 terms (~400) and the
  // classifier; the backward pass twice that: ~5e4; x 64 for the growth through the layers; of
  // the largest gradient's magnitude (batch norm's backward subtracts means: a tensor's own
  // gradient can be far smaller than the terms that made it).
  constexpr double kRoundings = 5e4 * 64;
  const auto names = ref->named_parameters();
  double scale = 0;
  for (const auto& p : names) scale = std::max(scale, max_abs(p.value().grad()));
  for (size_t i = 0; i < names.size(); ++i)
    EXPECT_TRUE(near((grads[0][i] + grads[1][i]) / 2, names[i].value().grad(),
                     rounding_bound(torch::kFloat64, kRoundings, scale)))
        << names[i].key();
}

}  // namespace
}  // namespace ember::dist
