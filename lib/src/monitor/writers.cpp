#include "ember/monitor/writers.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "ember/core/enum_names.h"
#include "ember/core/file.h"
#include "ember/monitor/tensorboard.h"

namespace ember::monitor {
namespace {

void make_parent_dirs(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) core::make_dirs(path.substr(0, slash));
}

bool integral(double v) {
  return std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9e15;
}

// Integers as integers; other numbers to 7 significant digits (float32's
// precision, more than any measurement here carries) so lines stay readable.
nlohmann::json json_value(double v) {
  if (!std::isfinite(v)) return nullptr;
  if (integral(v)) return static_cast<int64_t>(v);
  return std::stod(fmt::format("{:.7g}", v));
}

// As in JSON: integers exactly, other numbers to 7 significant digits; "" for NaN.
std::string csv_value(double v) {
  if (!std::isfinite(v)) return "";
  if (integral(v)) return std::to_string(static_cast<int64_t>(v));
  return fmt::format("{:.7g}", v);
}

// A file that ends mid-line (a crash while writing) gets its line ended, so
// that the next record of a resumed run starts on a line of its own.
void end_partial_line(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in.good() || in.tellg() <= 0) return;
  in.seekg(-1, std::ios::end);
  char last = '\n';
  in.get(last);
  if (last != '\n') std::ofstream(path, std::ios::app) << '\n';
}

void check_stream(const std::ofstream& out, const std::string& path, const char* who) {
  EMBER_CHECK(out.good(), "[monitor::{}] writing {} failed (disk full, or the folder was removed?)", who,
              path);
}

}  // namespace

Record& Record::add(std::string name, double value) {
  values.emplace_back(std::move(name), value);
  return *this;
}

double Record::get(const std::string& name) const {
  for (const auto& [k, v] : values)
    if (k == name) return v;
  return std::numeric_limits<double>::quiet_NaN();
}

namespace {
constexpr core::EnumNames<RecordKind, 3> kRecordNames{
    "record kind",
    {{{RecordKind::kStep, "step"}, {RecordKind::kTrainEpoch, "train_epoch"}, {RecordKind::kVal, "val"}}}};
}  // namespace

RecordKind parse_record_kind(const std::string& name) {
  return kRecordNames.parse(name, "monitor::Record", ErrorKind::kData);
}

const char* to_string(RecordKind kind) {
  return kRecordNames.name(kind);
}

JsonlWriter::JsonlWriter(const std::string& path, double time_origin)
    : path_(path), time_origin_(time_origin) {
  make_parent_dirs(path);
  end_partial_line(path);
  out_.open(path, std::ios::app);
  EMBER_CHECK(out_.good(), "[monitor::JsonlWriter] cannot open {} for writing", path);
}

void JsonlWriter::write(const Record& r) {
  nlohmann::ordered_json j;
  j["kind"] = to_string(r.kind);
  j["epoch"] = r.epoch;
  j["step"] = r.step;
  j["time"] = std::round((r.wall_time - time_origin_) * 1e3) / 1e3;
  for (const auto& [k, v] : r.values) j[k] = json_value(v);
  out_ << j.dump() << '\n';
  out_.flush();  // whole lines only: a reader never sees half a record unless the process dies mid-write
  check_stream(out_, path_, "JsonlWriter");
}

void JsonlWriter::flush() {
  out_.flush();
}

CsvWriter::CsvWriter(const std::string& path, std::set<RecordKind> kinds, std::vector<std::string> columns,
                     double time_origin)
    : path_(path), kinds_(std::move(kinds)), columns_(std::move(columns)), time_origin_(time_origin) {
  std::string header = "kind,epoch,step,time";
  for (const auto& c : columns_) header += "," + c;
  std::string existing;
  {
    std::ifstream in(path);
    if (in.good()) std::getline(in, existing);
  }
  EMBER_CHECK(existing.empty() || existing == header,
              "[monitor::CsvWriter] {} has other columns than this run writes (header '{}', expected '{}'): "
              "was it written by another recipe or Ember version? Move it away or use a new run.dir",
              path, existing, header);
  make_parent_dirs(path);
  end_partial_line(path);
  out_.open(path, std::ios::app);
  EMBER_CHECK(out_.good(), "[monitor::CsvWriter] cannot open {} for writing", path);
  if (existing.empty()) out_ << header << '\n';
}

void CsvWriter::write(const Record& r) {
  if (!kinds_.count(r.kind)) return;
  std::string line =
      fmt::format("{},{},{},{:.3f}", to_string(r.kind), r.epoch, r.step, r.wall_time - time_origin_);
  for (const auto& c : columns_) line += "," + csv_value(r.get(c));
  out_ << line << '\n';
  out_.flush();
  check_stream(out_, path_, "CsvWriter");
}

void CsvWriter::flush() {
  out_.flush();
}

TensorBoardScalars::TensorBoardScalars(std::shared_ptr<TensorBoardWriter> writer)
    : writer_(std::move(writer)) {
  EMBER_CHECK(writer_ != nullptr, "[monitor::TensorBoardScalars] null writer");
}

std::string TensorBoardScalars::tag_of(RecordKind kind, const std::string& name) {
  switch (kind) {
    case RecordKind::kTrainEpoch:
      return "epoch/train_" + name;
    case RecordKind::kVal:
      return "epoch/val_" + name;
    case RecordKind::kStep:
      break;
  }
  const auto ends_with = [&](const char* s) {
    const std::string suffix = s;
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (name.rfind("gpu_", 0) == 0) return "gpu/" + name.substr(4);
  if (ends_with("_ms")) return "time/" + name;
  if (name == "cpu_percent" || name == "rss_mib") return "host/" + name;
  return "train/" + name;
}

void TensorBoardScalars::write(const Record& r) {
  for (const auto& [k, v] : r.values)
    if (std::isfinite(v)) writer_->add_scalar(tag_of(r.kind, k), v, r.step, r.wall_time);
}

void TensorBoardScalars::flush() {
  writer_->flush();
}

}  // namespace ember::monitor
