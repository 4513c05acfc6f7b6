#pragma once
// Distribution: what the Trainer needs to know about the other processes of a
// data-parallel run, and nothing more. The one-process default does nothing;
// ember::dist::make_distribution(group) implements it over a process group
// (gradient reduction itself is a callback: dist::DistributedDataParallel).
//
//   auto dist = ember::dist::make_distribution(group);       // or none: one process
//   ember::train::Trainer trainer(ember::train::TrainerOptions().distribution(dist));

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

namespace ember::train {

class Distribution {
 public:
  virtual ~Distribution() = default;

  /// Processes training together, and this one's index among them.
  virtual int64_t world_size() const { return 1; }
  virtual int64_t rank() const { return 0; }
  /// Processes that train on each sample: 1 under data parallelism; P x T
  /// under a model-parallel layout, whose ranks of one replica (its stages,
  /// its tensor-parallel parts) read the same batches. The epoch's sums over
  /// the processes are divided by it.
  virtual int64_t sample_copies() const { return 1; }
  /// Whether this process writes what the run leaves behind (checkpoints,
  /// reports): rank 0. Every process reads checkpoints to resume.
  bool is_writer() const { return rank() == 0; }

  /// Sums `tensor` over processes, in place (each trains on a shard, so the
  /// epoch's loss and accuracy sums are added up before they are reported).
  virtual void all_reduce_sum(torch::Tensor& tensor) { (void)tensor; }
  /// Whether any process says `flag` (a stop asked for on one rank stops all,
  /// so that none is left waiting in a collective).
  virtual bool any(bool flag) { return flag; }
  /// Fails, on every process, unless all of them hold the same `value` (the
  /// resume position: each must continue from the same step); `what` names it.
  virtual void check_same(const std::string& what, const std::string& value) {
    (void)what;
    (void)value;
  }
};

/// The one-process Distribution (a shared no-op object).
std::shared_ptr<Distribution> single_process();

}  // namespace ember::train
