#pragma once
// A 2D or 3D layout of the ranks: pipeline x data x tensor parallelism, and
// the process groups of each dimension.
//
// Ranks are numbered as Megatron-LM numbers them (order tensor, data,
// pipeline): tensor-parallel ranks are neighbours (rank = t + T (d + D p)),
// so that with torchrun's local ranks they share a server and its NVLink
// domain; a pipeline's stages are the farthest apart (across servers, where
// point-to-point messages between two stages are the only traffic).
// 8 ranks at pipeline 2 x tensor 2 (data 2):
//
//   rank      0 1 2 3 4 5 6 7
//   tensor    0 1 0 1 0 1 0 1     groups {0,1} {2,3} {4,5} {6,7}
//   data      0 0 1 1 0 0 1 1     groups {0,2} {1,3} {4,6} {5,7}
//   pipeline  0 0 0 0 1 1 1 1     groups {0,4} {1,5} {2,6} {3,7}
//
// Each rank of a pipeline group runs one stage (dist::PipelineRunner over
// it); each tensor group runs one replica of the stage cut in T parts
// (dist/gpt2_tensor_parallel.h); the data group holds the replicas of the
// same part: their gradients are averaged once per step, after the last
// microbatch (average_gradients).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/amp/grad_scaler.h"
#include "ember/dist/process_group.h"

namespace ember::dist {

/// This rank's place in a layout of `world` ranks.
struct ParallelCoordinates {
  int64_t pipeline = 0, data = 0, tensor = 0;
};

struct ParallelDegrees {
  int64_t pipeline = 1, data = 1, tensor = 1;
  int64_t world() const { return pipeline * data * tensor; }
};

/// The degrees for `world` ranks at `pipeline` x `tensor` (data: the rest);
/// an ember::Error (config) naming dist.pipeline and dist.tensor when they do
/// not divide the world size.
ParallelDegrees parallel_degrees(int64_t world, int64_t pipeline, int64_t tensor);
/// rank -> coordinates (tensor fastest, then data, then pipeline).
ParallelCoordinates parallel_coordinates(const ParallelDegrees& degrees, int64_t rank);
/// coordinates -> rank.
int64_t parallel_rank(const ParallelDegrees& degrees, const ParallelCoordinates& at);

struct ParallelLayout {
  ParallelDegrees degrees;
  ParallelCoordinates at;  ///< this rank's
  std::shared_ptr<ProcessGroup> world, pipeline, data, tensor;
  /// "pipeline 2 x data 2 x tensor 2 (rank 5: stage 1, replica 0, part 1)".
  std::string describe() const;
};

/// Builds this rank's three groups over `world`'s store (every rank of
/// `world` must call it, with the same degrees; once per world group: the
/// groups' rendezvous keys are named by their coordinates only). A group of one rank is
/// still a group (its collectives return at once). Over a replica group
/// (ProcessGroup::create_replicas) the groups are replicas too.
ParallelLayout make_parallel_layout(const std::shared_ptr<ProcessGroup>& world, int64_t pipeline,
                                    int64_t tensor);

/// Averages the gradients of `parameters` over `group` (data parallelism),
/// in place: one all-reduce of the flattened gradients per dtype, divided by
/// the group's size. Every rank must pass the same parameters in the same
/// order; a parameter without a gradient is an error (a rank would wait).
void average_gradients(const std::vector<torch::Tensor>& parameters, ProcessGroup& group);

/// After scaler.unscale_(optimizer) on every rank of `group`: the ranks'
/// inf/NaN flags max-reduced (one all-reduce of one value), so that
/// scaler.step skips the step on every rank when any rank's part of the
/// gradient overflowed. Needed wherever ranks hold different parts of one
/// model (pipeline stages, tensor-parallel parts; over a 3D layout: the
/// world), or their copies of the whole parameters drift apart.
void agree_found_inf(amp::GradScaler& scaler, const torch::optim::Optimizer& optimizer, ProcessGroup& group);

}  // namespace ember::dist
