#include "ember/prune/latency.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/cuda/CUDAContext.h>
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

/// Median of three means of `reps` runs of `run`, after `warmup` runs, in microseconds.
double time_us(const std::function<void()>& run, const torch::Device& device, int64_t warmup, int64_t reps) {
  const auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  for (int64_t i = 0; i < warmup; ++i) run();
  std::vector<double> means;
  for (int round = 0; round < 3; ++round) {
    sync();
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < reps; ++i) run();
    sync();
    means.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                    static_cast<double>(reps));
  }
  std::sort(means.begin(), means.end());
  return means[1];
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

int64_t default_round_to(torch::Device device, torch::Dtype dtype) {
  if (device.is_cuda()) return dtype == torch::kHalf || dtype == torch::kBFloat16 ? 8 : 1;
  // oneDNN's blocked layouts group channels by 8 (AVX2) or 16 (AVX-512). 8 on both: on the AVX-512
  // machine this was measured on, multiples of 16 left the latency target steps too coarse for
  // 16-channel stages (ResNet-14 on Fashion-MNIST at 1.5x: -1.06 points with 16, -0.41 with 8).
  const std::string isa = at::get_cpu_capability();
  return isa.rfind("AVX512", 0) == 0 || isa.rfind("AVX2", 0) == 0 ? 8 : 1;
}

MeasuredLatency::MeasuredLatency(LatencyOptions options)
    : options_(std::move(options)), device_name_(latency_device_name(options_.device())) {
  EMBER_CHECK(options_.batch() >= 1 && options_.reps() >= 1 && options_.warmup() >= 0,
              "[prune::MeasuredLatency] batch {} and reps {} must be >= 1, warmup {} >= 0", options_.batch(),
              options_.reps(), options_.warmup());
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

std::string MeasuredLatency::full_key(const LayerOp& op) const {
  return fmt::format(
      "{} | {} | {} | {}", device_name_, dtype_name(options_.dtype()),
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
  const double us = time_us(run, options_.device(), options_.warmup(), options_.reps());
  entries_[key] = us;
  ++timed_ops_;
  dirty_ = true;
  return us;
}

double MeasuredLatency::model_us(torch::nn::Module&, const std::function<void()>& infer) {
  const auto& reference = options_.reference();
  if (!reference) return time_us(infer, options_.device(), options_.warmup(), options_.reps());
  if (reference_us_ <= 0)
    reference_us_ = time_us(reference, options_.device(), options_.warmup(), options_.reps());
  std::vector<double> ratios;
  for (int round = 0; round < 5; ++round) {
    const double r = time_us(reference, options_.device(), 1, options_.reps());
    ratios.push_back(time_us(infer, options_.device(), 1, options_.reps()) / r);
  }
  std::sort(ratios.begin(), ratios.end());
  return reference_us_ * ratios[ratios.size() / 2];
}

}  // namespace ember::prune
