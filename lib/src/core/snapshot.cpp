#include "ember/core/snapshot.h"

#include <torch/torch.h>

#include <iostream>
#include <map>

#include "core/check.h"

namespace ember::core {
namespace {

at::Generator cuda_generator(size_t index) {
  return at::globalContext().defaultGenerator(
      torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index)));
}

}  // namespace

RngState RngState::capture() {
  RngState s;
  s.cpu = at::detail::getDefaultCPUGenerator().get_state();
  if (torch::cuda::is_available())
    for (size_t i = 0; i < static_cast<size_t>(torch::cuda::device_count()); ++i)
      s.cuda.push_back(cuda_generator(i).get_state());
  return s;
}

void RngState::restore() const {
  if (cpu.defined()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(cpu);
  }
  for (size_t i = 0; i < cuda.size(); ++i)
    if (cuda[i].defined()) {
      at::Generator gen = cuda_generator(i);
      gen.set_state(cuda[i]);
    }
}

void RngState::write(torch::serialize::OutputArchive& archive) const {
  archive.write("rng_cpu", cpu);
  for (size_t i = 0; i < cuda.size(); ++i) archive.write("rng_cuda_" + std::to_string(i), cuda[i]);
}

RngState RngState::read(torch::serialize::InputArchive& archive) {
  RngState s;
  archive.read("rng_cpu", s.cpu);
  if (torch::cuda::is_available())
    for (size_t i = 0; i < static_cast<size_t>(torch::cuda::device_count()); ++i) {
      torch::Tensor t;  // a fresh tensor per read: InputArchive::read set_()s a defined one
      s.cuda.push_back(archive.try_read("rng_cuda_" + std::to_string(i), t) ? t : torch::Tensor());
    }
  return s;
}

ModelSnapshot::ModelSnapshot(torch::nn::Module& model, ModelSnapshotOptions options)
    : model_(model), options_(options) {
  torch::NoGradGuard no_grad;
  if (options_.parameters())
    for (const auto& p : model.named_parameters())
      values_.emplace_back("p:" + p.key(), p.value().detach().clone());
  if (options_.buffers())
    for (const auto& b : model.named_buffers())
      values_.emplace_back("b:" + b.key(), b.value().detach().clone());
  if (options_.set_aside_grads())
    for (auto& p : model.parameters()) {
      grads_.emplace_back(p, p.grad());
      p.mutable_grad() = torch::Tensor();
    }
  for (const auto& m : model.modules()) modes_.emplace_back(m, m->is_training());
  if (options_.rng()) rng_ = RngState::capture();
}

ModelSnapshot::~ModelSnapshot() {
  if (restored_) return;
  try {
    restore();
  } catch (const std::exception& e) {
    std::cerr << fmt::format("[core::ModelSnapshot] could not put the model back: {}\n", e.what());
  }
}

void ModelSnapshot::restore() {
  restored_ = true;
  torch::NoGradGuard no_grad;
  if (!values_.empty()) {
    std::map<std::string, torch::Tensor> now;
    for (const auto& p : model_.named_parameters()) now["p:" + p.key()] = p.value();
    for (const auto& b : model_.named_buffers()) now["b:" + b.key()] = b.value();
    for (const auto& [name, saved] : values_) {
      const auto it = now.find(name);
      EMBER_CHECK(
          it != now.end() && it->second.sizes() == saved.sizes(),
          "[core::ModelSnapshot] the model changed while it was borrowed ({} {}); it cannot be put back",
          name.substr(2), it == now.end() ? "is gone" : "changed shape");
      it->second.copy_(saved);
    }
  }
  if (options_.clear_grads())
    for (auto& p : model_.parameters()) p.mutable_grad() = torch::Tensor();
  for (auto& [p, g] : grads_) p.mutable_grad() = g;
  for (auto& [m, training] : modes_) m->train(training);
  if (options_.rng()) rng_.restore();
}

}  // namespace ember::core
