// Pipeline x data x tensor layouts of the ranks (see parallel_layout.h).
#include "ember/dist/parallel_layout.h"

#include <fmt/format.h>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <map>
#include <sstream>

#include "ember/core/error.h"

namespace ember::dist {

ParallelDegrees parallel_degrees(int64_t world, int64_t pipeline, int64_t tensor) {
  if (pipeline < 1 || tensor < 1 || world % (pipeline * tensor) != 0)
    throw Error(ErrorKind::kConfig,
                fmt::format("[dist] {}dist.tensor={} must divide the {} rank(s) (data parallelism takes the "
                            "rest): launch a multiple of {} processes (torchrun --nproc-per-node=...)",
                            pipeline == 1 ? "" : fmt::format("pipeline {} x ", pipeline), tensor, world,
                            pipeline * tensor));
  ParallelDegrees d;
  d.pipeline = pipeline;
  d.tensor = tensor;
  d.data = world / (pipeline * tensor);
  return d;
}

ParallelCoordinates parallel_coordinates(const ParallelDegrees& degrees, int64_t rank) {
  TORCH_CHECK(rank >= 0 && rank < degrees.world(), "[dist] rank ", rank, " of ", degrees.world());
  ParallelCoordinates at;
  at.tensor = rank % degrees.tensor;
  at.data = (rank / degrees.tensor) % degrees.data;
  at.pipeline = rank / (degrees.tensor * degrees.data);
  return at;
}

int64_t parallel_rank(const ParallelDegrees& degrees, const ParallelCoordinates& at) {
  return at.tensor + degrees.tensor * (at.data + degrees.data * at.pipeline);
}

std::string ParallelLayout::describe() const {
  std::ostringstream s;
  s << "pipeline " << degrees.pipeline << " x data " << degrees.data << " x tensor " << degrees.tensor
    << " (rank " << world->rank() << ": stage " << at.pipeline << ", replica " << at.data << ", part "
    << at.tensor << ")";
  return s.str();
}

ParallelLayout make_parallel_layout(const std::shared_ptr<ProcessGroup>& world, int64_t pipeline,
                                    int64_t tensor) {
  ParallelLayout layout;
  layout.degrees = parallel_degrees(world->size(), pipeline, tensor);
  layout.at = parallel_coordinates(layout.degrees, world->rank());
  layout.world = world;
  const ParallelDegrees& d = layout.degrees;
  const ParallelCoordinates& at = layout.at;
  // One group per dimension: the ranks that differ from this one in that coordinate only,
  // named by the other two coordinates (every member computes the same name).
  const auto group = [&](const std::string& dim, int64_t size, int64_t index, const std::string& key) {
    if (world->backend() == Backend::kReplicas)
      return ProcessGroup::create_replicas(index, size, world->options());
    const auto base = c10::intrusive_ptr<c10d::Store>::reclaim_copy(&world->store());
    return ProcessGroup::create(c10::make_intrusive<c10d::PrefixStore>("layout/" + dim + "/" + key, base),
                                index, size, world->options());
  };
  layout.tensor =
      group("tensor", d.tensor, at.tensor, std::to_string(at.pipeline) + "," + std::to_string(at.data));
  layout.data = group("data", d.data, at.data, std::to_string(at.pipeline) + "," + std::to_string(at.tensor));
  layout.pipeline =
      group("pipeline", d.pipeline, at.pipeline, std::to_string(at.data) + "," + std::to_string(at.tensor));
  return layout;
}

void average_gradients(const std::vector<torch::Tensor>& parameters, ProcessGroup& group) {
  if (group.size() == 1) return;
  std::map<torch::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const auto& p : parameters) {
    TORCH_CHECK(p.grad().defined(), "[dist::average_gradients] a parameter of shape ", p.sizes(),
                " has no gradient: every rank must reduce the same gradients");
    by_dtype[p.grad().scalar_type()].push_back(p.grad());
  }
  for (auto& [dtype, grads] : by_dtype) {
    std::vector<torch::Tensor> flats;
    for (const auto& g : grads) flats.push_back(g.reshape(-1));
    torch::Tensor flat = torch::cat(flats);
    group.all_reduce_sum_(flat);
    flat.div_(static_cast<double>(group.size()));
    int64_t offset = 0;
    for (auto& g : grads) {
      g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
      offset += g.numel();
    }
  }
}

void agree_found_inf(amp::GradScaler& scaler, const torch::optim::Optimizer& optimizer, ProcessGroup& group) {
  // One flag per rank, whatever devices its gradients are on, so that every
  // rank makes exactly one all-reduce; on the group's device (NCCL reduces
  // CUDA tensors only).
  std::map<std::string, torch::Tensor> flags = scaler.found_inf_per_device(optimizer);
  torch::Tensor any = torch::zeros({1}, torch::TensorOptions(torch::kFloat32).device(group.device()));
  for (const auto& [device, flag] : flags) any = torch::maximum(any, flag.to(any.options()).reshape({1}));
  if (group.size() > 1) group.all_reduce_max_(any);
  for (auto& [device, flag] : flags) flag.copy_(any.reshape(flag.sizes()).to(flag.device()));
}

}  // namespace ember::dist
