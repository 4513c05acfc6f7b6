#include "ember/prune/latency.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "ember/core/file.h"

namespace ember::prune {

namespace {

using Clock = std::chrono::steady_clock;

template <size_t D>
void set_conv(LayerOp& op, const torch::nn::detail::ConvNdOptions<D>& o) {
  op.kind = LayerOp::Kind::kConv;
  op.kernel.assign(o.kernel_size()->begin(), o.kernel_size()->end());
  op.stride.assign(o.stride()->begin(), o.stride()->end());
  op.dilation.assign(o.dilation()->begin(), o.dilation()->end());
  op.groups = o.groups();
  op.in = o.in_channels();
  op.out = o.out_channels();
  // Padding modes "same"/"valid" are a variant; the explicit numbers are what matter here.
  if (const auto* p = std::get_if<torch::ExpandingArray<D>>(&o.padding()))
    op.padding.assign((*p)->begin(), (*p)->end());
  else
    op.padding.assign(D, 0);
}

/// The input extent that gives `out` outputs along one conv dimension (the smallest such).
int64_t input_extent(int64_t out, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation) {
  return std::max<int64_t>(1, (out - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1);
}

std::string dtype_name(torch::Dtype dtype) {
  return std::string(c10::toString(dtype));
}

/// Runs `run` `reps` times between two readings of the device's clock, in microseconds per run:
/// CUDA events on the current stream on a GPU (the host clock would add launch and sync latency),
/// the steady clock on the CPU, or the injected one.
double mean_us(const std::function<void()>& run, int64_t reps, const torch::Device& device,
               const std::function<double()>& clock) {
  if (clock) {
    const double t0 = clock();
    for (int64_t i = 0; i < reps; ++i) run();
    return (clock() - t0) / static_cast<double>(reps);
  }
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device.index());
    const auto stream = c10::cuda::getCurrentCUDAStream(device.index());
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);  // timing enabled
    start.record(stream);
    for (int64_t i = 0; i < reps; ++i) run();
    stop.record(stream);
    stop.synchronize();
    return 1e3 * static_cast<double>(start.elapsed_time(stop)) / static_cast<double>(reps);
  }
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < reps; ++i) run();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / static_cast<double>(reps);
}

}  // namespace

std::string LayerOp::key(int64_t batch) const {
  if (kind == Kind::kLinear)
    return fmt::format("linear b{} r{} i{} o{}", batch, fmt::join(extent, ","), in, out);
  return fmt::format("conv b{} i{} o{} x{} k{} s{} p{} d{} g{}", batch, in, out, fmt::join(extent, ","),
                     fmt::join(kernel, ","), fmt::join(stride, ","), fmt::join(padding, ","),
                     fmt::join(dilation, ","), groups);
}

std::vector<LayerOp> layer_ops(torch::nn::Module& model, const core::ForwardFn& forward) {
  std::map<std::string, std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& item : model.named_modules()) modules.emplace(item.key(), item.value());
  const core::ModelCost cost = core::count_cost(model, forward);
  std::vector<LayerOp> ops;
  for (const core::OpCost& c : cost.ops) {
    auto it = modules.find(c.module);
    if (it == modules.end() || c.output.empty()) continue;
    LayerOp op;
    op.weight = c.module.empty() ? "weight" : c.module + ".weight";
    if (auto* conv2 = it->second->as<torch::nn::Conv2d>()) {
      if (c.output.size() != 4) continue;
      set_conv(op, conv2->options);
    } else if (auto* conv1 = it->second->as<torch::nn::Conv1d>()) {
      if (c.output.size() != 3) continue;
      set_conv(op, conv1->options);
    } else if (auto* linear = it->second->as<torch::nn::Linear>()) {
      op.in = linear->options.in_features();
      op.out = linear->options.out_features();
      // [rows, out] (addmm, mm): the rows of one sample's forward.
      op.extent = {c.output.size() >= 2 ? c.macs / (op.in * op.out) : 1};
      ops.push_back(std::move(op));
      continue;
    } else {
      continue;
    }
    // The weight's current shape wins over the options (a pruned model keeps its constructor's options).
    const torch::Tensor w = it->second->named_parameters(/*recurse=*/false)["weight"];
    op.out = w.size(0);
    op.in = w.size(1) * op.groups;
    if (op.groups > 1 && op.groups != op.in) {
      // A depthwise conv whose channels were pruned: its options still name the old groups.
      if (w.size(1) == 1 && c.output[1] == op.out) op.groups = op.in = op.out;
    }
    for (size_t d = 0; d < op.kernel.size(); ++d)
      op.extent.push_back(
          input_extent(c.output[2 + d], op.kernel[d], op.stride[d], op.padding[d], op.dilation[d]));
    ops.push_back(std::move(op));
  }
  return ops;
}

std::string latency_device_name(torch::Device device) {
  if (device.is_cuda()) {
    const c10::DeviceIndex index = device.has_index() ? device.index() : at::cuda::current_device();
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(index);
    return fmt::format("cuda {} sm_{}{}", p->name, p->major, p->minor);
  }
  return fmt::format("cpu {} {} threads", at::get_cpu_capability(), at::get_num_threads());
}

int64_t default_round_to(torch::Device device, torch::Dtype dtype, bool tf32) {
  if (device.is_cuda()) {
    if (dtype == torch::kHalf || dtype == torch::kBFloat16) return 8;
    return dtype == torch::kFloat && tf32 ? 4 : 1;
  }
  // oneDNN's blocked layouts group channels by 8 (AVX2) or 16 (AVX-512). 8 on both: on the AVX-512
  // machine this was measured on, multiples of 16 left the latency target steps too coarse for
  // 16-channel stages (ResNet-14 on Fashion-MNIST at 1.5x: -1.06 points with 16, -0.41 with 8).
  const std::string isa = at::get_cpu_capability();
  return isa.rfind("AVX512", 0) == 0 || isa.rfind("AVX2", 0) == 0 ? 8 : 1;
}

MeasuredLatency::MeasuredLatency(LatencyOptions options)
    : options_(std::move(options)), device_name_(latency_device_name(options_.device())) {
  EMBER_CHECK(options_.batch() >= 1 && options_.reps() >= 1 && options_.warmup() >= 0 &&
                  options_.min_time_us() >= 0 && options_.yardstick_us() >= 0,
              "[prune::MeasuredLatency] batch {} and reps {} must be >= 1, warmup {}, min_time_us {} and "
              "yardstick_us {} >= 0",
              options_.batch(), options_.reps(), options_.warmup(), options_.min_time_us(),
              options_.yardstick_us());
  yardstick_us_ = options_.yardstick_us();
  const std::string& path = options_.table();
  if (path.empty() || !core::is_file(path)) return;
  try {
    const nlohmann::json j = nlohmann::json::parse(core::read_file(path));
    EMBER_CHECK(j.value("version", 0) == 1 && j.at("entries").is_object(), "not an Ember latency table");
    for (const auto& [k, v] : j.at("entries").items()) entries_[k] = v.get<double>();
  } catch (const std::exception& e) {
    std::cerr << fmt::format(
        "[prune::MeasuredLatency] warning: latency table {} is unreadable ({}); moved to {}.bad, and "
        "layers are timed again\n",
        path, std::string(e.what()).substr(0, 200), path);
    entries_.clear();
    core::rename_path(path, path + ".bad");
  }
}

MeasuredLatency::~MeasuredLatency() {
  try {
    save();
  } catch (const std::exception& e) {
    std::cerr << fmt::format("[prune::MeasuredLatency] could not save the latency table: {}\n", e.what());
  }
}

void MeasuredLatency::save() {
  const std::string& path = options_.table();
  if (path.empty() || !dirty_) return;
  std::map<std::string, double> merged;
  if (core::is_file(path)) {  // another process may have added entries since we read it
    try {
      const nlohmann::json j = nlohmann::json::parse(core::read_file(path));
      for (const auto& [k, v] : j.at("entries").items()) merged[k] = v.get<double>();
    } catch (const std::exception&) {
      // Unreadable now: ours replaces it.
    }
  }
  for (const auto& [k, v] : entries_) merged[k] = v;
  nlohmann::json j = {{"version", 1}, {"entries", merged}};
  core::write_file_atomic(path, j.dump(1) + "\n");
  dirty_ = false;
}

MeasuredLatency::Timing MeasuredLatency::time(const std::function<void()>& run, double min_time_us) {
  const torch::Device& device = options_.device();
  const auto& clock = options_.clock_us();
  for (int64_t i = 0; i < options_.warmup(); ++i) run();
  // One run tells how many make a mean of at least min_time_us.
  const double one = std::max(mean_us(run, 1, device, clock), 1e-3);
  const double cover = min_time_us >= 0 ? min_time_us : options_.min_time_us();
  const int64_t reps = std::max(options_.reps(), static_cast<int64_t>(std::ceil(cover / one)));
  std::vector<double> means;
  for (int round = 0; round < 3; ++round) means.push_back(mean_us(run, reps, device, clock));
  std::sort(means.begin(), means.end());
  Timing t;
  t.us = means[1];
  // The median's uncertainty: how far the nearer of the other two means lies from it. One mean thrown
  // off by a burst of load on another core leaves the median, and this, alone; the full range would
  // call every layer as noisy as that burst.
  t.spread = t.us > 0 ? std::min(means[1] - means[0], means[2] - means[1]) / t.us : 0.0;
  return t;
}

std::string MeasuredLatency::full_key(const LayerOp& op) const {
  const bool tf32 = options_.tf32() && options_.dtype() == torch::kFloat;
  return fmt::format(
      "{} | {}{} | {} | {}", device_name_, dtype_name(options_.dtype()), tf32 ? "+TF32" : "",
      options_.channels_last() && op.kind == LayerOp::Kind::kConv ? "channels_last" : "contiguous",
      op.key(options_.batch()));
}

double MeasuredLatency::op_us(const LayerOp& op) {
  const std::string key = full_key(op);
  if (auto it = entries_.find(key); it != entries_.end()) return it->second;
  EMBER_CHECK(op.in >= 1 && op.out >= 1 && op.groups >= 1 && op.in % op.groups == 0,
              "[prune::MeasuredLatency] cannot time {}: channels and groups do not fit", key);
  c10::InferenceMode inference;
  const auto t = torch::TensorOptions().device(options_.device()).dtype(options_.dtype());
  const int64_t b = options_.batch();
  std::function<void()> run;
  torch::Tensor x, w;
  if (op.kind == LayerOp::Kind::kLinear) {
    x = torch::randn({b * op.extent.at(0), op.in}, t);
    w = torch::randn({op.out, op.in}, t);
    run = [&] { torch::linear(x, w); };
  } else {
    std::vector<int64_t> shape{b, op.in};
    shape.insert(shape.end(), op.extent.begin(), op.extent.end());
    std::vector<int64_t> wshape{op.out, op.in / op.groups};
    wshape.insert(wshape.end(), op.kernel.begin(), op.kernel.end());
    x = torch::randn(shape, t);
    w = torch::randn(wshape, t);
    if (options_.channels_last() && shape.size() == 4) {
      x = x.contiguous(torch::MemoryFormat::ChannelsLast);
      w = w.contiguous(torch::MemoryFormat::ChannelsLast);
    }
    run = [&] { torch::convolution(x, w, {}, op.stride, op.padding, op.dilation, false, {0}, op.groups); };
  }
  const Timing timing = time(run);
  entries_[key] = timing.us;
  ++timed_ops_;
  dirty_ = true;
  // The layers' noise: the median spread of what this object timed (a table entry has none).
  op_spreads_.push_back(timing.spread);
  std::vector<double> s = op_spreads_;
  std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(s.size() / 2), s.end());
  op_noise_ = s[s.size() / 2];
  return timing.us;
}

double MeasuredLatency::model_us(torch::nn::Module&, const std::function<void()>& infer) {
  if (!options_.paired()) {
    const Timing t = time(infer);
    model_noise_ = t.spread;
    return t.us;
  }
  std::function<void()> yardstick = options_.reference();
  if (!yardstick) {
    if (!yardstick_) {
      // A fixed matrix product in the layers' dtype: the same work at every call of every run.
      const auto t = torch::TensorOptions().device(options_.device()).dtype(options_.dtype());
      torch::NoGradGuard ng;
      yardstick_a_ = torch::randn({256, 256}, t);
      yardstick_b_ = torch::randn({256, 256}, t);
      yardstick_ = [this] {
        c10::InferenceMode inference;
        torch::mm(yardstick_a_, yardstick_b_);
      };
    }
    yardstick = yardstick_;
  }
  // Alternating rounds; each ratio pairs two measurements taken moments apart and over the same wall
  // time (a yardstick timed for a few milliseconds beside a model timed for seconds sees another load).
  std::vector<double> ratios;
  double first_yardstick = 0;
  for (int round = 0; round < 5; ++round) {
    const double m = time(infer).us;
    const double y = time(yardstick, std::max(options_.min_time_us(), m)).us;
    if (round == 0) first_yardstick = y;
    ratios.push_back(m / std::max(y, 1e-9));
  }
  if (yardstick_us_ <= 0) yardstick_us_ = first_yardstick;
  std::sort(ratios.begin(), ratios.end());
  const double median = ratios[2];
  model_noise_ = median > 0 ? (ratios[3] - ratios[1]) / median : 0.0;  // the middle three's spread
  return yardstick_us_ * median;
}

}  // namespace ember::prune
