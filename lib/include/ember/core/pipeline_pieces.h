#pragma once
// A model cut into pieces for pipeline parallelism: an ordered list of
// functions of one tensor (the first takes the batch's input, each next one
// the previous one's output, the last one's output goes to the loss), each
// with the parameters it uses and a cost to balance stages by. Consecutive
// pieces form a stage (dist::balance_stages); a parameter listed by pieces of
// two stages (GPT-2's wte, read by the embedding and by the tied head) is a
// tied parameter, whose gradient the stages that hold it add up
// (dist::PipelineRunner).
//
// A model that can be pipelined lists its pieces (models::Gpt2Impl::
// pipeline_pieces: the embedding, each block, the final norm and head);
// running the pieces in order on one process is the model's forward.

#include <torch/types.h>

#include <functional>
#include <string>
#include <vector>

namespace ember::core {

struct PipelinePiece {
  /// For messages and parameter names: "embedding", "h.3", "head".
  std::string name;
  /// The parameters the piece reads, with their names in the model's
  /// state_dict ("transformer.h.3.attn.c_attn.weight").
  std::vector<std::pair<std::string, torch::Tensor>> parameters;
  /// Input -> output; the first piece's input is the batch's, the last one's output the loss's input.
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  /// Relative cost of its forward (e.g. FLOPs per sample), for balancing stages.
  double cost = 1.0;
};

}  // namespace ember::core
