// TensorBoard event files: the file name, the TFRecord framing and its masked
// CRC-32C (checked with an independent bitwise CRC and a hand decoder of the
// protobuf wire format, so field numbers are checked too), buffering, histogram
// counts, and write errors. What TensorBoard's own reader makes of the files is
// checked by tensorboard_read.py (ctest python.tensorboard_read).
#include "ember/monitor/tensorboard.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <regex>

#include "cuda_test.h"
#include "monitor/tensorboard_record.h"
#include "tolerance.h"
#include "train/test_task.h"

namespace ember::monitor {
namespace {

// ---- independent oracles ----------------------------------------------------

// Bitwise CRC-32C (reflected polynomial 0x82F63B78), no tables.
uint32_t reference_crc32c(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return crc ^ 0xFFFFFFFFu;
}
uint32_t reference_mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

uint64_t read_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Splits an event file into its payloads, checking every length and masked CRC.
std::vector<std::string> read_records(const std::string& path) {
  const std::string file = slurp(path);
  std::vector<std::string> payloads;
  size_t at = 0;
  while (at < file.size()) {
    EXPECT_LE(at + 12, file.size()) << "truncated header at " << at;
    if (at + 12 > file.size()) break;
    const uint64_t length = read_le(file, at, 8);
    EXPECT_EQ(read_le(file, at + 8, 4), reference_mask(reference_crc32c(file.substr(at, 8))))
        << "length CRC of the record at " << at;
    EXPECT_LE(at + 12 + length + 4, file.size()) << "truncated record at " << at;
    if (at + 12 + length + 4 > file.size()) break;
    const std::string payload = file.substr(at + 12, length);
    EXPECT_EQ(read_le(file, at + 12 + length, 4), reference_mask(reference_crc32c(payload)))
        << "payload CRC of the record at " << at;
    payloads.push_back(payload);
    at += 12 + length + 4;
  }
  return payloads;
}

// A protobuf message decoded by hand: field number -> raw values (varints and
// fixed-width numbers as their 64-bit patterns, length-delimited as bytes).
struct Field {
  int wire_type = 0;
  uint64_t number = 0;
  std::string bytes;
};
std::multimap<int, Field> decode(const std::string& msg) {
  std::multimap<int, Field> fields;
  size_t at = 0;
  const auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0; at < msg.size(); shift += 7) {
      const auto b = static_cast<unsigned char>(msg[at++]);
      v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  };
  while (at < msg.size()) {
    const uint64_t key = varint();
    Field f;
    f.wire_type = static_cast<int>(key & 7);
    if (f.wire_type == 0) {
      f.number = varint();
    } else if (f.wire_type == 1) {
      f.number = read_le(msg, at, 8);
      at += 8;
    } else if (f.wire_type == 5) {
      f.number = read_le(msg, at, 4);
      at += 4;
    } else if (f.wire_type == 2) {
      const uint64_t n = varint();
      f.bytes = msg.substr(at, n);
      at += n;
    } else {
      ADD_FAILURE() << "unexpected wire type " << f.wire_type;
      break;
    }
    fields.emplace(static_cast<int>(key >> 3), f);
  }
  return fields;
}
double as_double(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}
float as_float(uint64_t bits) {
  const auto b32 = static_cast<uint32_t>(bits);
  float f;
  std::memcpy(&f, &b32, 4);
  return f;
}
std::vector<double> packed_doubles(const std::string& bytes) {
  std::vector<double> out(bytes.size() / 8);
  std::memcpy(out.data(), bytes.data(), out.size() * 8);
  return out;
}
const Field& one(const std::multimap<int, Field>& m, int number) {
  EXPECT_EQ(m.count(number), 1u) << "field " << number;
  static const Field kMissing;
  const auto it = m.find(number);
  return it == m.end() ? kMissing : it->second;
}

// HistogramProto fields (histogram.proto numbers) of a histogram event.
struct DecodedHistogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit, bucket;
};
DecodedHistogram decode_histogram(const std::string& event, const std::string& tag) {
  const auto value = decode(one(decode(one(decode(event), 5).bytes), 1).bytes);  // Event.summary.value
  EXPECT_EQ(one(value, 1).bytes, tag);
  const auto h = decode(one(value, 5).bytes);  // Value.histo
  DecodedHistogram d;
  const auto num = [&](int n) { return h.count(n) ? as_double(h.find(n)->second.number) : 0.0; };
  d.min = num(1);
  d.max = num(2);
  d.num = num(3);
  d.sum = num(4);
  d.sum_squares = num(5);
  if (h.count(6)) d.bucket_limit = packed_doubles(h.find(6)->second.bytes);
  if (h.count(7)) d.bucket = packed_doubles(h.find(7)->second.bytes);
  return d;
}

off_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

void remove_dir(const std::string& dir) {
  ASSERT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

TensorBoardOptions unbuffered() {
  return TensorBoardOptions().flush_seconds(0);
}

// ---- tests ------------------------------------------------------------------

TEST(TensorBoard, Crc32cMatchesKnownVectorsAndTheMask) {
  const std::string check = "123456789";
  EXPECT_EQ(detail::crc32c(check.data(), check.size()), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(reference_crc32c(check), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');  // RFC 3720 B.4 vectors
  EXPECT_EQ(detail::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(detail::crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(detail::crc32c("", 0), 0u);
  // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8 mod 2^32
  EXPECT_EQ(detail::masked_crc32c(check.data(), check.size()), 0xC78AB0E5u);
  EXPECT_EQ(reference_mask(0xE3069283u), 0xC78AB0E5u);
}

// Known answers, derived by hand from the protobuf encoding rules (and equal
// to what protobuf's own serializer makes of TensorBoard's messages): key =
// field << 3 | wire type, varints, little-endian fixed widths, proto3 zeros
// left out, oneof members always written.
TEST(TensorBoard, EventBytesAreProtobufsEncoding) {
  const auto bytes = [](std::initializer_list<int> b) { return std::string(b.begin(), b.end()); };
  // Event{wall_time 2.0 (1: fixed64), step 300 (2: varint AC 02), summary (5) {value (1) {tag "loss" (1),
  // simple_value 0.5f (2: fixed32)}}}
  EXPECT_EQ(detail::scalar_event("loss", 0.5f, 300, 2.0),
            bytes({0x09, 0,    0,    0,    0,   0,   0,   0,   0x40, 0x10, 0xAC, 0x02, 0x2A, 0x0D,
                   0x0A, 0x0B, 0x0A, 0x04, 'l', 'o', 's', 's', 0x15, 0,    0,    0,    0x3F}));
  // Zero wall time and step are left out; a zero simple_value (a oneof member) is written; a
  // negative step is a 10-byte varint.
  EXPECT_EQ(detail::scalar_event("", 0.0f, 0, 0.0), bytes({0x2A, 0x07, 0x0A, 0x05, 0x15, 0, 0, 0, 0}));
  EXPECT_EQ(detail::scalar_event("", 0.0f, -1, 0.0),
            bytes({0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                   0x01, 0x2A, 0x07, 0x0A, 0x05, 0x15, 0,    0,    0,    0}));
  // -0.0 has a bit set, so it is written, as protobuf does.
  EXPECT_EQ(detail::file_version_event("v", -0.0), bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x1A, 0x01, 'v'}));
  // HistogramProto: num 2.0 (3), bucket_limit [1.0] (6, packed), bucket [2.0] (7, packed); min, max, sum,
  // sum_squares 0 left out. Wrapped in Value{histo (5)}, Summary, Event{summary}.
  detail::Histogram h;
  h.num = 2.0;
  h.bucket_limit = {1.0};
  h.bucket = {2.0};
  EXPECT_EQ(detail::histogram_event("", h, 0, 0.0),
            bytes({0x2A, 0x21, 0x0A, 0x1F, 0x2A, 0x1D, 0x19, 0,    0,    0, 0, 0, 0, 0, 0x40, 0x32, 0x08, 0,
                   0,    0,    0,    0,    0,    0xF0, 0x3F, 0x3A, 0x08, 0, 0, 0, 0, 0, 0,    0,    0x40}));
}

TEST(TensorBoard, FileNameFollowsSummaryWriter) {
  const std::string dir = test_util::temp_dir("tb_name");
  {
    // The writer's clock (system_clock), not ::time(), which glibc may read from a coarse clock
    // that lags it by a tick: a name a second past `after` at a second's turn.
    const auto unix_seconds = [] {
      return static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
    };
    const auto before = unix_seconds();
    TensorBoardWriter a(dir + "/run", TensorBoardOptions().filename_suffix(".ember"));
    TensorBoardWriter b(dir + "/run", TensorBoardOptions().filename_suffix(".ember"));
    const auto after = unix_seconds();
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    const std::regex pattern(dir + "/run/events\\.out\\.tfevents\\.(\\d{10})\\." + host + "\\." +
                             std::to_string(::getpid()) + "\\.(\\d+)\\.ember");
    for (const auto* w : {&a, &b}) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(w->path(), m, pattern)) << w->path();
      EXPECT_GE(std::stoll(m[1]), before);
      EXPECT_LE(std::stoll(m[1]), after);
      EXPECT_GT(file_size(w->path()), 0);
    }
    EXPECT_NE(a.path(), b.path());  // same second: the second writer takes n = 1, never the same file
  }
  remove_dir(dir);
}

TEST(TensorBoard, RecordsAreFramedAndEncodedWithTensorBoardsFieldNumbers) {
  const std::string dir = test_util::temp_dir("tb_records");
  std::string path;
  {
    TensorBoardWriter writer(dir, TensorBoardOptions().flush_seconds(3600));
    path = writer.path();
    writer.add_scalar("a", 2.0, 7, 1.5);
    writer.add_scalar("loss/train", 1e-8, 1LL << 40, 1700000000.25);
    writer.add_scalar("now", -3.25, 0);
  }  // the destructor writes the buffered records
  const auto records = read_records(path);
  ASSERT_EQ(records.size(), 4u);

  // Event{wall_time = 1 (fixed64), file_version = 3 (bytes)}.
  const auto version = decode(records[0]);
  EXPECT_EQ(version.size(), 2u);
  EXPECT_EQ(one(version, 3).bytes, "brain.Event:2");
  EXPECT_NEAR(as_double(one(version, 1).number), static_cast<double>(::time(nullptr)), 60);

  // Event{wall_time 1, step 2 (varint), summary 5 {value 1 {tag 1, simple_value 2 (fixed32)}}}:
  // 23 bytes exactly, byte for byte.
  std::string expected = "\x09";
  const double wall = 1.5;
  expected.append(reinterpret_cast<const char*>(&wall), 8);
  // step 7 | summary, 10 bytes | value, 8 bytes | tag "a" | simple_value (4 bytes follow)
  const unsigned char body[] = {0x10, 0x07, 0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, 'a', 0x15};
  expected.append(reinterpret_cast<const char*>(body), sizeof(body));
  const float two = 2.0f;
  expected.append(reinterpret_cast<const char*>(&two), 4);
  EXPECT_EQ(records[1], expected);

  const auto e2 = decode(records[2]);
  EXPECT_EQ(as_double(one(e2, 1).number), 1700000000.25);
  EXPECT_EQ(one(e2, 2).number, uint64_t{1} << 40);
  const auto v2 = decode(one(decode(one(e2, 5).bytes), 1).bytes);
  EXPECT_EQ(one(v2, 1).bytes, "loss/train");
  EXPECT_EQ(one(v2, 2).wire_type, 5);
  EXPECT_EQ(as_float(one(v2, 2).number), 1e-8f);

  const auto e3 = decode(records[3]);
  EXPECT_EQ(e3.count(2), 0u);  // step 0 is proto3's default: not written
  EXPECT_NEAR(as_double(one(e3, 1).number), static_cast<double>(::time(nullptr)), 60);
  EXPECT_EQ(as_float(one(decode(one(decode(one(e3, 5).bytes), 1).bytes), 2).number), -3.25f);
  remove_dir(dir);
}

TEST(TensorBoard, BuffersUntilFlushSecondsOrFlush) {
  const std::string dir = test_util::temp_dir("tb_flush");
  {
    TensorBoardWriter buffered(dir, TensorBoardOptions().flush_seconds(3600));
    const off_t header = file_size(buffered.path());
    EXPECT_GT(header, 0);  // the file_version record is written at once
    buffered.add_scalar("x", 1.0, 1);
    EXPECT_EQ(file_size(buffered.path()), header);
    buffered.flush();
    EXPECT_GT(file_size(buffered.path()), header);
    EXPECT_EQ(read_records(buffered.path()).size(), 2u);

    TensorBoardWriter immediate(dir, unbuffered());
    const off_t start = file_size(immediate.path());
    immediate.add_scalar("x", 1.0, 1);
    EXPECT_GT(file_size(immediate.path()), start);
  }
  remove_dir(dir);
}

// Brute force: bucket i > 0 holds the values in [bucket_limit[i-1], bucket_limit[i]).
void expect_buckets_hold(const DecodedHistogram& h, const std::vector<double>& values) {
  ASSERT_EQ(h.bucket.size(), h.bucket_limit.size());
  ASSERT_FALSE(h.bucket.empty());
  EXPECT_EQ(h.bucket.front(), 0);  // torch keeps one empty bucket left of the first used one
  EXPECT_GT(h.bucket.back(), 0);
  for (size_t i = 1; i < h.bucket.size(); ++i) {
    EXPECT_LT(h.bucket_limit[i - 1], h.bucket_limit[i]);
    double n = 0;
    for (double v : values) n += (v >= h.bucket_limit[i - 1] && v < h.bucket_limit[i]) ? 1 : 0;
    EXPECT_EQ(h.bucket[i], n) << "bucket " << i << " [" << h.bucket_limit[i - 1] << ", " << h.bucket_limit[i]
                              << ")";
  }
}

double total(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0);
}

TEST(TensorBoard, HistogramCountsEveryFiniteValueOnce) {
  const std::string dir = test_util::temp_dir("tb_histogram");
  torch::manual_seed(0);
  const auto finite = torch::cat(
      {torch::randn({991}, torch::kFloat32) * 3, torch::tensor({0.0f, 1e-13f, -1e-13f, 2.5f, 2.5f})});
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const auto values = torch::cat({finite, torch::tensor({nan, inf, -inf, nan})}).reshape({40, 25});
  std::string path;
  {
    TensorBoardWriter writer(dir, unbuffered());
    path = writer.path();
    writer.add_histogram("w", values, 3);
    writer.add_histogram("ints", torch::arange(-5, 20, torch::kInt64), 4);
    writer.add_histogram("all_nan", torch::full({4}, nan), 5);
    writer.add_histogram("wide", torch::tensor({1.0, -2.0, 1e25}, torch::kDouble), 6);
  }
  const auto records = read_records(path);
  ASSERT_EQ(records.size(), 5u);

  const auto h = decode_histogram(records[1], "w");
  const auto f = finite.to(torch::kDouble);
  const std::vector<double> fv(f.data_ptr<double>(), f.data_ptr<double>() + f.numel());
  EXPECT_EQ(h.num, 996);  // the 4 non-finite values are skipped
  EXPECT_EQ(total(h.bucket), 996);
  EXPECT_EQ(h.min, f.min().item<double>());
  EXPECT_EQ(h.max, f.max().item<double>());
  // Float64 sums of 996 values in two orders: 996 roundings of the sum of |terms|.
  EXPECT_TRUE(test_util::near(h.sum, f.sum().item<double>(),
                              test_util::rounding_bound(torch::kFloat64, 996, f.abs().sum().item<double>())));
  EXPECT_TRUE(test_util::near(h.sum_squares, (f * f).sum().item<double>(),
                              test_util::rounding_bound(torch::kFloat64, 997, (f * f).sum().item<double>())));
  expect_buckets_hold(h, fv);
  EXPECT_EQ(decode(records[1]).find(2)->second.number, 3u);  // step

  const auto ints = decode_histogram(records[2], "ints");
  EXPECT_EQ(ints.num, 25);
  EXPECT_EQ(total(ints.bucket), 25);
  EXPECT_EQ(ints.min, -5);
  EXPECT_EQ(ints.max, 19);
  EXPECT_EQ(ints.sum, 175);
  std::vector<double> iv;
  for (int i = -5; i < 20; ++i) iv.push_back(i);
  expect_buckets_hold(ints, iv);

  const auto empty = decode_histogram(records[3], "all_nan");
  EXPECT_EQ(empty.num, 0);
  EXPECT_TRUE(empty.bucket.empty());
  EXPECT_TRUE(empty.bucket_limit.empty());

  const auto wide = decode_histogram(records[4], "wide");
  EXPECT_EQ(wide.num, 3);
  EXPECT_EQ(wide.max, 1e25);
  EXPECT_EQ(total(wide.bucket), 2);  // 1e25 is beyond the last edge (~1e20), as in torch
  expect_buckets_hold(wide, {1.0, -2.0});
  remove_dir(dir);
}

TEST(TensorBoardCuda, HistogramMatchesCpu) {
  EMBER_REQUIRE_CUDA();
  const std::string dir = test_util::temp_dir("tb_histogram_cuda");
  torch::manual_seed(1);
  auto values = torch::randn({4096}, torch::kFloat32) * 10;
  values[7] = std::numeric_limits<float>::quiet_NaN();
  std::string path;
  {
    TensorBoardWriter writer(dir, unbuffered());
    path = writer.path();
    writer.add_histogram("x", values, 0);
    writer.add_histogram("x", values.cuda(), 0);
    writer.add_histogram("x", values.cuda().to(torch::kBFloat16), 0);
    writer.add_histogram("x", values.to(torch::kBFloat16), 0);
  }
  const auto records = read_records(path);
  ASSERT_EQ(records.size(), 5u);
  const auto cpu = decode_histogram(records[1], "x"), cuda = decode_histogram(records[2], "x");
  EXPECT_EQ(cuda.num, 4095);
  EXPECT_EQ(cuda.bucket, cpu.bucket);
  EXPECT_EQ(cuda.bucket_limit, cpu.bucket_limit);
  EXPECT_EQ(cuda.min, cpu.min);
  EXPECT_EQ(cuda.max, cpu.max);
  EXPECT_NEAR(cuda.sum, cpu.sum, 1e-9 * cpu.sum_squares);
  const auto bf_cuda = decode_histogram(records[3], "x"), bf_cpu = decode_histogram(records[4], "x");
  EXPECT_EQ(bf_cuda.bucket, bf_cpu.bucket);
  EXPECT_EQ(bf_cuda.bucket_limit, bf_cpu.bucket_limit);
  remove_dir(dir);
}

TEST(TensorBoard, HistogramRejectsEmptyAndComplexTensors) {
  const std::string dir = test_util::temp_dir("tb_histogram_bad");
  {
    TensorBoardWriter writer(dir);
    try {
      writer.add_histogram("empty", torch::zeros({0, 3}), 0);
      ADD_FAILURE() << "no error for an empty tensor";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'empty': empty tensor [0, 3]"), std::string::npos) << e.what();
    }
    EXPECT_THROW(writer.add_histogram("c", torch::zeros({2}, torch::kComplexFloat), 0), Error);
  }
  remove_dir(dir);
}

TEST(TensorBoard, UncreatableLogDirIsAClearError) {
  const std::string dir = test_util::temp_dir("tb_unwritable");
  std::ofstream(dir + "/a_file") << "x";
  try {
    TensorBoardWriter writer(dir + "/a_file/run");
    ADD_FAILURE() << "no error for a log_dir under a regular file";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[monitor::TensorBoardWriter] cannot create the log folder " + dir + "/a_file/run"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("Not a directory"), std::string::npos) << what;
  }
  remove_dir(dir);
}

TEST(TensorBoard, DeletedFolderIsAnErrorNotSilentLoss) {
  const std::string dir = test_util::temp_dir("tb_deleted");
  TensorBoardWriter writer(dir + "/run", unbuffered());
  writer.add_scalar("x", 1.0, 0);
  remove_dir(dir);
  try {
    writer.add_scalar("x", 2.0, 1);
    ADD_FAILURE() << "no error after the log folder was removed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(writer.path() + " was deleted"), std::string::npos) << e.what();
  }
  try {
    writer.flush();
    ADD_FAILURE() << "the writer stayed open after a failed write";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("an earlier write failed"), std::string::npos) << e.what();
  }
}

// A full disk, simulated with the file size limit (write() fails with EFBIG).
TEST(TensorBoard, FailedWriteIsAClearError) {
  const std::string dir = test_util::temp_dir("tb_full");
  TensorBoardWriter writer(dir, unbuffered());
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string what;
  try {
    for (int i = 0; i < 1000; ++i) writer.add_scalar("x", i, i);
  } catch (const Error& e) {
    what = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(what.find("writing " + writer.path() + ": File too large"), std::string::npos) << what;
  EXPECT_NE(what.find("disk full?"), std::string::npos) << what;
  EXPECT_THROW(writer.add_scalar("x", 0, 0), Error);
  remove_dir(dir);
}

}  // namespace
}  // namespace ember::monitor
