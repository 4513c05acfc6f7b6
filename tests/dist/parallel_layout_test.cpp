// dist/parallel_layout.h: the ranks' coordinates (Megatron-LM's order), and
// the 2D layouts on 4 Gloo ranks (threads over one store) against one
// process on the whole batch: pipeline x data (2 x 2, 1F1B) and tensor x
// data (2 x 2), each data-parallel group averaging the gradients once per
// step after the last microbatch, with clipping over the whole model.
#include <ember/dist/gpt2_tensor_parallel.h>
#include <ember/dist/parallel_layout.h>
#include <ember/dist/pipeline.h>
#include <ember/models/gpt2.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "dist/reference_clip.h"
#include "dist/thread_ranks.h"
#include "tolerance.h"

namespace ember::dist {
namespace {

// The table of parallel_layout.h: 8 ranks at pipeline 2 x tensor 2.
TEST(ParallelLayout, RanksAreNumberedTensorFirstThenDataThenPipeline) {
  const ParallelDegrees d = parallel_degrees(8, 2, 2);
  EXPECT_EQ(d.data, 2);
  const std::vector<int64_t> tensor = {0, 1, 0, 1, 0, 1, 0, 1}, data = {0, 0, 1, 1, 0, 0, 1, 1},
                             pipeline = {0, 0, 0, 0, 1, 1, 1, 1};
  for (int64_t r = 0; r < 8; ++r) {
    const ParallelCoordinates at = parallel_coordinates(d, r);
    EXPECT_EQ(at.tensor, tensor[static_cast<size_t>(r)]) << r;
    EXPECT_EQ(at.data, data[static_cast<size_t>(r)]) << r;
    EXPECT_EQ(at.pipeline, pipeline[static_cast<size_t>(r)]) << r;
    EXPECT_EQ(parallel_rank(d, at), r);
  }
  for (const auto& [world, p, t] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{12, 3, 2}, {16, 2, 4}}) {
    const ParallelDegrees g = parallel_degrees(world, p, t);
    for (int64_t r = 0; r < world; ++r) EXPECT_EQ(parallel_rank(g, parallel_coordinates(g, r)), r);
  }
  try {
    parallel_degrees(6, 4, 1);
    ADD_FAILURE() << "4 stages cannot divide 6 ranks";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("pipeline 4 x dist.tensor=1 must divide the 6 rank(s)"),
              std::string::npos);
  }
}

// The groups a rank gets are the table's: every member of each group computes the same group.
TEST(ParallelLayout, GroupsJoinTheRanksThatDifferInOneCoordinate) {
  std::mutex mutex;
  std::map<int64_t, std::string> seen;
  test_util::on_thread_ranks(8, [&](const std::shared_ptr<ProcessGroup>& world) {
    const ParallelLayout layout = make_parallel_layout(world, 2, 2);
    // Each group's members, gathered over that group: [world ranks in group-rank order].
    std::string text;
    for (const auto& g : {layout.tensor, layout.data, layout.pipeline}) {
      torch::Tensor mine = torch::full({1}, world->rank(), torch::kLong);
      torch::Tensor all = torch::empty({g->size()}, torch::kLong);
      g->start_all_gather(all, mine).wait();
      for (int64_t i = 0; i < g->size(); ++i) text += std::to_string(all[i].item<int64_t>());
      text += " ";
    }
    std::lock_guard<std::mutex> lock(mutex);
    seen[world->rank()] = text + layout.describe();
  });
  EXPECT_EQ(seen[0], "01 02 04 pipeline 2 x data 2 x tensor 2 (rank 0: stage 0, replica 0, part 0)");
  EXPECT_EQ(seen[5], "45 57 15 pipeline 2 x data 2 x tensor 2 (rank 5: stage 1, replica 0, part 1)");
  EXPECT_EQ(seen[6], "67 46 26 pipeline 2 x data 2 x tensor 2 (rank 6: stage 1, replica 1, part 0)");
}

constexpr int64_t kLyVocab = 37, kLyBlock = 8, kLyBatch = 16;

models::Gpt2 ly_model() {
  torch::manual_seed(0);
  return models::Gpt2(
      models::Gpt2Options().vocab_size(kLyVocab).n_positions(kLyBlock).n_layer(2).n_head(4).n_embd(16));
}

torch::Tensor ly_batch(int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(300 + step % 2);
  return torch::randint(0, kLyVocab, {kLyBatch, kLyBlock + 1}, gen, torch::kLong);
}

torch::optim::AdamWOptions ly_adamw() {
  return torch::optim::AdamWOptions(1e-3).weight_decay(0.1);
}

torch::Tensor ly_loss(const torch::Tensor& logits, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape(-1));
}

/// One process, the whole batch at once, clipped to norm 1 (per-tensor norms summed in float64).
std::map<std::string, torch::Tensor> ly_reference(int64_t steps) {
  models::Gpt2 model = ly_model();
  torch::optim::AdamW opt(model->parameters(), ly_adamw());
  for (int64_t step = 0; step < steps; ++step) {
    opt.zero_grad();
    const torch::Tensor w = ly_batch(step);
    ly_loss(model->forward(w.narrow(1, 0, kLyBlock)), w.narrow(1, 1, kLyBlock)).backward();
    test_util::clip_grad_norm_f64(model->parameters(), 1.0);
    opt.step();
  }
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

/// got within 1e-5 of the largest weight of want (the float32 bound), every parameter present.
void ly_expect_equal(const std::map<std::string, torch::Tensor>& got,
                     const std::map<std::string, torch::Tensor>& want) {
  double largest = 0;
  for (const auto& [name, t] : want) largest = std::max(largest, test_util::max_abs(t));
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(test_util::near(got.at(name), t, 1e-5 * largest)) << name;
  }
}

// Pipeline 2 x data 2, 1F1B with 4 microbatches of each replica's half batch,
// 10 AdamW steps clipped to norm 1, against one process on the whole batch.
TEST(ParallelLayout, PipelineTimesDataParallelEqualsOneProcess) {
  const int64_t steps = 10;
  std::vector<models::Gpt2> models;
  for (int r = 0; r < 4; ++r) models.push_back(ly_model());
  std::map<std::string, torch::Tensor> got;
  std::mutex mutex;
  test_util::on_thread_ranks(4, [&](const std::shared_ptr<ProcessGroup>& world) {
    const ParallelLayout layout = make_parallel_layout(world, 2, 1);
    PipelineRunner pipe(layout.pipeline,
                        models[static_cast<size_t>(world->rank())]->pipeline_pieces(kLyBlock),
                        PipelineOptions(PipelineSchedule::k1F1B, 4));
    torch::optim::AdamW opt(pipe.parameters(), ly_adamw());
    for (int64_t step = 0; step < steps; ++step) {
      opt.zero_grad();
      const torch::Tensor w = ly_batch(step).chunk(2)[static_cast<size_t>(layout.at.data)];
      pipe.step(w.narrow(1, 0, kLyBlock), w.narrow(1, 1, kLyBlock), ly_loss);
      average_gradients(pipe.parameters(), *layout.data);  // once, after the last microbatch
      pipe.clip_grad_norm_(1.0);
      opt.step();
    }
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [name, p] : pipe.named_parameters()) {
      if (got.count(name)) {  // every replica and both holders of the tied wte: the same bits
        EXPECT_TRUE(torch::equal(got[name], p.detach())) << name << " on rank " << world->rank();
        continue;
      }
      got[name] = p.detach().clone();
    }
  });
  ly_expect_equal(got, ly_reference(steps));
}

// Tensor 2 x data 2: each replica's two ranks run Gpt2TensorParallel on half
// of the batch; 10 AdamW steps clipped to norm 1 against one process.
TEST(ParallelLayout, TensorTimesDataParallelEqualsOneProcess) {
  const int64_t steps = 10;
  std::vector<models::Gpt2> models;
  for (int r = 0; r < 4; ++r) models.push_back(ly_model());
  std::map<std::string, torch::Tensor> got;
  std::mutex mutex;
  test_util::on_thread_ranks(4, [&](const std::shared_ptr<ProcessGroup>& world) {
    const ParallelLayout layout = make_parallel_layout(world, 1, 2);
    Gpt2TensorParallel gpt(models[static_cast<size_t>(world->rank())], layout.tensor);
    torch::optim::AdamW opt(gpt.model()->parameters(), ly_adamw());
    for (int64_t step = 0; step < steps; ++step) {
      opt.zero_grad();
      const torch::Tensor w = ly_batch(step).chunk(2)[static_cast<size_t>(layout.at.data)];
      gpt.loss(w.narrow(1, 0, kLyBlock), w.narrow(1, 1, kLyBlock)).backward();
      gpt.finish_gradients();
      average_gradients(gpt.model()->parameters(), *layout.data);
      gpt.clip_grad_norm_(1.0);
      opt.step();
    }
    const auto whole = gpt.gather_parameters();
    if (world->rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      got = whole;
    }
  });
  ly_expect_equal(got, ly_reference(steps));
}

}  // namespace
}  // namespace ember::dist
