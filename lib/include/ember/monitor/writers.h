#pragma once
// Where monitoring records go: metrics.jsonl, CSV, TensorBoard event files.
//
// A Record is one row: a kind, its position (epoch, optimizer step, wall
// time) and named numbers in a fixed order. NaN means "not measured": null
// in JSON, an empty cell in CSV, nothing written to TensorBoard.

#include <cstdint>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ember::monitor {

class TensorBoardWriter;

/// What a record is; to_string is its "kind" in the files.
enum class RecordKind {
  kStep,        ///< "step": every trainer.log_every optimizer steps
  kTrainEpoch,  ///< "train_epoch": an epoch's training metrics
  kVal,         ///< "val": a validation
};
/// "step", "train_epoch", "val" -> RecordKind; anything else is an error listing them.
RecordKind parse_record_kind(const std::string& name);
const char* to_string(RecordKind kind);

struct Record {
  RecordKind kind = RecordKind::kStep;
  int64_t epoch = 0;       ///< 1-based
  int64_t step = 0;        ///< optimizer steps taken so far
  double wall_time = 0.0;  ///< Unix time, seconds
  std::vector<std::pair<std::string, double>> values;

  Record& add(std::string name, double value);
  /// The value of `name`, NaN if absent.
  double get(const std::string& name) const;
};

class MetricsWriter {
 public:
  virtual ~MetricsWriter() = default;
  virtual void write(const Record& record) = 0;
  virtual void flush() {}
};

/// One JSON object per line: {"kind":K,"epoch":E,"step":S,"time":T,<values>}.
/// Integral values (steps, sample counts) are written as JSON integers.
/// Appends (a resumed run continues the file); each line is flushed whole, so
/// a crash leaves at most a truncated last line, which is ended before the
/// next record is appended. A write error throws (the Monitor then drops
/// the writer with a warning).
class JsonlWriter : public MetricsWriter {
 public:
  /// `time_origin`: Unix time subtracted from wall_time to give "time"
  /// (seconds since the fit started).
  JsonlWriter(const std::string& path, double time_origin);
  void write(const Record& record) override;
  void flush() override;

 private:
  std::string path_;
  std::ofstream out_;
  double time_origin_;
};

/// A CSV file of the records of some kinds, with a fixed header
/// (kind,epoch,step,time,<columns>): values of other names are not written.
/// A new file gets the header; an existing one with the same header is
/// appended to (resume), one with another header is an error.
class CsvWriter : public MetricsWriter {
 public:
  CsvWriter(const std::string& path, std::set<RecordKind> kinds, std::vector<std::string> columns,
            double time_origin);
  void write(const Record& record) override;
  void flush() override;

 private:
  std::string path_;
  std::ofstream out_;
  std::set<RecordKind> kinds_;
  std::vector<std::string> columns_;
  double time_origin_;
};

/// Scalars to TensorBoard, tagged by kind and name: step records as
/// train/<name> (timings under time/, GPU under gpu/, host under host/),
/// epoch records as epoch/train_<name> and epoch/val_<name>; the x axis is
/// the optimizer step for all of them.
class TensorBoardScalars : public MetricsWriter {
 public:
  explicit TensorBoardScalars(std::shared_ptr<TensorBoardWriter> writer);
  void write(const Record& record) override;
  void flush() override;
  /// The tag a record value is written under.
  static std::string tag_of(RecordKind kind, const std::string& name);

 private:
  std::shared_ptr<TensorBoardWriter> writer_;
};

}  // namespace ember::monitor
