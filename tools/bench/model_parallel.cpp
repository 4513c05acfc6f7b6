// Model parallelism: what each rank holds and how long it waits, for one
// setting of GPT-2 training: one process, a pipeline (dist::PipelineRunner,
// GPipe or 1F1B over p stages, m microbatches) or tensor parallelism
// (dist::Gpt2TensorParallel at degree t, with or without sequence
// parallelism), counted by LibTorch's CPU allocator (core::MemoryMeter: one
// meter per process, hence one process per rank). One rank of the benchmark:
// tools/bench/model_parallel.py starts WORLD_SIZE of them per setting (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them) and puts the
// settings side by side; rank 0 prints this setting's table per rank and a
// last line of JSON.
//
//   ember_bench_model_parallel --mode single|pipeline|tensor [--schedule gpipe|1f1b]
//                              [--microbatches M] [--sequence-parallel 0|1]
//                              [--layers L] [--embd C] [--heads H] [--context T] [--vocab V]
//                              [--batch B] [--steps S] [--threads N]
//
// Model: models::Gpt2 (n_layer L, n_embd C, n_head H, n_positions T,
// vocab_size V, no dropout), built whole on every rank from the same seed,
// then cut: the pipeline frees the parameters of the other ranks' stages
// (PipelineOptions::release_other_stages, on by default), tensor
// parallelism cuts them in place to this rank's part. The same batch of B
// random token sequences on every rank (T tokens and the next ones), fp32,
// AdamW (LibTorch's, lr 1e-3) on this rank's parameters, gradient clipping
// at 1.0 over the whole model, S steps (default 5): the bytes and the live
// microbatches are of the last one (the same in every step after the first),
// the times and idle shares the median over the steps after the first (each
// started together: a barrier before it).
// Per rank:
//   parameters  bytes of the parameters this rank steps (pipeline: its
//               stage's, GPT-2's tied wte on the first and the last stage;
//               tensor: its parts)
//   gradients   bytes of their gradients (kept between steps: zero_grad
//               without set_to_none, so they count in resident, not above)
//   optimizer   optim::optimizer_state_bytes (AdamW's two moments)
//   resident    bytes held by tensors allocated since the meter started
//               (before the model was built) just before the step: the
//               parameters the model object still holds (the check that the
//               other stages' are gone), the gradients, the optimizer state
//               and the batch
//   above       the step's peak minus resident: activations kept for
//               backward, messages in flight, and the transients of the
//               forward, the backward, the clip and the optimizer step
//   step        the step's wall time on this rank (zero_grad to opt.step),
//               the median over the steps after the first
//   loss        the last step's mean loss (every rank's; equal across the
//               settings up to float rounding: they train the same model)
// Pipeline, per stage (one stage per rank), measured against the plan's
// (simulate_pipeline_plan, every forward costing 1 and backward 2, messages
// free):
//   live        PipelineStepStats::peak_live_microbatches: the most
//               microbatches whose activations the stage kept at once
//               (plan: m under GPipe, min(p - s, m) under 1F1B)
//   idle        1 - compute_seconds / step_seconds of PipelineRunner::step
//               on this rank: waits for receives, sends, the tied-gradient
//               exchange and the loss all-reduce (plan: (p - 1)/(m + p - 1)
//               on every stage, with equal stages and free messages; and,
//               as [costs], 1 - m c_s / (sum c + (m - 1) max c) with c_s
//               the stage's FLOPs as the split made it: the embedding is
//               light and the head heavy, so whole pieces rarely split evenly;
//               exact for GPipe with backward = 2 x forward and free
//               messages, an estimate for 1F1B)
//   sent        messages and bytes this rank sent in the step
//
// Times: every rank runs --threads intra-op threads, so N ranks use N times
// the cores of one process until the machine runs out (the 2-core
// development machine gives 2 ranks twice one process's cores, and 4 ranks
// the same 2 cores: a rank's compute slows while another computes, and the
// measured idle share includes the messages' cost over Gloo). Read the times
// and the idle shares as directions, the bytes as exact. The meter is on
// during the timed step (a lock per allocation), in every setting alike.
#include <ember/ember.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {
using namespace ember;
using Clock = std::chrono::steady_clock;

enum class Mode { kSingle, kPipeline, kTensor };

struct Args {
  Mode mode = Mode::kSingle;
  dist::PipelineSchedule schedule = dist::PipelineSchedule::k1F1B;
  int64_t microbatches = 8;
  bool sequence_parallel = false;
  int64_t layers = 8, embd = 256, heads = 8, context = 64, vocab = 4096, batch = 16, steps = 5, threads = 1;
};

// What one rank measured in the last step; gathered as one row of doubles.
struct RankRow {
  double parameters = 0, gradients = 0, optimizer = 0, model_bytes = 0, resident = 0, above = 0, step = 0;
  // Pipeline only (else 0, -1 for the stage).
  double stage = -1, live = 0, runner_step = 0, compute = 0, idle = 0, messages = 0, bytes_sent = 0;

  static constexpr int kFields = 14;
  std::vector<double> pack() const {
    return {parameters, gradients, optimizer,   model_bytes, resident, above,    step,
            stage,      live,      runner_step, compute,     idle,     messages, bytes_sent};
  }
  static RankRow unpack(const torch::Tensor& v) {
    const auto at = [&v](int i) { return v[i].item<double>(); };
    RankRow r;
    r.parameters = at(0), r.gradients = at(1), r.optimizer = at(2), r.model_bytes = at(3);
    r.resident = at(4), r.above = at(5), r.step = at(6), r.stage = at(7), r.live = at(8);
    r.runner_step = at(9), r.compute = at(10), r.idle = at(11), r.messages = at(12), r.bytes_sent = at(13);
    return r;
  }
};

// The upper median (sharding.cpp's): of the timed steps, the slow side of the middle.
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int64_t bytes_of(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors)
    if (t.defined()) n += static_cast<int64_t>(t.nbytes());
  return n;
}

int64_t grad_bytes_of(const std::vector<torch::Tensor>& parameters) {
  int64_t n = 0;
  for (const auto& p : parameters)
    if (p.grad().defined()) n += static_cast<int64_t>(p.grad().nbytes());
  return n;
}

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
}

std::string mib(double b) {
  return fmt::format("{:.2f} MiB", b / (1 << 20));
}

std::string setting_name(const Args& a, int64_t ranks) {
  switch (a.mode) {
    case Mode::kSingle:
      return "one process";
    case Mode::kPipeline:
      return fmt::format("pipeline {} {}", ranks, dist::to_string(a.schedule));
    case Mode::kTensor:
      return fmt::format("tensor {}{}", ranks, a.sequence_parallel ? " +SP" : "");
  }
  return "";
}

std::string json_list(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", v[i]);
  return s + "]";
}

int parse_args(int argc, char** argv, Args& a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") {
      if (v == "single")
        a.mode = Mode::kSingle;
      else if (v == "pipeline")
        a.mode = Mode::kPipeline;
      else if (v == "tensor")
        a.mode = Mode::kTensor;
      else {
        std::fprintf(stderr, "--mode: single, pipeline or tensor, not %s\n", v.c_str());
        return 2;
      }
      continue;
    }
    if (k == "--schedule") {
      try {
        a.schedule = dist::parse_pipeline_schedule(v);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "--schedule: %s\n", e.what());
        return 2;
      }
      continue;
    }
    int64_t n = 0;
    try {
      n = std::stoll(v);
    } catch (const std::exception&) {
      std::fprintf(stderr, "%s: expected an integer, got %s\n", k.c_str(), v.c_str());
      return 2;
    }
    if (k == "--microbatches")
      a.microbatches = n;
    else if (k == "--sequence-parallel")
      a.sequence_parallel = n != 0;
    else if (k == "--layers")
      a.layers = n;
    else if (k == "--embd")
      a.embd = n;
    else if (k == "--heads")
      a.heads = n;
    else if (k == "--context")
      a.context = n;
    else if (k == "--vocab")
      a.vocab = n;
    else if (k == "--batch")
      a.batch = n;
    else if (k == "--steps")
      a.steps = n;
    else if (k == "--threads")
      a.threads = n;
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "%s needs a value\n", argv[argc - 1]);
    return 2;
  }
  if (a.steps < 2) {
    std::fprintf(stderr, "--steps: at least 2 (the first allocates the gradients and the optimizer state)\n");
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const int rc = parse_args(argc, argv, a)) return rc;
  try {
    at::set_num_threads(static_cast<int>(a.threads));
    auto group = dist::ProcessGroup::create(dist::launch_env(), {});
    const int64_t rank = group->rank(), world = group->size();
    const bool speak = rank == 0;
    if (a.mode == Mode::kSingle && world != 1)
      throw std::runtime_error(fmt::format("--mode single runs on one rank, WORLD_SIZE is {}", world));

    // Started before the model is built: its parameters count, and freeing
    // the other stages' lowers the count.
    core::MemoryMeter meter(torch::kCPU);
    torch::manual_seed(7);  // the same whole model on every rank
    models::Gpt2 model(models::Gpt2Options()
                           .vocab_size(a.vocab)
                           .n_positions(a.context)
                           .n_layer(a.layers)
                           .n_head(a.heads)
                           .n_embd(a.embd));
    torch::manual_seed(1);  // the same batch on every rank
    const torch::Tensor tokens = torch::randint(0, a.vocab, {a.batch, a.context + 1});
    const torch::Tensor x = tokens.narrow(1, 0, a.context).contiguous(),
                        y = tokens.narrow(1, 1, a.context).contiguous();

    // This rank's part of the model and its forward + backward + clip.
    std::unique_ptr<dist::PipelineRunner> pipe;
    std::unique_ptr<dist::Gpt2TensorParallel> tp;
    std::vector<std::string> piece_names;  // the pipeline's pieces, in order (embedding, h.0, ..., head)
    std::vector<double> piece_costs;       // and their forward FLOPs per token (PipelinePiece::cost)
    std::vector<torch::Tensor> parameters;
    std::function<double()> forward_backward;  // returns the batch's mean loss
    switch (a.mode) {
      case Mode::kSingle: {
        parameters = model->parameters();
        forward_backward = [&] {
          const torch::Tensor loss = cross_entropy(model->forward(x), y);
          loss.backward();
          torch::nn::utils::clip_grad_norm_(parameters, 1.0);
          return loss.item<double>();
        };
        break;
      }
      case Mode::kPipeline: {
        std::vector<core::PipelinePiece> pieces = model->pipeline_pieces(a.context);
        for (const auto& p : pieces) {
          piece_names.push_back(p.name);
          piece_costs.push_back(p.cost);
        }
        pipe = std::make_unique<dist::PipelineRunner>(group, std::move(pieces),
                                                      dist::PipelineOptions(a.schedule, a.microbatches));
        parameters = pipe->parameters();
        forward_backward = [&] {
          const torch::Tensor loss = pipe->step(x, y, cross_entropy);
          pipe->clip_grad_norm_(1.0);
          return loss.item<double>();
        };
        break;
      }
      case Mode::kTensor: {
        tp = std::make_unique<dist::Gpt2TensorParallel>(
            model, group, dist::TensorParallelOptions().sequence_parallel(a.sequence_parallel));
        parameters = model->parameters();
        forward_backward = [&] {
          const torch::Tensor loss = tp->loss(x, y);
          loss.backward();
          tp->finish_gradients();
          tp->clip_grad_norm_(1.0);
          return loss.item<double>();
        };
        break;
      }
    }
    torch::optim::AdamW opt(parameters, torch::optim::AdamWOptions(1e-3));

    RankRow mine;
    double loss = 0;  // the last step's (the same on every rank)
    std::vector<double> seconds, runner_seconds, compute_seconds, idle;  // per step after the first
    for (int64_t step = 0; step < a.steps; ++step) {
      const bool last = step + 1 == a.steps;
      // Gradients stay allocated (zeroed) from the first step on: resident, not above.
      opt.zero_grad(/*set_to_none=*/false);
      if (step > 0) group->barrier();  // the ranks start each timed step together
      if (last) {
        mine.resident = static_cast<double>(meter.current());
        meter.reset_peak();
      }
      const auto t0 = Clock::now();
      loss = forward_backward();
      opt.step();
      if (step > 0) {
        seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        if (pipe) {
          const dist::PipelineStepStats& st = pipe->last_step();
          runner_seconds.push_back(st.step_seconds);
          compute_seconds.push_back(st.compute_seconds);
          idle.push_back(st.step_seconds > 0 ? 1.0 - st.compute_seconds / st.step_seconds : 0.0);
        }
      }
      if (last) mine.above = static_cast<double>(meter.peak()) - mine.resident;
    }
    mine.step = median(seconds);
    mine.parameters = static_cast<double>(bytes_of(parameters));
    mine.gradients = static_cast<double>(grad_bytes_of(parameters));
    mine.optimizer = static_cast<double>(optim::optimizer_state_bytes(opt));
    mine.model_bytes = static_cast<double>(bytes_of(model->parameters()));

    // The plan's expectations: per stage (live) and per rank (idle).
    std::vector<double> plan_live, plan_idle, cost_share, cost_idle;
    std::vector<std::string> stage_pieces;  // per stage: "embedding..h.2"
    if (pipe) {
      // The plan assumes equal stages; the split cannot make them equal (whole
      // pieces, a light embedding, a heavy head). With each stage's cost c_s
      // (its pieces' FLOPs), backward = 2 x forward and free messages, a
      // fill-drain of m identical microbatches takes sum(c) + (m - 1) max(c)
      // per direction (a flow shop), so stage s idles
      // 1 - m c_s / (sum(c) + (m - 1) max(c)): (p - 1)/(m + p - 1) when equal.
      // Exact for GPipe under those assumptions; for 1F1B an estimate.
      std::vector<double> stage_cost;
      for (const auto& [b, e] : pipe->split()) {
        stage_pieces.push_back(piece_names[static_cast<size_t>(b)] +
                               (e - b > 1 ? ".." + piece_names[static_cast<size_t>(e - 1)] : std::string()));
        double c = 0;
        for (int i = b; i < e; ++i) c += piece_costs[static_cast<size_t>(i)];
        stage_cost.push_back(c);
      }
      double sum = 0, most = 0;
      for (const double c : stage_cost) {
        sum += c;
        most = std::max(most, c);
      }
      const double m = static_cast<double>(a.microbatches);
      for (const double c : stage_cost) {
        cost_share.push_back(c / sum);
        cost_idle.push_back(1.0 - m * c / (sum + (m - 1) * most));
      }
      const std::vector<int> stages = pipe->local_stages();
      if (stages.size() != 1)
        throw std::runtime_error(
            fmt::format("rank {} runs {} stages, this bench expects one", rank, stages.size()));
      const dist::PipelineStepStats& st = pipe->last_step();
      mine.stage = stages.front();
      mine.live = st.peak_live_microbatches[static_cast<size_t>(stages.front())];
      mine.runner_step = median(runner_seconds);
      mine.compute = median(compute_seconds);
      mine.idle = median(idle);
      mine.messages = static_cast<double>(st.messages_sent);
      mine.bytes_sent = static_cast<double>(st.bytes_sent);
      const dist::PipelineStats sim = dist::simulate_pipeline_plan(pipe->plan());
      for (const int l : sim.peak_live_microbatches) plan_live.push_back(l);
      plan_idle = sim.idle_fraction;
    }

    // Every rank's row, on every rank (an all-reduce of rows that only their rank fills).
    torch::Tensor all = torch::zeros({world, RankRow::kFields}, torch::kFloat64);
    all[rank].copy_(torch::tensor(mine.pack(), torch::kFloat64));
    group->all_reduce_sum_(all);
    std::vector<RankRow> rows;
    for (int64_t r = 0; r < world; ++r) rows.push_back(RankRow::unpack(all[r]));

    if (speak) {
      const std::string name = setting_name(a, world);
      const double p = static_cast<double>(world), m = static_cast<double>(a.microbatches);
      const double formula = (p - 1) / (m + p - 1);
      std::printf(
          "GPT-2 n_layer %lld, n_embd %lld, n_head %lld, context %lld, vocab %lld, batch %lld, AdamW, fp32; "
          "%s (%lld ranks, Gloo, CPU, %lld threads each); loss of the last step %.6f\n",
          (long long)a.layers, (long long)a.embd, (long long)a.heads, (long long)a.context,
          (long long)a.vocab, (long long)a.batch, name.c_str(), (long long)world, (long long)a.threads, loss);
      std::printf("%-4s %-5s %-16s %12s %12s %12s %12s %12s %10s", "rank", "stage", "pieces", "parameters",
                  "gradients", "optimizer", "resident", "above", "step");
      if (pipe)
        std::printf(" | %11s %22s %9s %10s", "live (plan)", "idle (plan) [costs]", "messages", "sent");
      std::printf("\n");
      for (int64_t r = 0; r < world; ++r) {
        const RankRow& row = rows[static_cast<size_t>(r)];
        std::string pieces = "all";
        if (pipe)
          pieces = stage_pieces[static_cast<size_t>(row.stage)];
        else if (tp)
          pieces = fmt::format("part {}/{}", r + 1, world);
        std::printf("%-4lld %-5s %-16s %12s %12s %12s %12s %12s %7.1f ms", (long long)r,
                    pipe ? std::to_string(static_cast<int>(row.stage)).c_str() : "-", pieces.c_str(),
                    mib(row.parameters).c_str(), mib(row.gradients).c_str(), mib(row.optimizer).c_str(),
                    mib(row.resident).c_str(), mib(row.above).c_str(), row.step * 1e3);
        if (pipe) {
          const size_t s = static_cast<size_t>(row.stage);
          std::printf(" | %4d (%4d) %6.3f (%5.3f) [%5.3f] %9.0f %10s", static_cast<int>(row.live),
                      static_cast<int>(plan_live[s]), row.idle, plan_idle[static_cast<size_t>(r)],
                      cost_idle[s], row.messages, mib(row.bytes_sent).c_str());
        }
        std::printf("\n");
      }
      if (pipe)
        std::printf(
            "(plan: simulate_pipeline_plan, equal stages and free messages: (p - 1)/(m + p - 1) = %.3f; "
            "[costs]: the stages' FLOPs as split, 1 - m c_s / (sum c + (m - 1) max c))\n",
            formula);
      for (const RankRow& row : rows)
        if (row.model_bytes > row.parameters)
          std::printf(
              "note: the model still holds %s of parameters beyond this rank's %s "
              "(other stages' not released?)\n",
              mib(row.model_bytes).c_str(), mib(row.parameters).c_str());

      std::string json = fmt::format(
          "{{\"setting\": \"{}\", \"mode\": \"{}\", \"ranks\": {}, \"schedule\": \"{}\", \"microbatches\": "
          "{}, "
          "\"sequence_parallel\": {}, \"layers\": {}, \"embd\": {}, \"heads\": {}, \"context\": {}, "
          "\"vocab\": {}, \"batch\": {}, \"steps\": {}, \"threads\": {}, \"loss\": {:.9g}",
          name,
          a.mode == Mode::kSingle     ? "single"
          : a.mode == Mode::kPipeline ? "pipeline"
                                      : "tensor",
          world, pipe ? dist::to_string(a.schedule) : "", pipe ? a.microbatches : 0,
          a.sequence_parallel && tp ? "true" : "false", a.layers, a.embd, a.heads, a.context, a.vocab,
          a.batch, a.steps, a.threads, loss);
      if (pipe) {
        std::string names;
        for (size_t i = 0; i < stage_pieces.size(); ++i)
          names += fmt::format("{}\"{}\"", i ? ", " : "", stage_pieces[i]);
        json += fmt::format(
            ", \"plan\": {{\"live\": {}, \"idle\": {}, \"idle_formula\": {:.6f}, \"stage_pieces\": [{}], "
            "\"cost_share\": {}, \"idle_costs\": {}}}",
            json_list(plan_live), json_list(plan_idle), formula, names, json_list(cost_share),
            json_list(cost_idle));
      }
      json += ", \"rows\": [";
      for (size_t i = 0; i < rows.size(); ++i) {
        const RankRow& r = rows[i];
        json += fmt::format(
            "{}{{\"rank\": {}, \"parameters\": {}, \"gradients\": {}, \"optimizer\": {}, \"model_bytes\": "
            "{}, "
            "\"resident\": {}, \"above\": {}, \"step_s\": {:.6f}",
            i ? ", " : "", i, r.parameters, r.gradients, r.optimizer, r.model_bytes, r.resident, r.above,
            r.step);
        if (pipe)
          json += fmt::format(
              ", \"stage\": {}, \"live\": {}, \"runner_step_s\": {:.6f}, \"compute_s\": {:.6f}, \"idle\": "
              "{:.6f}, "
              "\"messages\": {}, \"bytes_sent\": {}",
              r.stage, r.live, r.runner_step, r.compute, r.idle, r.messages, r.bytes_sent);
        json += "}";
      }
      std::printf("%s]}\n", json.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
