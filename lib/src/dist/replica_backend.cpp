// See replica_backend.h. The reductions a sum-of-identical-ranks gives:
// SUM x size, AVG/MAX/MIN the value itself; anything else (PRODUCT, bitwise)
// is refused rather than guessed.
#include "dist/replica_backend.h"

#include <torch/torch.h>

#include <utility>
#include <vector>

namespace ember::dist {
namespace {

/// A finished collective whose future holds its output tensors (DDP's reducer reads them).
class DoneWork final : public c10d::Work {
 public:
  explicit DoneWork(std::vector<at::Tensor> result) : result_(std::move(result)) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::vector<c10::Device> devices;
    for (const at::Tensor& t : result_)
      if (!t.is_cpu() && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
        devices.push_back(t.device());
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                           std::move(devices));
    future->markCompleted(c10::IValue(result_));
    return future;
  }

 private:
  std::vector<at::Tensor> result_;
};

c10::intrusive_ptr<c10d::Work> done(std::vector<at::Tensor> result = {}) {
  return c10::make_intrusive<DoneWork>(std::move(result));
}

class ReplicaBackend final : public c10d::Backend {
 public:
  ReplicaBackend(int rank, int size) : Backend(rank, size) {}
  const std::string getBackendName() const override { return "ember_replicas"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& /*opts*/) override {
    return done(tensors);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    for (at::Tensor& t : tensors) reduce_(t, opts.reduceOp);
    return done(tensors);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    for (at::Tensor& t : tensors) reduce_(t, opts.reduceOp);
    return done(tensors);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "[dist::replicas] allgather: ", outputs.size(),
                " output lists for ", inputs.size(), " inputs");
    std::vector<at::Tensor> result;
    for (size_t i = 0; i < inputs.size(); ++i)
      for (at::Tensor& o : outputs[i]) result.push_back(o.copy_(inputs[i]));
    return done(std::move(result));
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    TORCH_CHECK(output.numel() == input.numel() * getSize(), "[dist::replicas] all-gather: output of ",
                output.numel(), " elements for ", getSize(), " x ", input.numel());
    output.view({getSize(), input.numel()}).copy_(input.reshape({1, input.numel()}));
    return done({output});
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(input.numel() == output.numel() * getSize(), "[dist::replicas] reduce-scatter: input of ",
                input.numel(), " elements for ", getSize(), " x ", output.numel());
    output.copy_(input.view({getSize(), output.numel()})[getRank()].view_as(output));
    reduce_(output, opts.reduceOp);
    return done({output});
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override { return done(); }

 private:
  void reduce_(at::Tensor& t, const c10d::ReduceOp& op) const {
    switch (op.op_) {
      case c10d::ReduceOp::SUM:
        t.mul_(getSize());
        return;
      case c10d::ReduceOp::AVG:
      case c10d::ReduceOp::MAX:
      case c10d::ReduceOp::MIN:
        return;
      default:
        TORCH_CHECK(false, "[dist::replicas] reduction ", static_cast<int>(op.op_),
                    " of identical ranks is not defined here (SUM, AVG, MAX, MIN are)");
    }
  }
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_replica_backend(int rank, int size) {
  return c10::make_intrusive<ReplicaBackend>(rank, size);
}

}  // namespace ember::dist
