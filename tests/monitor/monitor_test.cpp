// Monitoring: step-time breakdown, records and their writers, MFU, the
// progress line and the profiler's trace, on the CPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../train/test_task.h"

namespace ember {
namespace {

using monitor::Record;
using test_util::BlobTask;
using train::StepPhase;
using Clock = std::chrono::steady_clock;

void sleep_ms(double ms) { std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(ms * 1000))); }

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

/// Keeps every record it is given.
struct Capture : monitor::MetricsWriter {
  void write(const Record& r) override { records.push_back(r); }
  std::vector<Record> records;
  std::vector<Record> of(const std::string& kind) const {
    std::vector<Record> out;
    for (const auto& r : records)
      if (r.kind == kind) out.push_back(r);
    return out;
  }
};

/// A loader that sleeps before each batch: a slow input pipeline.
class SlowLoader : public data::Loader {
 public:
  SlowLoader(data::Loader& inner, double ms) : inner_(inner), ms_(ms) {}
  int64_t num_batches() const override { return inner_.num_batches(); }
  int64_t num_samples() const override { return inner_.num_samples(); }
  void start_epoch(int64_t epoch, int64_t skip) override { inner_.start_epoch(epoch, skip); }
  std::optional<data::Batch> next() override {
    sleep_ms(ms_);
    return inner_.next();
  }

 private:
  data::Loader& inner_;
  double ms_;
};

/// BlobTask with a slow loader and a slow forward pass.
class SlowTask : public train::Task {
 public:
  SlowTask(double data_ms, double forward_ms)
      : inner_(BlobTask::Options{.samples = 256, .batch_size = 32}), loader_(inner_.train_loader(), data_ms),
        forward_ms_(forward_ms) {}
  std::shared_ptr<torch::nn::Module> model() override { return inner_.model(); }
  train::StepOutput training_step(const data::Batch& b) override {
    sleep_ms(forward_ms_);
    return inner_.training_step(b);
  }
  data::Loader& train_loader() override { return loader_; }
  data::Loader* val_loader() override { return inner_.val_loader(); }

 private:
  BlobTask inner_;
  SlowLoader loader_;
  double forward_ms_;
};

/// Wall-clock time of every step end, measured apart from the monitor.
struct StepClock : train::Callback {
  std::string name() const override { return "step_clock"; }
  void on_epoch_start(train::Trainer&, int64_t) override { ends.emplace_back(); }
  void on_step_end(train::Trainer&, const train::StepInfo&) override { ends.back().push_back(Clock::now()); }
  std::vector<std::vector<Clock::time_point>> ends;  // per epoch
};

monitor::MonitorOptions quiet_options() {
  monitor::MonitorOptions o;
  o.run_dir = "";
  o.peak_flops = -1;  // no CPU peak measurement in most tests
  o.stream = std::tmpfile();
  return o;
}

std::string read_stream(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}

TEST(StepTimer, HostClockSumsPhasesAndCountsSteps) {
  monitor::StepTimer timer(torch::kCPU);
  EXPECT_FALSE(timer.uses_device_events());
  for (int step = 0; step < 3; ++step) {
    timer.mark(StepPhase::kData);
    sleep_ms(4);
    timer.mark(StepPhase::kForward);
    sleep_ms(8);
    timer.mark(StepPhase::kBackward);
    sleep_ms(2);
    timer.mark(StepPhase::kOptimizer);
    sleep_ms(1);
    timer.mark(StepPhase::kCallbacks);
    sleep_ms(1);
  }
  timer.pause();
  sleep_ms(30);  // validation: not counted
  const monitor::StepTimes t = timer.take(/*wait=*/true);
  EXPECT_EQ(t.steps, 3);
  // Sleeps last at least as long as asked; allow generous scheduling slack above.
  EXPECT_GE(t.mean_ms(StepPhase::kData), 4.0);
  EXPECT_LT(t.mean_ms(StepPhase::kData), 4.0 + 3.0);
  EXPECT_GE(t.mean_ms(StepPhase::kForward), 8.0);
  EXPECT_LT(t.mean_ms(StepPhase::kForward), 8.0 + 3.0);
  EXPECT_GE(t.mean_ms(StepPhase::kCallbacks), 1.0);
  EXPECT_LT(t.mean_ms(StepPhase::kCallbacks), 1.0 + 3.0);
  EXPECT_LT(t.mean_step_ms(), 16.0 + 10.0);  // the 30 ms after pause() is not in it
  EXPECT_NEAR(t.share(StepPhase::kForward), t.mean_ms(StepPhase::kForward) / t.mean_step_ms(), 1e-12);
  const monitor::StepTimes empty = timer.take(true);
  EXPECT_EQ(empty.steps, 0);
  EXPECT_EQ(empty.total_ms(), 0.0);
}

TEST(Monitor, StepBreakdownAddsUpToTheMeasuredStepTime) {
  SlowTask task(/*data_ms=*/6, /*forward_ms=*/3);
  auto o = quiet_options();
  o.log_every = 2;
  o.data_wait_warning = 0.3;
  auto capture = std::make_shared<Capture>();
  auto mon = std::make_shared<monitor::Monitor>(o);
  mon->add_writer(capture);
  auto clock = std::make_shared<StepClock>();
  train::TrainerOptions to;
  to.epochs = 2;
  to.progress = false;
  to.handle_signals = false;
  to.optimizer.lr = 0.05;
  train::Trainer trainer(to);
  trainer.add_callback(clock).add_callback(mon);
  trainer.fit(task);

  const auto steps = capture->of("step");
  ASSERT_EQ(steps.size(), 8u);  // 8 batches per epoch, a record every 2 steps, 2 epochs
  double monitored_ms = 0;
  int64_t monitored_steps = 0;
  for (const auto& r : steps) {
    double parts = 0;
    for (const char* k : {"data_ms", "forward_ms", "backward_ms", "optimizer_ms", "other_ms"}) parts += r.get(k);
    EXPECT_NEAR(parts, r.get("step_ms"), 1e-6 * r.get("step_ms"));
    EXPECT_GE(r.get("data_ms"), 6.0) << "the loader sleeps 6 ms per batch";
    EXPECT_GE(r.get("forward_ms"), 3.0) << "the forward sleeps 3 ms";
    monitored_ms += r.get("step_ms") * 2;
    monitored_steps += 2;
  }
  // Independent clock: the time between consecutive step ends, within each
  // epoch (the first step of an epoch has no predecessor in it).
  double wall_ms = 0;
  int64_t wall_steps = 0;
  for (const auto& epoch : clock->ends)
    for (size_t i = 1; i < epoch.size(); ++i, ++wall_steps)
      wall_ms += std::chrono::duration<double, std::milli>(epoch[i] - epoch[i - 1]).count();
  const double wall_mean = wall_ms / static_cast<double>(wall_steps);
  const double monitored_mean = monitored_ms / static_cast<double>(monitored_steps);
  EXPECT_NEAR(monitored_mean, wall_mean, 0.1 * wall_mean) << "monitored " << monitored_mean << " ms/step, wall " << wall_mean;
  // Data waits are ~2/3 of the step: the warning names the setting.
  const std::string said = read_stream(o.stream);
  EXPECT_NE(said.find("waiting for data took"), std::string::npos) << said;
  EXPECT_NE(said.find("monitor.data_wait_warning=0.30"), std::string::npos) << said;
  EXPECT_GT(mon->summary().data_share, 0.3);
  EXPECT_EQ(mon->summary().times.steps, 16);
}

TEST(Monitor, MfuIsFlopsTimesThroughputOverPeak) {
  BlobTask task(BlobTask::Options{.samples = 256, .batch_size = 32});
  auto o = quiet_options();
  o.log_every = 4;
  o.flops_per_sample = 1.5e6;
  o.peak_flops = 2.0e9;
  auto capture = std::make_shared<Capture>();
  auto mon = std::make_shared<monitor::Monitor>(o);
  mon->add_writer(capture);
  train::TrainerOptions to;
  to.epochs = 1;
  to.handle_signals = false;
  train::Trainer trainer(to);
  trainer.add_callback(mon);
  trainer.fit(task);
  const auto steps = capture->of("step");
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& r : steps) {
    ASSERT_GT(r.get("samples_per_second"), 0);
    EXPECT_NEAR(r.get("mfu"), 1.5e6 * r.get("samples_per_second") / 2.0e9, 1e-12);
    EXPECT_TRUE(std::isnan(r.get("tokens_per_second")));
    EXPECT_TRUE(std::isnan(r.get("gpu_mem_allocated_mib"))) << "CPU run: no allocator stats";
    EXPECT_TRUE(std::isnan(r.get("gpu_util"))) << "CPU run: no NVML, and no error";
    EXPECT_GT(r.get("rss_mib"), 1.0);
  }
  EXPECT_NEAR(mon->summary().mfu, (steps[0].get("mfu") + steps[1].get("mfu")) / 2, 1e-12);
}

TEST(Monitor, CountsFlopsOfTheModelWithoutChangingTraining) {
  // BlobNet: Linear(8, 32) and Linear(32, 4): 8*32 + 32*4 = 384 MACs per
  // sample forward; training = 3 x 2 x 384 FLOPs.
  const auto train_once = [](bool monitored) {
    BlobTask task(BlobTask::Options{.samples = 128, .batch_size = 32});
    train::TrainerOptions to;
    to.epochs = 2;
    to.handle_signals = false;
    train::Trainer trainer(to);
    auto o = quiet_options();
    o.log_every = 1;
    auto mon = std::make_shared<monitor::Monitor>(o);
    if (monitored) trainer.add_callback(mon);
    trainer.fit(task);
    return std::make_pair(test_util::snapshot(*task.model()), mon->summary().flops_per_sample);
  };
  const auto [plain, no_flops] = train_once(false);
  const auto [monitored, flops] = train_once(true);
  EXPECT_EQ(flops, 3.0 * 2.0 * 384.0);
  ASSERT_EQ(plain.size(), monitored.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(torch::equal(plain[i], monitored[i])) << "monitoring changed tensor " << i << " (dropout RNG?)";
}

TEST(Monitor, WritesJsonlAndCsvWithTheDocumentedSchema) {
  const std::string dir = test_util::temp_dir("monitor_files");
  BlobTask task(BlobTask::Options{.samples = 256, .batch_size = 32});
  auto o = quiet_options();
  o.run_dir = dir;
  o.log_every = 3;
  o.tensorboard = false;
  auto mon = std::make_shared<monitor::Monitor>(o);
  train::TrainerOptions to;
  to.epochs = 2;
  to.handle_signals = false;
  train::Trainer trainer(to);
  trainer.add_callback(mon);
  trainer.fit(task);

  const auto lines = read_jsonl(dir + "/metrics.jsonl");
  std::vector<nlohmann::json> steps, epochs, vals;
  for (const auto& j : lines) {
    const std::string kind = j.at("kind");
    (kind == "step" ? steps : kind == "train_epoch" ? epochs : vals).push_back(j);
  }
  ASSERT_EQ(steps.size(), 5u);  // steps 3, 6, 9, 12, 15 of 16
  ASSERT_EQ(epochs.size(), 2u);
  ASSERT_EQ(vals.size(), 2u);
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& j = steps[i];
    EXPECT_EQ(j.at("step"), 3 * static_cast<int64_t>(i + 1));
    EXPECT_EQ(j.at("epoch"), j.at("step").get<int64_t>() <= 8 ? 1 : 2);
    for (const char* k : {"time", "loss", "lr", "samples_per_second", "step_ms", "data_ms", "forward_ms",
                          "backward_ms", "optimizer_ms", "other_ms", "cpu_percent", "rss_mib"})
      EXPECT_TRUE(j.at(k).is_number()) << k << " in " << j.dump();
    for (const char* k : {"tokens_per_second", "mfu", "loss_scale", "gpu_mem_allocated_mib", "gpu_util", "gpu_power_w"})
      EXPECT_TRUE(j.at(k).is_null()) << k << " in " << j.dump();
    EXPECT_TRUE(j.at("step").is_number_integer());
  }
  EXPECT_EQ(epochs[1].at("step"), 16);
  EXPECT_EQ(epochs[0].at("samples"), 256);
  EXPECT_TRUE(epochs[0].at("samples").is_number_integer());
  EXPECT_TRUE(vals[0].at("accuracy").is_number());
  EXPECT_NEAR(vals[1].at("loss").get<double>(), trainer.validate(task).loss, 1e-6);

  const auto csv = read_lines(dir + "/metrics_steps.csv");
  ASSERT_EQ(csv.size(), 1 + steps.size());
  EXPECT_EQ(csv[0].rfind("kind,epoch,step,time,loss,lr,samples_per_second,", 0), 0u) << csv[0];
  const auto columns = std::count(csv[0].begin(), csv[0].end(), ',');
  for (size_t i = 1; i < csv.size(); ++i) {
    EXPECT_EQ(std::count(csv[i].begin(), csv[i].end(), ','), columns) << csv[i];
    EXPECT_EQ(csv[i].rfind("step,", 0), 0u);
  }
  const auto epochs_csv = read_lines(dir + "/metrics_epochs.csv");
  ASSERT_EQ(epochs_csv.size(), 5u);
  EXPECT_EQ(epochs_csv[0], "kind,epoch,step,time,loss,accuracy,seconds,samples,skipped_steps");
  EXPECT_EQ(epochs_csv[2].rfind("val,1,8,", 0), 0u) << epochs_csv[2];
  EXPECT_EQ(epochs_csv[2].back(), ',') << "val records have no skipped_steps: an empty cell";

  // A second fit appends to the same files (resume); the CSV header is not repeated.
  train::Trainer again(to);
  again.add_callback(std::make_shared<monitor::Monitor>(o));
  again.fit(task);
  EXPECT_EQ(read_lines(dir + "/metrics_steps.csv").size(), 1 + 2 * steps.size());
  EXPECT_EQ(read_jsonl(dir + "/metrics.jsonl").size(), 2 * lines.size());
}

TEST(MonitorWriters, CsvWithOtherColumnsIsAnError) {
  const std::string dir = test_util::temp_dir("monitor_csv");
  test_util::write_bytes(dir + "/m.csv", "kind,epoch,step,time,foo\n");
  const std::string err = test_util::error_of([&] { monitor::CsvWriter(dir + "/m.csv", {"step"}, {"loss"}, 0.0); });
  EXPECT_NE(err.find("m.csv has other columns"), std::string::npos) << err;
}

TEST(MonitorWriters, JsonlValuesIntegersNullsAndRounding) {
  const std::string dir = test_util::temp_dir("monitor_jsonl");
  {
    monitor::JsonlWriter w(dir + "/m.jsonl", 100.0);
    Record r;
    r.kind = "step";
    r.epoch = 1;
    r.step = 7;
    r.wall_time = 101.25;
    r.add("samples", 2048).add("loss", 0.1234567891234).add("gone", NAN).add("big", 3.0e12);
    w.write(r);
  }
  EXPECT_EQ(read_lines(dir + "/m.jsonl").at(0), R"({"kind":"step","epoch":1,"step":7,"time":1.25,"samples":2048,"loss":0.1234568,"gone":null,"big":3000000000000})");
}

TEST(MonitorWriters, TensorBoardTags) {
  using monitor::TensorBoardScalars;
  EXPECT_EQ(TensorBoardScalars::tag_of("step", "loss"), "train/loss");
  EXPECT_EQ(TensorBoardScalars::tag_of("step", "samples_per_second"), "train/samples_per_second");
  EXPECT_EQ(TensorBoardScalars::tag_of("step", "data_ms"), "time/data_ms");
  EXPECT_EQ(TensorBoardScalars::tag_of("step", "gpu_mem_reserved_mib"), "gpu/mem_reserved_mib");
  EXPECT_EQ(TensorBoardScalars::tag_of("step", "rss_mib"), "host/rss_mib");
  EXPECT_EQ(TensorBoardScalars::tag_of("train_epoch", "accuracy"), "epoch/train_accuracy");
  EXPECT_EQ(TensorBoardScalars::tag_of("val", "loss"), "epoch/val_loss");
}

TEST(Progress, PlainLinesWithoutControlCharactersWhenNotATerminal) {
  std::FILE* out = std::tmpfile();
  monitor::ProgressOptions po;
  po.stream = out;
  po.plain_interval = 0;  // a line every step
  BlobTask task(BlobTask::Options{.samples = 128, .batch_size = 32});
  train::TrainerOptions to;
  to.epochs = 2;
  to.handle_signals = false;
  train::Trainer trainer(to);
  trainer.add_callback(std::make_shared<monitor::ProgressLogger>(po));
  trainer.fit(task);
  const std::string text = read_stream(out);
  for (char c : text) ASSERT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << "control character " << int(c);
  std::istringstream lines(text);
  int progress_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("epoch 1/2 ", 0) == 0 || line.rfind("epoch 2/2 ", 0) == 0) {
      ++progress_lines;
      EXPECT_NE(line.find(" samples/s rss "), std::string::npos) << line;
      EXPECT_NE(line.find(" ETA "), std::string::npos) << line;
    }
  }
  EXPECT_EQ(progress_lines, 8) << text;  // 4 steps x 2 epochs
  EXPECT_NE(text.find("epoch 2/2: train loss"), std::string::npos) << text;
  EXPECT_NE(text.find("| val loss"), std::string::npos) << text;
  std::fclose(out);
}

TEST(Profiler, WritesAChromeTraceOfTheChosenSteps) {
  const std::string dir = test_util::temp_dir("profiler");
  BlobTask task(BlobTask::Options{.samples = 256, .batch_size = 32});
  monitor::ProfilerOptions po;
  po.steps = 2;
  po.wait = 3;
  po.path = dir + "/trace.json";
  po.stream = std::tmpfile();
  auto profiler = std::make_shared<monitor::Profiler>(po);
  train::TrainerOptions to;
  to.epochs = 1;
  to.handle_signals = false;
  train::Trainer trainer(to);
  trainer.add_callback(profiler);
  trainer.fit(task);
  ASSERT_TRUE(profiler->written());
  std::ifstream in(po.path);
  ASSERT_TRUE(in.good());
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int> count;
  for (const auto& e : trace.at("traceEvents"))
    if (e.contains("name") && e.value("ph", "") == "X") ++count[e.at("name").get<std::string>()];
  // Steps 4 and 5 of 8: each phase once per step.
  for (const char* range : {"ember::data", "ember::forward", "ember::backward", "ember::optimizer"})
    EXPECT_EQ(count[range], 2) << range;
  EXPECT_GE(count["aten::addmm"], 4) << "two Linear layers per forward";
  EXPECT_NE(read_stream(po.stream).find("trace of 2 steps written to"), std::string::npos);
}

}  // namespace
}  // namespace ember
