// Monitoring: step-time breakdown, records and their writers, MFU, the
// progress line and the profiler's trace, on the CPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "../train/test_task.h"
#include "cuda_test.h"
#include "ember/version.h"
#include "tolerance.h"

namespace ember {
namespace {

using monitor::Record;
using monitor::RecordKind;
using test_util::BlobTask;
using train::StepPhase;
using Clock = std::chrono::steady_clock;

BlobTask::Options blob_options(int64_t samples, int64_t batch_size) {
  BlobTask::Options o;
  o.samples = samples;
  o.batch_size = batch_size;
  return o;
}

void sleep_ms(double ms) {
  std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
}

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
  std::vector<Record> of(RecordKind kind) const {
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
      : inner_(blob_options(256, 32)), loader_(inner_.train_loader(), data_ms), forward_ms_(forward_ms) {}
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

/// Wall-clock span of each epoch's steps, from its first data phase to its
/// end, measured apart from the monitor (registered before it).
struct StepClock : train::Callback {
  std::string name() const override { return "step_clock"; }
  void on_epoch_start(train::Trainer&, int64_t) override { first_.reset(); }
  void on_step_phase(train::Trainer&, StepPhase) override {
    if (!first_) first_ = Clock::now();
  }
  void on_epoch_end(train::Trainer&, int64_t, const train::EvalResult&) override {
    span_ms += std::chrono::duration<double, std::milli>(Clock::now() - *first_).count();
  }
  double span_ms = 0;

 private:
  std::optional<Clock::time_point> first_;
};

/// The order of phase calls, as letters: D F B O C, '|' at epoch ends.
struct PhaseLog : train::Callback {
  std::string name() const override { return "phase_log"; }
  void on_step_phase(train::Trainer&, StepPhase p) override { text += "DFBOC"[static_cast<int>(p)]; }
  void on_epoch_end(train::Trainer&, int64_t, const train::EvalResult&) override { text += '|'; }
  std::string text;
};

monitor::MonitorOptions quiet_options() {
  monitor::MonitorOptions o;
  o.run_dir("");
  o.peak_flops(-1);  // no CPU peak measurement in most tests
  o.stream(std::tmpfile());
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
  const auto start = Clock::now();
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
  const double steps_wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  sleep_ms(50);  // validation: not counted
  const monitor::StepTimes t = timer.take_all();
  EXPECT_EQ(t.steps, 3);
  // Sleeps last at least as long as asked (no upper bounds: a loaded machine oversleeps).
  EXPECT_GE(t.mean_ms(StepPhase::kData), 4.0);
  EXPECT_GE(t.mean_ms(StepPhase::kForward), 8.0);
  EXPECT_GE(t.mean_ms(StepPhase::kBackward), 2.0);
  EXPECT_GE(t.mean_ms(StepPhase::kOptimizer), 1.0);
  EXPECT_GE(t.mean_ms(StepPhase::kCallbacks), 1.0);
  // The phases lie inside the span this test measured up to pause(): what came after is not step time.
  EXPECT_LE(t.total_ms(), steps_wall_ms) << "the time after pause() is not step time";
  // ms / total against (ms / steps) / (total / steps): 1 rounding against 3, of a share <= 1.
  EXPECT_TRUE(test_util::near(t.share(StepPhase::kForward), t.mean_ms(StepPhase::kForward) / t.mean_step_ms(),
                              test_util::rounding_bound(torch::kFloat64, 4, 1.0)));
  const monitor::StepTimes empty = timer.take();
  EXPECT_EQ(empty.steps, 0);
  EXPECT_EQ(empty.total_ms(), 0.0);
}

#if EMBER_WITH_CUDA_KERNELS
TEST(StepTimerCuda, EventsAreReadWithoutBlockingTheHost) {
  EMBER_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  monitor::StepTimer timer(cuda);
  ASSERT_TRUE(timer.uses_device_events());
  torch::Tensor a = torch::randn({4096, 4096}, cuda);
  torch::cuda::synchronize();
  timer.mark(StepPhase::kData);
  timer.mark(StepPhase::kForward);
  const auto t0 = Clock::now();
  for (int i = 0; i < 20; ++i) a = torch::tanh(torch::mm(a, a) * 1e-3);  // ~20 x 137 GFLOP of queued work
  timer.mark(StepPhase::kBackward);
  timer.mark(StepPhase::kOptimizer);
  timer.mark(StepPhase::kCallbacks);
  const double host_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const monitor::StepTimes pending = timer.take();  // the GPU is still busy: nothing complete yet, no wait
  const monitor::StepTimes t = timer.take_all();
  EXPECT_EQ(pending.steps + t.steps, 1);
  const double forward = pending.ms[1] + t.ms[1];
  EXPECT_GT(forward, 0.5) << "the forward phase spans the queued matmuls";
  EXPECT_GT(forward, host_ms * 0.5) << "GPU time, not the host's (near-zero) enqueue time";
  // Accumulation: three micro-batches then one step.
  for (int micro = 0; micro < 3; ++micro) {
    timer.mark(StepPhase::kData);
    timer.mark(StepPhase::kForward);
    timer.mark(StepPhase::kBackward);
  }
  timer.mark(StepPhase::kOptimizer);
  timer.mark(StepPhase::kCallbacks);
  timer.pause();
  EXPECT_EQ(timer.take_all().steps, 1);
}
#endif

TEST(Monitor, StepBreakdownAddsUpToTheMeasuredStepTime) {
  SlowTask task(/*data_ms=*/6, /*forward_ms=*/3);
  auto o = quiet_options();
  o.log_every(3);
  o.data_wait_warning(0.3);
  auto capture = std::make_shared<Capture>();
  auto mon = std::make_shared<monitor::Monitor>(o);
  mon->add_writer(capture);
  auto clock = std::make_shared<StepClock>();
  train::TrainerOptions to;
  to.epochs(2);
  to.optimizer().lr(0.05);
  train::Trainer trainer(to);
  trainer.add_callback(clock).add_callback(mon);
  trainer.fit(task);

  const auto steps = capture->of(RecordKind::kStep);
  ASSERT_EQ(steps.size(), 5u);  // 8 batches per epoch, a record every 3 steps (one spans the epoch end)
  for (const auto& r : steps) {
    EXPECT_GE(r.get("data_ms"), 6.0) << "the loader sleeps 6 ms per batch";
    EXPECT_GE(r.get("forward_ms"), 3.0) << "the forward sleeps 3 ms";
    // Throughput and step time measure the same interval: 32 samples per step,
    // also for the record at step 9, whose interval spans validation.
    EXPECT_NEAR(r.get("samples_per_second") * r.get("step_ms") / 1e3, 32.0, 32.0 * 0.15) << "step " << r.step;
  }
  // Every step's time, phase by phase, adds up to the wall-clock span of the
  // epochs' steps measured independently.
  const monitor::StepTimes& all = mon->summary().times;
  EXPECT_EQ(all.steps, 16);
  EXPECT_NEAR(all.total_ms(), clock->span_ms, 0.05 * clock->span_ms + 2 * 5.0)
      << "phases " << all.total_ms() << " ms, wall " << clock->span_ms << " ms";
  // Data waits are ~2/3 of the step: the warning names the setting.
  const std::string said = read_stream(o.stream());
  EXPECT_NE(said.find("waiting for data took"), std::string::npos) << said;
  EXPECT_NE(said.find("monitor.data_wait_warning=0.30"), std::string::npos) << said;
  EXPECT_GT(mon->summary().data_share, 0.3);
}

TEST(Monitor, PhasesFollowTheLoopWithAccumulation) {
  BlobTask task(blob_options(224, 32));  // 7 batches: windows of 3, 3, 1
  auto log = std::make_shared<PhaseLog>();
  train::TrainerOptions to;
  to.epochs(1);
  to.accumulate_grad_batches(3);
  train::Trainer trainer(to);
  trainer.add_callback(log);
  trainer.fit(task);
  EXPECT_EQ(log->text,
            "DFBDFBDFBOC"
            "DFBDFBDFBOC"
            "DFBOC"
            "|");
}

TEST(Monitor, AFailingWriterIsDroppedAndTrainingGoesOn) {
  struct Failing : monitor::MetricsWriter {
    void write(const Record&) override {
      if (++calls == 2) throw Error("[test] disk full");
    }
    int calls = 0;
  };
  BlobTask task(blob_options(256, 32));
  auto o = quiet_options();
  o.log_every(2);
  auto failing = std::make_shared<Failing>();
  auto capture = std::make_shared<Capture>();
  auto mon = std::make_shared<monitor::Monitor>(o);
  mon->add_writer(failing).add_writer(capture);
  train::TrainerOptions to;
  to.epochs(1);
  train::Trainer trainer(to);
  trainer.add_callback(mon);
  EXPECT_EQ(trainer.fit(task).steps, 8);
  EXPECT_EQ(failing->calls, 2);
  EXPECT_EQ(capture->of(RecordKind::kStep).size(), 4u);
  EXPECT_NE(read_stream(o.stream()).find("[test] disk full; that writer is off"), std::string::npos);
}

TEST(Monitor, MfuIsFlopsTimesThroughputOverPeak) {
  BlobTask task(blob_options(256, 32));
  auto o = quiet_options();
  o.log_every(4);
  o.flops_per_sample(1.5e6);
  o.peak_flops(2.0e9);
  auto capture = std::make_shared<Capture>();
  auto mon = std::make_shared<monitor::Monitor>(o);
  mon->add_writer(capture);
  train::TrainerOptions to;
  to.epochs(1);
  train::Trainer trainer(to);
  trainer.add_callback(mon);
  trainer.fit(task);
  const auto steps = capture->of(RecordKind::kStep);
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& r : steps) {
    ASSERT_GT(r.get("samples_per_second"), 0);
    const double mfu = 1.5e6 * r.get("samples_per_second") / 2.0e9;  // 2 roundings a side
    EXPECT_TRUE(test_util::near(r.get("mfu"), mfu, test_util::rounding_bound(torch::kFloat64, 4, mfu)));
    EXPECT_TRUE(std::isnan(r.get("tokens_per_second")));
    EXPECT_TRUE(std::isnan(r.get("gpu_mem_allocated_mib"))) << "CPU run: no allocator stats";
    EXPECT_TRUE(std::isnan(r.get("gpu_util"))) << "CPU run: no NVML, and no error";
    EXPECT_GT(r.get("rss_mib"), 1.0);
  }
  // The fit's MFU: over all training time, the last partial interval included.
  const double mfu = 1.5e6 * mon->summary().samples_per_second / 2.0e9;
  EXPECT_TRUE(test_util::near(mon->summary().mfu, mfu, test_util::rounding_bound(torch::kFloat64, 4, mfu)));
  EXPECT_GT(mon->summary().samples_per_second, 0);
}

/// No held-out data (FLOPs are counted on a training batch), and an
/// evaluation step that draws random numbers, as augmentation would.
class RandomEvalTask : public BlobTask {
 public:
  RandomEvalTask() : BlobTask(blob_options(128, 32)) {}
  train::StepOutput evaluation_step(const data::Batch& b) override {
    (void)torch::rand({16});
    return training_step(b);
  }
  data::Loader* val_loader() override { return nullptr; }
  data::Loader* test_loader() override { return nullptr; }
};

TEST(Monitor, CountsFlopsOfTheModelWithoutChangingTraining) {
  // BlobNet: Linear(8, 32) and Linear(32, 4): 8*32 + 32*4 = 384 MACs per
  // sample forward; training = 3 x 2 x 384 FLOPs. Dropout makes training
  // draw from the RNG, so a counting pass, a histogram or a writer that moved
  // it (or touched a weight or gradient) would show. Three arms: no monitor;
  // a monitor without files; a monitor writing everything (JSONL, CSV,
  // TensorBoard scalars and weight/gradient histograms at every step).
  enum class Arm { kPlain, kNoFiles, kEverything };
  const auto train_once = [](Arm arm) {
    RandomEvalTask task;
    train::TrainerOptions to;
    to.epochs(2);
    to.clip_grad_norm(0.5);  // the gradient histograms read what clipping left
    train::Trainer trainer(to);
    auto o = quiet_options();
    o.log_every(1);
    o.peak_flops(1e12);  // MFU on: FLOPs are counted
    if (arm == Arm::kEverything) {
      o.run_dir(test_util::temp_dir("monitor_unchanged"));
      o.histogram_every(1);
    }
    auto mon = std::make_shared<monitor::Monitor>(o);
    if (arm != Arm::kPlain) trainer.add_callback(mon);
    trainer.fit(task);
    return std::make_tuple(test_util::snapshot(*task.model()), mon->summary().flops_per_sample, o.run_dir());
  };
  const auto [plain, no_flops, no_dir] = train_once(Arm::kPlain);
  for (const Arm arm : {Arm::kNoFiles, Arm::kEverything}) {
    const auto [monitored, flops, dir] = train_once(arm);
    EXPECT_EQ(flops, 3.0 * 2.0 * 384.0);
    ASSERT_EQ(plain.size(), monitored.size());
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_TRUE(torch::equal(plain[i], monitored[i]))
          << "monitoring changed tensor " << i
          << (dir.empty() ? " (no files)" : " (all writers, histograms)");
    if (dir.empty()) continue;
    // The writers really ran: 8 step records (4 batches per epoch, 2 epochs) and histograms in the events.
    EXPECT_EQ(read_lines(dir + "/metrics_steps.csv").size(), 1u + 8u);
    std::string events;
    for (const auto& e : std::filesystem::directory_iterator(dir + "/tensorboard"))
      events += train::read_file(e.path().string());
    EXPECT_NE(events.find("weights/fc1.weight"), std::string::npos);
    EXPECT_NE(events.find("gradients/fc2.bias"), std::string::npos);
  }
}

TEST(Monitor, WritesJsonlAndCsvWithTheDocumentedSchema) {
  const std::string dir = test_util::temp_dir("monitor_files");
  BlobTask task(blob_options(256, 32));
  auto o = quiet_options();
  o.run_dir(dir);
  o.log_every(3);
  o.tensorboard(false);
  auto mon = std::make_shared<monitor::Monitor>(o);
  train::TrainerOptions to;
  to.epochs(2);
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
    for (const char* k :
         {"tokens_per_second", "mfu", "loss_scale", "gpu_mem_allocated_mib", "gpu_util", "gpu_power_w"})
      EXPECT_TRUE(j.at(k).is_null()) << k << " in " << j.dump();
    EXPECT_TRUE(j.at("step").is_number_integer());
  }
  EXPECT_EQ(epochs[1].at("step"), 16);
  EXPECT_EQ(epochs[0].at("samples"), 256);
  EXPECT_TRUE(epochs[0].at("samples").is_number_integer());
  EXPECT_TRUE(vals[0].at("accuracy").is_number());
  // The same model on the same batches (one computation), written to 7 significant digits: within
  // half a unit of the 7th, 5e-7 of the loss.
  const double loss = trainer.validate(task).loss;
  EXPECT_TRUE(test_util::near(vals[1].at("loss").get<double>(), loss,
                              5e-7 * loss + test_util::rounding_bound(torch::kFloat64, 2, loss)));

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
  const std::string err =
      test_util::error_of([&] { monitor::CsvWriter(dir + "/m.csv", {RecordKind::kStep}, {"loss"}, 0.0); });
  EXPECT_NE(err.find("m.csv has other columns"), std::string::npos) << err;
}

TEST(MonitorWriters, JsonlValuesIntegersNullsAndRounding) {
  const std::string dir = test_util::temp_dir("monitor_jsonl");
  {
    monitor::JsonlWriter w(dir + "/m.jsonl", 100.0);
    Record r;
    r.kind = RecordKind::kStep;
    r.epoch = 1;
    r.step = 7;
    r.wall_time = 101.25;
    r.add("samples", 2048).add("loss", 0.1234567891234).add("gone", NAN).add("big", 3.0e12);
    w.write(r);
  }
  EXPECT_EQ(
      read_lines(dir + "/m.jsonl").at(0),
      R"({"kind":"step","epoch":1,"step":7,"time":1.25,"samples":2048,"loss":0.1234568,"gone":null,"big":3000000000000})");
}

TEST(MonitorWriters, AppendingAfterACrashStartsANewLine) {
  const std::string dir = test_util::temp_dir("monitor_crash");
  test_util::write_bytes(dir + "/m.jsonl", "{\"kind\":\"step\",\"step\":1}\n{\"kind\":\"st");
  {
    monitor::JsonlWriter w(dir + "/m.jsonl", 0.0);
    Record r;
    r.kind = RecordKind::kVal;
    w.write(r);
  }
  const auto lines = read_lines(dir + "/m.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1], "{\"kind\":\"st");
  EXPECT_EQ(nlohmann::json::parse(lines[2]).at("kind"), "val");
}

// The kinds are the files' text: metrics.jsonl's "kind", the CSVs' first column.
TEST(MonitorWriters, RecordKindNamesAreTheFilesKinds) {
  for (const auto& [kind, name] :
       std::vector<std::pair<RecordKind, std::string>>{{RecordKind::kStep, "step"},
                                                       {RecordKind::kTrainEpoch, "train_epoch"},
                                                       {RecordKind::kVal, "val"}}) {
    EXPECT_EQ(monitor::to_string(kind), name);
    EXPECT_EQ(monitor::parse_record_kind(name), kind);
  }
  try {
    monitor::parse_record_kind("epoch");
    ADD_FAILURE() << "an unknown kind was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kData);
    EXPECT_NE(std::string(e.what()).find("'epoch'; choose step, train_epoch or val"), std::string::npos)
        << e.what();
  }
}

TEST(MonitorWriters, CsvWritesTheRecordsOfItsKindsOnly) {
  const std::string dir = test_util::temp_dir("monitor_csv_kinds");
  {
    monitor::CsvWriter w(dir + "/m.csv", {RecordKind::kTrainEpoch, RecordKind::kVal}, {"loss"}, 0.0);
    for (const RecordKind kind :
         {RecordKind::kStep, RecordKind::kTrainEpoch, RecordKind::kStep, RecordKind::kVal}) {
      Record r;
      r.kind = kind;
      r.add("loss", 0.5);
      w.write(r);
    }
  }
  EXPECT_EQ(read_lines(dir + "/m.csv"),
            (std::vector<std::string>{"kind,epoch,step,time,loss", "train_epoch,0,0,0.000,0.5",
                                      "val,0,0,0.000,0.5"}));
}

TEST(MonitorWriters, TensorBoardTags) {
  using monitor::TensorBoardScalars;
  EXPECT_EQ(TensorBoardScalars::tag_of(RecordKind::kStep, "loss"), "train/loss");
  EXPECT_EQ(TensorBoardScalars::tag_of(RecordKind::kStep, "samples_per_second"), "train/samples_per_second");
  EXPECT_EQ(TensorBoardScalars::tag_of(RecordKind::kStep, "data_ms"), "time/data_ms");
  EXPECT_EQ(TensorBoardScalars::tag_of(RecordKind::kStep, "gpu_mem_reserved_mib"), "gpu/mem_reserved_mib");
  EXPECT_EQ(TensorBoardScalars::tag_of(RecordKind::kStep, "rss_mib"), "host/rss_mib");
  EXPECT_EQ(TensorBoardScalars::tag_of(RecordKind::kTrainEpoch, "accuracy"), "epoch/train_accuracy");
  EXPECT_EQ(TensorBoardScalars::tag_of(RecordKind::kVal, "loss"), "epoch/val_loss");
}

TEST(Progress, PlainLinesWithoutControlCharactersWhenNotATerminal) {
  std::FILE* out = std::tmpfile();
  monitor::ProgressOptions po;
  po.stream(out);
  po.plain_interval(0);  // a line every step
  BlobTask task(blob_options(128, 32));
  train::TrainerOptions to;
  to.epochs(2);
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
  BlobTask task(blob_options(256, 32));
  monitor::ProfilerOptions po;
  po.steps(2);
  po.wait(3);
  po.path(dir + "/trace.json");
  po.stream(std::tmpfile());
  auto profiler = std::make_shared<monitor::Profiler>(po);
  train::TrainerOptions to;
  to.epochs(1);
  train::Trainer trainer(to);
  trainer.add_callback(profiler);
  trainer.fit(task);
  ASSERT_TRUE(profiler->written());
  std::ifstream in(po.path());
  ASSERT_TRUE(in.good());
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int> count;
  for (const auto& e : trace.at("traceEvents"))
    if (e.contains("name") && e.value("ph", "") == "X") ++count[e.at("name").get<std::string>()];
  // Steps 4 and 5 of 8: each phase once per step.
  for (const char* range : {"ember::data", "ember::forward", "ember::backward", "ember::optimizer"})
    EXPECT_EQ(count[range], 2) << range;
  EXPECT_GE(count["aten::addmm"], 4) << "two Linear layers per forward";
  EXPECT_NE(read_stream(po.stream()).find("trace of 2 steps written to"), std::string::npos);
}

}  // namespace
}  // namespace ember
