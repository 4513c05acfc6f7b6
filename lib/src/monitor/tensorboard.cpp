// TensorBoardWriter: file handling and histograms here; the protobuf wire
// encoding and the record framing in tensorboard_record.cpp.
#include "ember/monitor/tensorboard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <vector>

#include "core/check.h"
#include "ember/core/error.h"
#include "ember/core/file.h"
#include "monitor/tensorboard_record.h"

namespace ember::monitor {

namespace {

constexpr size_t kMaxBufferedBytes = size_t{1} << 20;

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// SummaryWriter's default (bins="tensorflow") bucket edges, computed the same
// way in the same float64 arithmetic, so they match bit for bit:
//   v = 1e-12; while v < 1e20: buckets.append(v); v *= 1.1
//   edges = [-b for b in reversed(buckets)] + [0] + buckets   (1549 edges)
const std::vector<double>& default_bucket_edges() {
  static const std::vector<double> edges = [] {
    std::vector<double> positive;
    for (double v = 1e-12; v < 1e20; v *= 1.1) positive.push_back(v);
    std::vector<double> all;
    all.reserve(2 * positive.size() + 1);
    for (auto it = positive.rbegin(); it != positive.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), positive.begin(), positive.end());
    return all;
  }();
  return edges;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

struct TensorBoardWriter::Impl {
  TensorBoardOptions options;
  std::string path;
  int fd = -1;
  std::string buffer;  // framed records not yet written
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  std::string failure;  // set once a write failed; the writer is closed from then on
  std::map<std::string, torch::Tensor> edges_by_device;  // default_bucket_edges() per device
  std::mutex mutex;

  void check_open() const {
    EMBER_CHECK(failure.empty(),
                "[monitor::TensorBoardWriter] {}: an earlier write failed ({}); this writer is closed, "
                "create a new one",
                path, failure);
  }

  [[noreturn]] void fail_write(const std::string& what) {
    failure = what;
    buffer.clear();
    ::close(fd);
    fd = -1;
    ember::detail::fail("[monitor::TensorBoardWriter] {}", what);
  }

  // Writes the buffer; on any failure closes the writer and throws.
  void write_buffer() {
    check_open();
    struct stat st {};
    if (::fstat(fd, &st) != 0) fail_write(fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
    if (st.st_nlink == 0)
      fail_write(
          fmt::format("{} was deleted (or its folder removed) while open; {} bytes of events not written",
                      path, buffer.size()));
    size_t done = 0;
    while (done < buffer.size()) {
      const ssize_t n = ::write(fd, buffer.data() + done, buffer.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail_write(fmt::format("writing {}: {} ({} of {} bytes of events written; disk full?)", path,
                               std::strerror(errno), done, buffer.size()));
      }
      done += static_cast<size_t>(n);
    }
    buffer.clear();
    last_write = std::chrono::steady_clock::now();
  }

  void add(const std::string& payload) {
    check_open();
    detail::append_record(buffer, payload);
    const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_write).count();
    if (options.flush_seconds() <= 0 || since >= options.flush_seconds() ||
        buffer.size() >= kMaxBufferedBytes)
      write_buffer();
  }

  const torch::Tensor& edges_on(const torch::Device& device) {
    auto& edges = edges_by_device[device.str()];
    if (!edges.defined()) {
      const auto& host = default_bucket_edges();
      edges = torch::tensor(host, torch::kDouble).to(device);
    }
    return edges;
  }
};

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir, TensorBoardOptions options)
    : impl_(std::make_unique<Impl>()) {
  EMBER_CHECK(!log_dir.empty(),
              "[monitor::TensorBoardWriter] empty log_dir; give a folder such as runs/exp1");
  EMBER_CHECK(options.filename_suffix().find('/') == std::string::npos,
              "[monitor::TensorBoardWriter] filename_suffix '{}' contains '/'; it is appended to a file name",
              options.filename_suffix());
  impl_->options = std::move(options);
  try {
    core::make_dirs(log_dir);
  } catch (const Error& e) {
    ember::detail::fail("[monitor::TensorBoardWriter] cannot create the log folder {}: {}", log_dir,
                        e.what());
  }
  const std::string dir = log_dir.back() == '/' ? log_dir : log_dir + "/";
  const auto seconds = static_cast<int64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  const std::string host = host_name();
  const auto pid = static_cast<int64_t>(::getpid());
  // O_EXCL: never append to or truncate another writer's file; take the next n.
  for (int64_t n = 0; impl_->fd < 0; ++n) {
    impl_->path = fmt::format("{}events.out.tfevents.{:010d}.{}.{}.{}{}", dir, seconds, host, pid, n,
                              impl_->options.filename_suffix());
    impl_->fd = ::open(impl_->path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (impl_->fd < 0 && errno != EEXIST)
      ember::detail::fail("[monitor::TensorBoardWriter] cannot create {}: {} (is {} writable?)", impl_->path,
                          std::strerror(errno), log_dir);
  }
  // Written at once, as SummaryWriter does: TensorBoard sees the run immediately.
  detail::append_record(impl_->buffer, detail::file_version_event("brain.Event:2", unix_seconds_now()));
  impl_->write_buffer();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (!impl_) return;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->fd < 0) return;  // closed by a failed write, which threw then
  try {
    if (!impl_->buffer.empty()) impl_->write_buffer();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return;
  }
  if (::close(impl_->fd) != 0)
    std::fprintf(stderr, "[monitor::TensorBoardWriter] closing %s: %s (the last events may be lost)\n",
                 impl_->path.c_str(), std::strerror(errno));
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  add_scalar(tag, value, step, unix_seconds_now());
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->add(detail::scalar_event(tag, static_cast<float>(value), step, wall_time));
}

void TensorBoardWriter::add_histogram(const std::string& tag, const torch::Tensor& values, int64_t step) {
  const double wall_time = unix_seconds_now();
  EMBER_CHECK(values.defined(), "[monitor::TensorBoardWriter::add_histogram] '{}': undefined tensor", tag);
  EMBER_CHECK(values.numel() > 0,
              "[monitor::TensorBoardWriter::add_histogram] '{}': empty tensor [{}]; a histogram needs values",
              tag, fmt::join(values.sizes(), ", "));
  EMBER_CHECK(!values.is_complex(),
              "[monitor::TensorBoardWriter::add_histogram] '{}': complex dtype {}; log torch::abs(values) or "
              "the real and imaginary parts",
              tag, c10::toString(values.scalar_type()));
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->check_open();

  // On the tensor's device, in float64 (torch's make_histogram casts to float64 too).
  torch::NoGradGuard no_grad;
  const auto x = values.detach().reshape({-1}).to(torch::kDouble);
  const auto& edges = impl_->edges_on(x.device());
  const int64_t num_edges = edges.numel();
  const double inf = std::numeric_limits<double>::infinity();
  const auto finite = torch::isfinite(x);
  const auto finite_x = torch::where(finite, x, torch::zeros({}, x.options()));
  // numpy.histogram's bins: bin b holds edges[b] <= x < edges[b+1]; the last
  // bin also holds x == edges.back(). Everything else (out of range, NaN, inf)
  // goes to the extra bin num_edges - 1, dropped below.
  auto bin = torch::searchsorted(edges, x, /*out_int32=*/false, /*right=*/true) - 1;
  bin = torch::where(x == default_bucket_edges().back(), num_edges - 2, bin);
  bin = torch::where(finite & (bin >= 0) & (bin < num_edges - 1), bin, num_edges - 1);
  const auto counts = torch::bincount(bin, {}, num_edges).narrow(0, 0, num_edges - 1).to(torch::kDouble);
  const auto stats =
      torch::stack({finite.sum().to(torch::kDouble), torch::where(finite, x, inf).min(),
                    torch::where(finite, x, -inf).max(), finite_x.sum(), (finite_x * finite_x).sum()});
  const auto host = torch::cat({stats, counts}).cpu();  // the one copy to the host
  const double* p = host.data_ptr<double>();
  const double* c = p + 5;
  const int64_t num_bins = num_edges - 1;

  detail::Histogram h;
  h.num = p[0];
  if (h.num > 0) {  // else: every value NaN/inf, an empty histogram
    h.min = p[1];
    h.max = p[2];
    h.sum = p[3];
    h.sum_squares = p[4];
  }
  // torch's make_histogram keeps the buckets from the one left of the first
  // non-empty bucket to the last non-empty one; bucket_limit holds right edges,
  // so a first bucket (empty) ending at edges[0] is added when bucket 0 is used.
  int64_t first = 0;
  while (first < num_bins && c[first] == 0) ++first;
  int64_t last = num_bins - 1;
  while (last >= 0 && c[last] == 0) --last;
  if (first <= last) {  // else no value within +-1e20: no buckets
    const auto& e = default_bucket_edges();
    if (first == 0) h.bucket.push_back(0.0);
    for (int64_t b = std::max<int64_t>(first - 1, 0); b <= last; ++b) h.bucket.push_back(c[b]);
    h.bucket_limit.assign(e.begin() + first, e.begin() + last + 2);
  }
  impl_->add(detail::histogram_event(tag, h, step, wall_time));
}

void TensorBoardWriter::flush() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->write_buffer();
}

const std::string& TensorBoardWriter::path() const {
  return impl_->path;
}

}  // namespace ember::monitor
