// dist::PipelineRunner: a GPT-2 cut into stages over 2 and 4 Gloo ranks (threads
// over one store), GPipe, 1F1B and interleaved 1F1B (2 stages per rank), against the unsplit model on one
// process accumulating the same microbatches:
//   - the first step's gradients: bit for bit for every parameter one stage
//     holds (the same operations on the same shapes), and for the tied wte
//     within the rounding of its sum (one process adds the embedding's and
//     the head's uses inside autograd microbatch by microbatch, the pipeline
//     sums each stage's and then adds the two);
//   - 20 AdamW steps with clipping: every weight within 1e-5 of the largest in
//     float32 (the bound), and in float64 within the rounding bound;
//   - bf16-mixed, and fp16-mixed with loss scaling (an overflowing step
//     skipped on every stage alike);
//   - the activations kept: 1F1B's live microbatches per stage are min(p - s, m),
//     GPipe's m, as the plan's simulation says;
//   - refusals before any communication: fewer microbatches than stages under
//     1F1B, a batch the microbatches do not divide.
#include <ember/amp/autocast.h>
#include <ember/amp/grad_scaler.h>
#include <ember/data/loader.h>
#include <ember/dist/distribution.h>
#include <ember/dist/model_parallel_training.h>
#include <ember/dist/parallel_layout.h>
#include <ember/dist/pipeline.h>
#include <ember/dist/process_group.h>
#include <ember/models/gpt2.h>
#include <ember/train/safetensors.h>
#include <ember/train/trainer.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "dist/reference_clip.h"
#include "dist/thread_ranks.h"
#include "tolerance.h"
#include "train/test_task.h"

namespace ember::dist {
namespace {

constexpr int64_t kPlVocab = 37, kPlBlock = 8, kPlBatch = 16;

models::Gpt2Options pl_options(int64_t layers) {
  return models::Gpt2Options().vocab_size(kPlVocab).n_positions(kPlBlock).n_layer(layers).n_head(2).n_embd(
      16);
}

models::Gpt2 pl_model(int64_t layers, torch::ScalarType dtype) {
  torch::manual_seed(0);
  models::Gpt2 model(pl_options(layers));
  model->to(dtype);
  return model;
}

/// Step `step`'s batch: tokens [kPlBatch, kPlBlock + 1], the same on every rank;
/// two batches in turn (random tokens, so that the steps can learn them).
torch::Tensor pl_batch(int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step % 2);
  return torch::randint(0, kPlVocab, {kPlBatch, kPlBlock + 1}, gen, torch::kLong);
}

torch::Tensor pl_loss(const torch::Tensor& logits, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape(-1));
}

struct PlResult {
  std::map<std::string, torch::Tensor> first_grads, weights;  // by state_dict name
  std::vector<double> losses;
  std::vector<int> peak_live;  // per stage (pipeline runs)
};

torch::optim::AdamWOptions pl_adamw() {
  return torch::optim::AdamWOptions(1e-3).weight_decay(0.1);
}

/// One process: each step accumulates the m microbatches' loss / m, clips, steps.
PlResult pl_reference(int64_t layers, torch::ScalarType dtype, int64_t m, int64_t steps, double clip) {
  models::Gpt2 model = pl_model(layers, dtype);
  torch::optim::AdamW opt(model->parameters(), pl_adamw());
  PlResult r;
  for (int64_t step = 0; step < steps; ++step) {
    opt.zero_grad();
    const torch::Tensor w = pl_batch(step);
    const auto xs = w.narrow(1, 0, kPlBlock).chunk(m), ys = w.narrow(1, 1, kPlBlock).chunk(m);
    double loss = 0;
    for (int64_t i = 0; i < m; ++i) {
      const torch::Tensor l = pl_loss(model->forward(xs[i]), ys[i]);
      (l / m).backward();
      loss += l.item<double>();
    }
    r.losses.push_back(loss / m);
    if (step == 0)
      for (const auto& p : model->named_parameters()) r.first_grads[p.key()] = p.value().grad().clone();
    if (clip > 0) test_util::clip_grad_norm_f64(model->parameters(), clip);
    opt.step();
  }
  for (const auto& p : model->named_parameters()) r.weights[p.key()] = p.value().detach().clone();
  return r;
}

/// The pipeline: each rank its own copy of the model (built here, in this
/// thread: the global generator), its own AdamW over its stages' parameters.
/// Each rank's parameters are merged into one result (a tied one from the
/// lowest rank holding it; they are equal: checked).
PlResult pl_pipeline(int64_t layers, torch::ScalarType dtype, int64_t ranks, PipelineSchedule schedule,
                     int64_t m, int64_t steps, double clip) {
  std::vector<models::Gpt2> models;
  for (int64_t r = 0; r < ranks; ++r) models.push_back(pl_model(layers, dtype));
  std::vector<PlResult> per_rank(static_cast<size_t>(ranks));
  const std::vector<std::string> errors =
      test_util::run_thread_ranks(ranks, [&](const std::shared_ptr<ProcessGroup>& group) {
        const int64_t r = group->rank();
        PipelineRunner pipe(group, models[r]->pipeline_pieces(kPlBlock), PipelineOptions(schedule, m));
        torch::optim::AdamW opt(pipe.parameters(), pl_adamw());
        PlResult& out = per_rank[static_cast<size_t>(r)];
        for (int64_t step = 0; step < steps; ++step) {
          opt.zero_grad();
          const torch::Tensor w = pl_batch(step);
          const torch::Tensor loss = pipe.step(w.narrow(1, 0, kPlBlock), w.narrow(1, 1, kPlBlock), pl_loss);
          out.losses.push_back(loss.item<double>());
          if (step == 0) {
            for (const auto& [name, p] : pipe.named_parameters()) out.first_grads[name] = p.grad().clone();
            out.peak_live = pipe.last_step().peak_live_microbatches;
          }
          if (clip > 0) pipe.clip_grad_norm_(clip);
          opt.step();
        }
        for (const auto& [name, p] : pipe.named_parameters()) out.weights[name] = p.detach().clone();
      });
  for (int64_t r = 0; r < ranks; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  PlResult merged;
  merged.losses = per_rank[0].losses;
  merged.peak_live.assign(per_rank[0].peak_live.size(), -1);
  for (int64_t r = 0; r < ranks; ++r) {
    const PlResult& one = per_rank[static_cast<size_t>(r)];
    EXPECT_EQ(one.losses, merged.losses) << "rank " << r << " reports another loss";
    for (size_t s = 0; s < one.peak_live.size(); ++s)
      if (one.peak_live[s] >= 0) merged.peak_live[s] = one.peak_live[s];
    for (const auto& [name, t] : one.weights) {
      if (merged.weights.count(name)) {  // tied: every holder the same, bit for bit
        EXPECT_TRUE(torch::equal(merged.weights[name], t)) << name << " differs between the ranks holding it";
        EXPECT_TRUE(torch::equal(merged.first_grads[name], one.first_grads.at(name))) << name;
        continue;
      }
      merged.weights[name] = t;
      merged.first_grads[name] = one.first_grads.at(name);
    }
  }
  return merged;
}

struct PlCase {
  int64_t layers, ranks, microbatches;
  PipelineSchedule schedule;
};

std::vector<PlCase> pl_cases() {
  std::vector<PlCase> out;
  for (const auto schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B})
    for (const int64_t layers : {2, 4})
      for (const int64_t ranks : {2, 4}) out.push_back({layers, ranks, 2 * ranks, schedule});
  // Interleaved 1F1B: 2 ranks x 2 stages each (6 pieces into 4 stages), m a multiple of p.
  out.push_back({4, 2, 4, PipelineSchedule::kInterleaved1F1B});
  return out;
}

std::string pl_name(const PlCase& c) {
  return std::string(to_string(c.schedule)) + ", " + std::to_string(c.layers) + " layers, " +
         std::to_string(c.ranks) + " ranks, " + std::to_string(c.microbatches) + " microbatches";
}

// One step in float64: every gradient a stage holds alone is one process's bit for
// bit; the tied wte's is the same sum of 2m microbatch terms added in another order.
TEST(Pipeline, FirstStepGradientsAreOneProcesssBitForBit) {
  for (const PlCase& c : pl_cases()) {
    SCOPED_TRACE(pl_name(c));
    const PlResult want = pl_reference(c.layers, torch::kFloat64, c.microbatches, 1, 0.0);
    const PlResult got = pl_pipeline(c.layers, torch::kFloat64, c.ranks, c.schedule, c.microbatches, 1, 0.0);
    ASSERT_EQ(got.first_grads.size(), want.first_grads.size());
    for (const auto& [name, g] : want.first_grads) {
      ASSERT_TRUE(got.first_grads.count(name)) << name << " is on no rank";
      if (name == "transformer.wte.weight") {
        // 2m terms (the head's and the embedding's per microbatch), each rounded
        // sum erring by eps per addition of at most the sum of |terms|.
        const double scale = test_util::max_abs(g) * 2 * static_cast<double>(c.microbatches);
        EXPECT_TRUE(test_util::near(got.first_grads.at(name), g,
                                    test_util::rounding_bound(torch::kFloat64, 2.0 * c.microbatches, scale)))
            << name;
      } else {
        EXPECT_TRUE(torch::equal(got.first_grads.at(name), g)) << name << " differs from one process's";
      }
    }
    // The same forwards on the same shapes, the microbatch losses summed in the same order in float64
    // (the all-reduce adds the other ranks' exact zeros): bitwise.
    EXPECT_EQ(got.losses[0], want.losses[0]);
  }
}

// 20 AdamW steps with the gradient clipped to norm 1: in float32 every weight
// within 1e-5 of the largest weight (the bound), in float64 within the
// same bound scaled by eps64 / eps32 (2^-29: about 1.9e-14 of it). What
// differs from one process is two reductions: the tied wte's gradient (the
// two stages' sums added, against autograd's per-microbatch adds) and the
// clip's norm (per-rank sums, then over ranks); AdamW carries their rounding
// into every later step.
TEST(Pipeline, TwentyAdamWStepsWithClippingEqualOneProcess) {
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    for (const PlCase& c : pl_cases()) {
      SCOPED_TRACE(pl_name(c) + (dtype == torch::kFloat32 ? ", float32" : ", float64"));
      const PlResult want = pl_reference(c.layers, dtype, c.microbatches, 20, 1.0);
      const PlResult got = pl_pipeline(c.layers, dtype, c.ranks, c.schedule, c.microbatches, 20, 1.0);
      double largest = 0;
      for (const auto& [name, w] : want.weights) largest = std::max(largest, test_util::max_abs(w));
      const double bound = 1e-5 * test_util::eps(dtype) / test_util::eps(torch::kFloat32) * largest;
      for (const auto& [name, w] : want.weights) {
        ASSERT_TRUE(got.weights.count(name)) << name;
        EXPECT_TRUE(test_util::near(got.weights.at(name), w, bound)) << name;
      }
      // Each step's loss at weights within the bound above: a cross-entropy moves at most twice as far as
      // its largest logit, and the logits of weights within 1e-5 relative move by the same order; the
      // issue's 1e-5 relative, applied to the loss.
      for (size_t i = 0; i < want.losses.size(); ++i)
        EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * want.losses[i]) << "step " << i;
      EXPECT_LT(want.losses.back(), want.losses.front() - 0.05);  // it trained
    }
  }
}

/// One process or the pipeline under autocast (`half`: fp16 with a GradScaler
/// whose first scale overflows, else bf16 without one), 12 AdamW steps with
/// clipping; the steps the scaler skipped, the final weights by name.
struct PlMixed {
  std::vector<bool> stepped;
  std::map<std::string, torch::Tensor> weights;
};

amp::GradScalerOptions pl_scaler_options() {
  return amp::GradScalerOptions().init_scale(std::ldexp(1.0, 24)).growth_interval(4);  // 2^24 overflows fp16
}

PlMixed pl_mixed_reference(torch::ScalarType half, int64_t m, int64_t steps) {
  models::Gpt2 model = pl_model(2, torch::kFloat32);
  torch::optim::AdamW opt(model->parameters(), pl_adamw());
  amp::GradScaler scaler(pl_scaler_options().enabled(half == torch::kHalf));
  PlMixed r;
  for (int64_t step = 0; step < steps; ++step) {
    opt.zero_grad();
    const torch::Tensor w = pl_batch(step);
    const auto xs = w.narrow(1, 0, kPlBlock).chunk(m), ys = w.narrow(1, 1, kPlBlock).chunk(m);
    for (int64_t i = 0; i < m; ++i) {
      torch::Tensor l;
      {
        amp::AutocastGuard ac(torch::kCPU, half);
        l = pl_loss(model->forward(xs[i]), ys[i]);
      }
      scaler.scale(l / m).backward();
    }
    scaler.unscale_(opt);
    test_util::clip_grad_norm_f64(model->parameters(), 1.0);
    r.stepped.push_back(scaler.step(opt));
    scaler.update();
  }
  for (const auto& p : model->named_parameters()) r.weights[p.key()] = p.value().detach().clone();
  return r;
}

PlMixed pl_mixed_pipeline(torch::ScalarType half, int64_t ranks, PipelineSchedule schedule, int64_t m,
                          int64_t steps) {
  std::vector<models::Gpt2> models;
  for (int64_t r = 0; r < ranks; ++r) models.push_back(pl_model(2, torch::kFloat32));
  std::vector<PlMixed> per_rank(static_cast<size_t>(ranks));
  const std::vector<std::string> errors =
      test_util::run_thread_ranks(ranks, [&](const std::shared_ptr<ProcessGroup>& group) {
        const int64_t r = group->rank();
        PipelineRunner pipe(group, models[r]->pipeline_pieces(kPlBlock), PipelineOptions(schedule, m));
        torch::optim::AdamW opt(pipe.parameters(), pl_adamw());
        amp::GradScaler scaler(pl_scaler_options().enabled(half == torch::kHalf));
        PlMixed& out = per_rank[static_cast<size_t>(r)];
        for (int64_t step = 0; step < steps; ++step) {
          opt.zero_grad();
          const torch::Tensor w = pl_batch(step);
          {
            amp::AutocastGuard ac(torch::kCPU, half);
            pipe.step(w.narrow(1, 0, kPlBlock), w.narrow(1, 1, kPlBlock), pl_loss,
                      scaler.scale(torch::ones({})));
          }
          scaler.unscale_(opt);
          pipe.agree_found_inf(scaler, opt);
          pipe.clip_grad_norm_(1.0);
          out.stepped.push_back(scaler.step(opt));
          scaler.update();
        }
        for (const auto& [name, p] : pipe.named_parameters()) out.weights[name] = p.detach().clone();
      });
  for (int64_t r = 0; r < ranks; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  PlMixed merged;
  merged.stepped = per_rank[0].stepped;
  for (int64_t r = 0; r < ranks; ++r) {
    EXPECT_EQ(per_rank[static_cast<size_t>(r)].stepped, merged.stepped)
        << "rank " << r << " skipped other steps";
    for (const auto& [name, t] : per_rank[static_cast<size_t>(r)].weights) merged.weights.emplace(name, t);
  }
  return merged;
}

// bf16-mixed, and fp16-mixed with loss scaling from a scale that overflows:
// over 12 steps every stage skips exactly the steps one process skips (the
// found-inf flags agreed over the pipeline). The weights are compared after
// the first step that updates them: the two sides run the same autocast
// operations on the same shapes, so their gradients differ only by the
// float32 rounding of the tied sum and of the clip's norm (a reduction over
// all P parameters), which one AdamW step carries into the update
// (tests/tolerance.py's adamw_bound: 2 eps32 P lr (1 + weight decay max |w|)).
// Later steps are not compared: a float32 difference that flips a
// half-precision rounding of an activation compounds step after step, with
// no rounding bound (measured at default dispatch: 8.2e-4 on one weight after
// 12 bf16 steps).
TEST(Pipeline, MixedPrecisionAndLossScalingEqualOneProcess) {
  for (const auto half : {torch::kBFloat16, torch::kHalf}) {
    for (const auto schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
      SCOPED_TRACE(std::string(to_string(schedule)) +
                   (half == torch::kHalf ? ", fp16 + loss scaling" : ", bf16"));
      const PlMixed want = pl_mixed_reference(half, 4, 12);
      const PlMixed got = pl_mixed_pipeline(half, 2, schedule, 4, 12);
      EXPECT_EQ(got.stepped, want.stepped);
      if (half == torch::kHalf) {
        EXPECT_FALSE(want.stepped.front()) << "the first scale (2^24) should overflow fp16 and skip the step";
        EXPECT_TRUE(want.stepped.back());
      }
      const auto first = std::find(want.stepped.begin(), want.stepped.end(), true);
      ASSERT_NE(first, want.stepped.end());
      const int64_t steps = (first - want.stepped.begin()) + 1;  // up to the first update
      const PlMixed want1 = pl_mixed_reference(half, 4, steps);
      const PlMixed got1 = pl_mixed_pipeline(half, 2, schedule, 4, steps);
      double largest = 0, parameters = 0;
      for (const auto& [name, w] : want1.weights) {
        largest = std::max(largest, test_util::max_abs(w));
        parameters += static_cast<double>(w.numel());
      }
      const double lr = pl_adamw().get_lr(), decay = pl_adamw().weight_decay();
      const double bound = 2 * test_util::eps(torch::kFloat32) * parameters * lr * (1 + decay * largest);
      ASSERT_EQ(got1.weights.size(), want1.weights.size());
      for (const auto& [name, w] : want1.weights)
        EXPECT_TRUE(test_util::near(got1.weights.at(name), w, bound)) << name;
    }
  }
}

// The activations a stage keeps at once, as the plan's simulation counts them:
// min(p - s, m) under 1F1B, m under GPipe.
TEST(Pipeline, LiveMicrobatchesPerStageAreThePlans) {
  for (const auto schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    const int64_t ranks = 4, m = 8;
    const PlResult got = pl_pipeline(4, torch::kFloat32, ranks, schedule, m, 1, 0.0);
    const PipelineStats sim = simulate_pipeline_plan(
        make_pipeline_plan(PipelinePlanOptions(schedule, static_cast<int>(ranks), static_cast<int>(m))));
    ASSERT_EQ(got.peak_live.size(), static_cast<size_t>(ranks));
    for (int64_t s = 0; s < ranks; ++s) {
      const int64_t want = schedule == PipelineSchedule::k1F1B ? std::min(ranks - s, m) : m;
      EXPECT_EQ(got.peak_live[static_cast<size_t>(s)], want) << to_string(schedule) << " stage " << s;
      EXPECT_EQ(got.peak_live[static_cast<size_t>(s)], sim.peak_live_microbatches[static_cast<size_t>(s)]);
    }
  }
}

/// Dropout 0.1, GPT-2 of 4 layers in float64, pipelined with dropout_seed
/// `seed` (1 rank: the whole model as one stage, i.e. one process): step 0's
/// loss and gradients by name (a tied one from its lowest rank).
PlResult pl_dropout_run(int64_t ranks, PipelineSchedule schedule, uint64_t seed, bool checkpoint) {
  std::vector<models::Gpt2> models;
  for (int64_t r = 0; r < ranks; ++r) {
    torch::manual_seed(0);
    models.push_back(models::Gpt2(pl_options(4).dropout(0.1)));
    models.back()->to(torch::kFloat64);
  }
  PlResult out;
  std::mutex mutex;
  test_util::on_thread_ranks(ranks, [&](const std::shared_ptr<ProcessGroup>& group) {
    PipelineRunner pipe(group, models[static_cast<size_t>(group->rank())]->pipeline_pieces(kPlBlock),
                        PipelineOptions(schedule, 4).dropout_seed(seed).checkpoint_pieces(checkpoint));
    const torch::Tensor w = pl_batch(0);
    const double loss = pipe.step(w.narrow(1, 0, kPlBlock), w.narrow(1, 1, kPlBlock), pl_loss).item<double>();
    std::lock_guard<std::mutex> lock(mutex);
    out.losses = {loss};
    for (const auto& [name, p] : pipe.named_parameters())
      if (!out.first_grads.count(name)) out.first_grads[name] = p.grad().clone();
  });
  return out;
}

// With dropout_seed, the masks are keyed by (step, microbatch, piece): GPipe
// and 1F1B on 2 and 4 ranks, and 1F1B with every piece checkpointed
// (recomputed in backward under the same seeds), give one process's loss
// bit for bit and its gradients bit for bit (the tied wte within the
// rounding of its sum, as without dropout). Another seed drops other units.
TEST(Pipeline, DropoutMasksAndCheckpointedStagesEqualOneProcess) {
  const PlResult want = pl_dropout_run(1, PipelineSchedule::kGPipe, 11, false);
  const PlResult plain = pl_reference(4, torch::kFloat64, 4, 1, 0.0);
  EXPECT_NE(want.losses[0], plain.losses[0]) << "dropout should change the loss";
  struct Case {
    int64_t ranks;
    PipelineSchedule schedule;
    bool checkpoint;
  };
  for (const Case& c : std::vector<Case>{{2, PipelineSchedule::kGPipe, false},
                                         {2, PipelineSchedule::k1F1B, false},
                                         {4, PipelineSchedule::k1F1B, false},
                                         {2, PipelineSchedule::k1F1B, true},
                                         {1, PipelineSchedule::kGPipe, true}}) {
    SCOPED_TRACE(std::string(to_string(c.schedule)) + ", " + std::to_string(c.ranks) + " ranks" +
                 (c.checkpoint ? ", checkpointed pieces" : ""));
    const PlResult got = pl_dropout_run(c.ranks, c.schedule, 11, c.checkpoint);
    EXPECT_EQ(got.losses[0], want.losses[0]);
    ASSERT_EQ(got.first_grads.size(), want.first_grads.size());
    for (const auto& [name, g] : want.first_grads) {
      if (name == "transformer.wte.weight") {
        // The tied sum of 2m = 8 microbatch terms in another order (as in the first test), scale = their
        // sum's bound.
        const double scale = test_util::max_abs(g) * 2 * 4;
        EXPECT_TRUE(test_util::near(got.first_grads.at(name), g,
                                    test_util::rounding_bound(torch::kFloat64, 8, scale)));
      } else {
        EXPECT_TRUE(torch::equal(got.first_grads.at(name), g)) << name;
      }
    }
  }
  EXPECT_NE(pl_dropout_run(2, PipelineSchedule::k1F1B, 12, false).losses[0], want.losses[0])
      << "another seed should draw other masks";
  // Each microbatch draws its own masks: four copies of one microbatch give four losses.
  torch::manual_seed(0);
  models::Gpt2 model(pl_options(2).dropout(0.1));
  std::vector<double> per_microbatch;
  test_util::on_thread_ranks(1, [&](const std::shared_ptr<ProcessGroup>& group) {
    PipelineRunner pipe(group, model->pipeline_pieces(kPlBlock),
                        PipelineOptions(PipelineSchedule::kGPipe, 4).dropout_seed(11));
    const torch::Tensor w = pl_batch(0).narrow(0, 0, kPlBatch / 4).repeat({4, 1});
    pipe.step(w.narrow(1, 0, kPlBlock), w.narrow(1, 1, kPlBlock),
              [&](const torch::Tensor& out, const torch::Tensor& target) {
                torch::Tensor l = pl_loss(out, target);
                per_microbatch.push_back(l.item<double>());
                return l;
              });
  });
  ASSERT_EQ(per_microbatch.size(), 4u);
  for (size_t i = 1; i < 4; ++i) EXPECT_NE(per_microbatch[i], per_microbatch[0]) << "microbatch " << i;
}

// A pipeline checkpointed after 3 of 6 steps (each rank its stage's
// parameters, AdamW moments and the runner's step count, in its own file)
// and resumed into freshly built models continues bit for bit, dropout masks
// included: the same weights as the run that was not interrupted.
TEST(Pipeline, ResumesFromPerStageCheckpointsBitForBit) {
  const std::string dir = ::testing::TempDir();
  const auto run = [&](int64_t from, int64_t until, bool save) {
    std::vector<models::Gpt2> models;
    for (int r = 0; r < 2; ++r) {
      torch::manual_seed(from == 0 ? 0 : 99);  // a resumed run must not depend on its initialisation
      models.push_back(models::Gpt2(pl_options(2).dropout(0.1)));
    }
    std::map<std::string, torch::Tensor> weights;
    std::mutex mutex;
    test_util::on_thread_ranks(2, [&](const std::shared_ptr<ProcessGroup>& group) {
      const int64_t r = group->rank();
      PipelineRunner pipe(group, models[static_cast<size_t>(r)]->pipeline_pieces(kPlBlock),
                          PipelineOptions(PipelineSchedule::k1F1B, 4).dropout_seed(5));
      const auto params = pipe.named_parameters();
      torch::optim::AdamW opt(pipe.parameters(), pl_adamw());
      const std::string file = dir + "/pipeline_stage_" + std::to_string(r) + ".safetensors";
      if (from > 0) {
        std::map<std::string, std::string> meta;
        std::map<std::string, torch::Tensor> saved;
        for (auto& [name, t] : train::load_safetensors(file, &meta)) saved[name] = t;
        pipe.set_steps(std::stoll(meta.at("steps")));
        torch::NoGradGuard no_grad;
        for (const auto& [name, p] : params) {
          p.copy_(saved.at(name));
          auto state = std::make_unique<torch::optim::AdamWParamState>();
          state->step(std::stoll(meta.at("adam_step")));
          state->exp_avg(saved.at("exp_avg." + name));
          state->exp_avg_sq(saved.at("exp_avg_sq." + name));
          opt.state()[p.unsafeGetTensorImpl()] = std::move(state);
        }
      }
      for (int64_t step = from; step < until; ++step) {
        opt.zero_grad();
        const torch::Tensor w = pl_batch(step);
        pipe.step(w.narrow(1, 0, kPlBlock), w.narrow(1, 1, kPlBlock), pl_loss);
        pipe.clip_grad_norm_(1.0);
        opt.step();
      }
      if (save) {
        train::NamedTensors out;
        int64_t adam_step = 0;
        for (const auto& [name, p] : params) {
          const auto& st =
              static_cast<torch::optim::AdamWParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
          out.emplace_back(name, p.detach());
          out.emplace_back("exp_avg." + name, st.exp_avg());
          out.emplace_back("exp_avg_sq." + name, st.exp_avg_sq());
          adam_step = st.step();
        }
        train::save_safetensors(
            file, out, {{"steps", std::to_string(pipe.steps())}, {"adam_step", std::to_string(adam_step)}});
      }
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& [name, p] : params) weights.emplace(name, p.detach().clone());
    });
    return weights;
  };
  const auto straight = run(0, 6, false);
  run(0, 3, true);
  const auto resumed = run(3, 6, false);
  ASSERT_EQ(resumed.size(), straight.size());
  for (const auto& [name, w] : straight) EXPECT_TRUE(torch::equal(resumed.at(name), w)) << name;
}

// Refused on every rank before any message (no rank waits for one that gave up).
/// Next-token prediction on 64 fixed windows through the Trainer (32 more
/// for validation): the plain model, or the pipeline while its stages are
/// cut (ModelParallelTraining).
class PlTrainerTask : public train::Task {
 public:
  PlTrainerTask(models::Gpt2 model, std::shared_ptr<PipelineRunner> pipe, int64_t replicas, int64_t replica,
                int64_t batch = kPlBatch)
      : model_(std::move(model)), pipe_(std::move(pipe)) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(400);
    const torch::Tensor w = torch::randint(0, kPlVocab, {96, kPlBlock + 1}, gen, torch::kLong);
    const auto dataset = [&](int64_t from, int64_t n) {
      return data::TensorDataset{w.narrow(0, from, n).narrow(1, 0, kPlBlock).contiguous(),
                                 w.narrow(0, from, n).narrow(1, 1, kPlBlock).contiguous()};
    };
    train_ = std::make_unique<data::TensorLoader>(dataset(0, 64), data::TensorLoaderOptions()
                                                                      .batch_size(batch / replicas)
                                                                      .seed(5)
                                                                      .prefetch(0)
                                                                      .num_replicas(replicas)
                                                                      .rank(replica));
    val_ = std::make_unique<data::TensorLoader>(
        dataset(64, 32), data::TensorLoaderOptions().batch_size(16).shuffle(false).prefetch(0));
  }
  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  bool backward_in_step() const override { return pipe_ && pipe_->is_cut(); }
  train::StepOutput training_backward_step(const data::Batch& b, const torch::Tensor& scale) override {
    train::StepOutput out;
    out.loss = pipe_->step(b.input, b.target, pl_loss, scale);
    return out;
  }
  train::StepOutput training_step(const data::Batch& b) override {
    train::StepOutput out;
    out.loss = pl_loss(model_->forward(b.input), b.target);
    return out;
  }
  train::StepOutput evaluation_step(const data::Batch& b) override {
    if (!backward_in_step()) return training_step(b);
    train::StepOutput out;
    out.loss = pipe_->evaluate(b.input, b.target, pl_loss);
    return out;
  }
  data::Loader& train_loader() override { return *train_; }
  data::Loader* val_loader() override { return val_.get(); }

 private:
  models::Gpt2 model_;
  std::shared_ptr<PipelineRunner> pipe_;
  std::unique_ptr<data::TensorLoader> train_, val_;
};

struct PlTrained {
  std::map<std::string, torch::Tensor> weights;  // rank 0's, whole after fit
  double val_loss = 0;
};

/// `epochs` of the Trainer (2 batches accumulated, clipped to norm 1, AdamW)
/// in `dir` on `ranks` thread ranks in `pipeline` stages of `schedule` with m
/// = `microbatches` (data parallelism over the rest; 1 rank: one process, no
/// callback), float64, 2 blocks (4 pieces); resuming from `dir` when `resume`.
PlTrained pl_trainer_run(int64_t ranks, int64_t pipeline, PipelineSchedule schedule, int64_t microbatches,
                         int64_t epochs, const std::string& dir, bool resume) {
  std::vector<models::Gpt2> models;
  for (int64_t r = 0; r < ranks; ++r) models.push_back(pl_model(2, torch::kFloat64));
  PlTrained out;
  const auto run = [&](const std::shared_ptr<ProcessGroup>& group) {
    train::TrainerOptions o;
    o.epochs(epochs).accumulate_grad_batches(2).clip_grad_norm(1.0).run_dir(dir);
    o.optimizer().kind(optim::OptimizerKind::kAdamW).lr(1e-3).weight_decay(0.1);
    if (resume) o.resume(train::ResumeFrom::latest());
    const int64_t r = group ? group->rank() : 0;
    models::Gpt2 model = models[static_cast<size_t>(r)];
    std::shared_ptr<ParallelLayout> layout;
    std::shared_ptr<PipelineRunner> pipe;
    if (group) {
      o.distribution(make_distribution(group, pipeline));
      layout = std::make_shared<ParallelLayout>(make_parallel_layout(group, pipeline, 1));
      pipe = std::make_shared<PipelineRunner>(
          layout->pipeline, model->pipeline_pieces(kPlBlock),
          PipelineOptions(schedule, microbatches).release_other_stages(false).tied_gradients_in_step(false));
    }
    PlTrainerTask task(model, pipe, layout ? layout->degrees.data : 1, layout ? layout->at.data : 0);
    train::Trainer trainer(o);
    if (pipe) trainer.add_callback(std::make_shared<ModelParallelTraining>(pipe, layout));
    const train::FitResult fit = trainer.fit(task);
    EXPECT_FALSE(pipe && pipe->is_cut()) << "whole again after fit";
    EXPECT_EQ(fit.last_train.samples, 64) << "each sample counted once, whatever the layout";
    if (r == 0) {
      for (const auto& p : model->named_parameters()) out.weights[p.key()] = p.value().detach().clone();
      out.val_loss = fit.last_val.loss;
    }
  };
  if (ranks == 1)
    run(nullptr);
  else
    test_util::on_thread_ranks(ranks, run);
  return out;
}

// Through the Trainer (ModelParallelTraining, Task::backward_in_step): 3 epochs of
// 2 steps (2 batches of 16 accumulated) at 2 stages (1F1B, interleaved 1F1B
// with 4 stages on 2 ranks) and at 2 stages x 2 replicas end within the
// float64 bound of the tests above of one process, validation through the
// stages included; the checkpoint of a run at 2 stages holds whole tensors:
// resumed at 2 stages it ends bit-identical to the run straight through (the
// other stages' weights and AdamW moments received and released again in
// between), resumed at 4 stages and in one process within the bound.
TEST(Pipeline, TheTrainerTrainsTheStagesAsOneProcessAndItsCheckpointsResumeAtAnyLayout) {
  const std::string dir = test_util::temp_dir("pl_trainer");
  const PlTrained want = pl_trainer_run(1, 1, PipelineSchedule::k1F1B, 2, 3, dir + "/one", false);
  double largest = 0;
  for (const auto& [name, t] : want.weights) largest = std::max(largest, test_util::max_abs(t));
  const double scaled = 1e-5 * test_util::eps(torch::kFloat64) / test_util::eps(torch::kFloat32);
  const auto check_near = [&](const PlTrained& got, const std::string& what) {
    ASSERT_EQ(got.weights.size(), want.weights.size()) << what;
    double worst = 0;
    for (const auto& [name, t] : want.weights) {
      EXPECT_TRUE(test_util::near(got.weights.at(name), t, scaled * largest)) << what << ": " << name;
      worst = std::max(worst, test_util::max_diff(got.weights.at(name), t));
    }
    // The bound applied to the loss, as the tests above (a cross-entropy moves at most twice as far
    // as its logits, which move by that order).
    EXPECT_NEAR(got.val_loss, want.val_loss, scaled * want.val_loss) << what;
    std::printf("[ measured ] %s: max |difference| %.2g of the largest weight (bound %.2g)\n", what.c_str(),
                worst / largest, scaled);
  };
  const PlTrained straight = pl_trainer_run(2, 2, PipelineSchedule::k1F1B, 2, 3, dir + "/straight", false);
  check_near(straight, "2 stages, 1f1b");
  check_near(pl_trainer_run(2, 2, PipelineSchedule::kInterleaved1F1B, 2, 3, dir + "/interleaved", false),
             "4 stages on 2 ranks, interleaved 1f1b");
  check_near(pl_trainer_run(4, 2, PipelineSchedule::k1F1B, 2, 3, dir + "/data", false),
             "2 stages x 2 replicas");
  pl_trainer_run(2, 2, PipelineSchedule::k1F1B, 2, 1, dir + "/half", false);
  for (const char* copy : {"half1", "half4"})
    ASSERT_EQ(std::system(("cp -r '" + dir + "/half' '" + dir + "/" + copy + "'").c_str()), 0);
  const PlTrained resumed = pl_trainer_run(2, 2, PipelineSchedule::k1F1B, 2, 3, dir + "/half", true);
  for (const auto& [name, t] : straight.weights)
    EXPECT_TRUE(torch::equal(resumed.weights.at(name), t)) << name;
  EXPECT_EQ(resumed.val_loss, straight.val_loss);
  check_near(pl_trainer_run(4, 4, PipelineSchedule::k1F1B, 4, 3, dir + "/half4", true),
             "2 stages resumed at 4 stages");
  check_near(pl_trainer_run(1, 1, PipelineSchedule::k1F1B, 2, 3, dir + "/half1", true),
             "2 stages resumed in one process");
  const PlTrained moved = pl_trainer_run(1, 1, PipelineSchedule::k1F1B, 2, 1, dir + "/start", false);
  double step = 0;
  for (const auto& [name, t] : want.weights)
    step = std::max(step, test_util::max_diff(moved.weights.at(name), t));
  EXPECT_GT(step, 100 * scaled * largest) << "epochs 2 and 3 must move the weights beyond the bound";
}

// fp16-mixed through the Trainer from a loss scale that overflows (2^24): the
// Trainer's scale reaches the last stage's backward (training_backward_step's
// gradient_scale), and over 12 steps the 2 stages skip exactly the steps one
// process skips that runs the same microbatches (8 samples, 4 accumulated,
// against 16 split in 2, 2 accumulated: the same autocast operations on the
// same shapes), on every rank; the weights after it are not compared (see
// MixedPrecisionAndLossScalingEqualOneProcess: a half-precision rounding
// flipped by the tied sum's float32 order compounds).
TEST(Pipeline, TheTrainersLossScaleReachesTheStagesAndEveryRankSkipsAlike) {
  const std::string dir = test_util::temp_dir("pl_fp16");
  const auto options = [&](int64_t accumulate, const std::string& run) {
    train::TrainerOptions o;
    o.epochs(6).accumulate_grad_batches(accumulate).clip_grad_norm(1.0).run_dir(dir + run).val_every(0);
    o.precision(amp::Precision::kFp16Mixed).grad_scaler(amp::GradScalerOptions().init_scale(16777216.0));
    o.optimizer().kind(optim::OptimizerKind::kAdamW).lr(1e-3).weight_decay(0.1);
    return o;
  };
  models::Gpt2 plain = pl_model(2, torch::kFloat32);
  PlTrainerTask reference(plain, nullptr, 1, 0, 8);
  train::Trainer one(options(4, "/one"));
  const train::FitResult want = one.fit(reference);
  ASSERT_EQ(want.steps, 12);
  EXPECT_GT(want.skipped_steps, 0) << "2^24 must overflow at first";
  EXPECT_LT(want.skipped_steps, want.steps) << "the scale must come down to one that fits";
  std::vector<models::Gpt2> models = {pl_model(2, torch::kFloat32), pl_model(2, torch::kFloat32)};
  std::vector<int64_t> skipped(2, -1);
  test_util::on_thread_ranks(2, [&](const std::shared_ptr<ProcessGroup>& group) {
    const auto r = static_cast<size_t>(group->rank());
    train::TrainerOptions o = options(2, "/pipeline");
    o.distribution(make_distribution(group, 2));
    auto layout = std::make_shared<ParallelLayout>(make_parallel_layout(group, 2, 1));
    auto pipe = std::make_shared<PipelineRunner>(layout->pipeline, models[r]->pipeline_pieces(kPlBlock),
                                                 PipelineOptions(PipelineSchedule::k1F1B, 2)
                                                     .release_other_stages(false)
                                                     .tied_gradients_in_step(false));
    PlTrainerTask task(models[r], pipe, 1, 0);
    train::Trainer trainer(o);
    trainer.add_callback(std::make_shared<ModelParallelTraining>(pipe, layout));
    skipped[r] = trainer.fit(task).skipped_steps;
  });
  EXPECT_EQ(skipped[0], want.skipped_steps);
  EXPECT_EQ(skipped[1], want.skipped_steps);
}

// A batch the microbatches do not divide (an epoch's short last batch): 16
// samples in 3 microbatches (6, 5, 5) and 3 samples in 4 (one empty) give
// the gradients of the batch's mean loss, float64, 2 stages: within the
// rounding of one process's sums (the weighted losses add in another order),
// as the first-step test bounds the tied wte's.
TEST(Pipeline, UnevenAndEmptyMicrobatchesGiveTheBatchsMeanLoss) {
  for (const auto& [samples, m] : std::vector<std::pair<int64_t, int64_t>>{{16, 3}, {3, 4}}) {
    SCOPED_TRACE(std::to_string(samples) + " samples in " + std::to_string(m) + " microbatches");
    const torch::Tensor w = pl_batch(0).narrow(0, 0, samples);
    const torch::Tensor x = w.narrow(1, 0, kPlBlock), y = w.narrow(1, 1, kPlBlock);
    models::Gpt2 plain = pl_model(2, torch::kFloat64);
    const torch::Tensor want_loss = pl_loss(plain->forward(x), y);
    want_loss.backward();
    std::map<std::string, torch::Tensor> want;
    for (const auto& p : plain->named_parameters()) want[p.key()] = p.value().grad();
    std::vector<models::Gpt2> models = {pl_model(2, torch::kFloat64), pl_model(2, torch::kFloat64)};
    std::vector<std::map<std::string, torch::Tensor>> got(2);
    std::vector<double> losses(2);
    test_util::on_thread_ranks(2, [&](const std::shared_ptr<ProcessGroup>& group) {
      const auto r = static_cast<size_t>(group->rank());
      PipelineRunner pipe(group, models[r]->pipeline_pieces(kPlBlock),
                          PipelineOptions(PipelineSchedule::k1F1B, m));
      losses[r] = pipe.step(x, y, pl_loss).item<double>();
      for (const auto& [name, p] : pipe.named_parameters()) got[r][name] = p.grad();
    });
    for (const auto& [name, g] : want) {
      const torch::Tensor& mine = got[0].count(name) ? got[0].at(name) : got[1].at(name);
      // Each gradient element: a sum over the batch's tokens (N T terms), here of m weighted partial sums.
      const double n = static_cast<double>(samples * kPlBlock + m);
      EXPECT_TRUE(
          test_util::near(mine, g, test_util::rounding_bound(torch::kFloat64, 2 * n, test_util::max_abs(g))))
          << name;
    }
    for (const double l : losses)
      EXPECT_NEAR(
          l, want_loss.item<double>(),
          test_util::rounding_bound(torch::kFloat64, 2.0 * static_cast<double>(samples * kPlBlock + m),
                                    want_loss.item<double>()));
  }
}

TEST(Pipeline, TooFewMicrobatchesAndTooFewPiecesAreRefused) {
  std::vector<models::Gpt2> models;
  for (int r = 0; r < 4; ++r) models.push_back(pl_model(2, torch::kFloat32));
  std::vector<std::string> errors =
      test_util::run_thread_ranks(4, [&](const std::shared_ptr<ProcessGroup>& group) {
        PipelineRunner pipe(group, models[group->rank()]->pipeline_pieces(kPlBlock),
                            PipelineOptions(PipelineSchedule::k1F1B, 2));
      });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("1f1b with 4 stages needs at least 4 microbatches per step, got 2"), std::string::npos)
        << e;
  // Six pieces (embedding, 4 blocks, head) split over 8 stages: refused by name.
  errors = test_util::run_thread_ranks(1, [&](const std::shared_ptr<ProcessGroup>& group) {
    PipelineRunner pipe(group, models[0]->pipeline_pieces(kPlBlock),
                        PipelineOptions(PipelineSchedule::kInterleaved1F1B, 8).stages_per_rank(8));
  });
  EXPECT_NE(errors[0].find("8 stages (1 ranks x 8 per rank) need at least 8 pieces, the model has 4"),
            std::string::npos)
      << errors[0];
}

}  // namespace
}  // namespace ember::dist
