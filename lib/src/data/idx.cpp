#include "ember/data/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/check.h"
#include "ember/core/file.h"

namespace ember::data {
namespace {

struct TypeInfo {
  uint8_t code;
  torch::ScalarType dtype;
  size_t bytes;
};
constexpr std::array<TypeInfo, 6> kTypes{{{0x08, torch::kUInt8, 1},
                                          {0x09, torch::kInt8, 1},
                                          {0x0B, torch::kInt16, 2},
                                          {0x0C, torch::kInt32, 4},
                                          {0x0D, torch::kFloat32, 4},
                                          {0x0E, torch::kFloat64, 8}}};

std::string basename(const std::string& path) {
  return path.substr(path.find_last_of('/') + 1);
}

// An IDX file opened through zlib, which inflates gzip and passes plain files
// through unchanged; reads are bounded by what the caller asks for, so a
// small compressed file cannot make it inflate gigabytes.
class IdxStream {
 public:
  explicit IdxStream(const std::string& path) : path_(path) {
    // One descriptor for both the size and the stream: the file measured is the file read.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EMBER_CHECK(fd >= 0, "[data::read_idx] {}: cannot open ({})", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      ember::detail::fail("[data::read_idx] {}: not a regular file", path);
    }
    file_bytes_ = static_cast<uint64_t>(st.st_size);
    f_ = gzdopen(fd, "rb");
    if (f_ == nullptr) ::close(fd);
    EMBER_CHECK(f_ != nullptr, "[data::read_idx] {}: cannot open (out of memory)", path);
    gzbuffer(f_, 1 << 20);
  }
  uint64_t file_bytes() const { return file_bytes_; }
  // Whether the file is gzip (known once the header has been read).
  bool compressed() { return gzdirect(f_) == 0; }
  ~IdxStream() { gzclose(f_); }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;

  // Reads up to `n` bytes into `dst`; returns how many (fewer at the end).
  size_t read(void* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const auto want = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(f_, static_cast<uint8_t*>(dst) + done, want);
      if (got < 0) {
        int err = 0;
        const char* msg = gzerror(f_, &err);
        ember::detail::fail("[data::read_idx] {}: corrupt gzip stream ({}); re-copy or re-download the file",
                            basename(path_), msg ? msg : "unknown error");
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    if (done < n) check_clean_end();
    return done;
  }

 private:
  // gzread stops silently at a gzip stream that was cut short.
  void check_clean_end() {
    int err = 0;
    const char* msg = gzerror(f_, &err);
    EMBER_CHECK(err == Z_OK || err == Z_BUF_ERROR, "[data::read_idx] {}: corrupt gzip stream ({})",
                basename(path_), msg);
    EMBER_CHECK(gzdirect(f_) || err != Z_BUF_ERROR,
                "[data::read_idx] {}: the gzip stream is truncated (the file was cut short); re-copy it",
                basename(path_));
  }

  std::string path_;
  gzFile f_ = nullptr;
  uint64_t file_bytes_ = 0;
};

// Deflate's largest expansion (a stream of back-references: 258 bytes per
// 2 bits at best, about 1032:1), the bound on what a gzip file can inflate to.
constexpr uint64_t kMaxDeflateRatio = 1032;

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

void write_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

std::string find_split_file(const std::string& root, const std::string& stem) {
  for (const char* ext : {".gz", ""}) {
    const std::string p = root + "/" + stem + ext;
    if (core::is_file(p)) return p;
  }
  ember::detail::fail(
      "[data::load_mnist] {}: neither {} nor {}.gz found; set data.root to the folder holding "
      "the IDX files (Debian: apt-get install dataset-fashion-mnist -> /usr/share/datasets/fashion-mnist)",
      root, stem, stem);
}

}  // namespace

torch::Tensor read_idx(const std::string& path, int64_t max_bytes) {
  IdxStream in(path);
  const std::string name = basename(path);
  uint8_t head[4];
  const size_t got_head = in.read(head, 4);
  EMBER_CHECK(got_head == 4, "[data::read_idx] {}: only {} bytes, too short for an IDX header", name,
              got_head);
  const uint32_t magic = read_be32(head);
  const TypeInfo* type = nullptr;
  for (const auto& t : kTypes)
    if (head[2] == t.code) type = &t;
  const int ndim = head[3];
  if (head[0] != 0 || head[1] != 0 || type == nullptr || ndim == 0) {
    std::string hint = "is this an IDX file?";
    if (head[0] == 0x1f && head[1] == 0x8b) hint = "it is gzip inside gzip: decompress it once";
    ember::detail::fail(
        "[data::read_idx] {}: bad magic 0x{:08x}: expected 0x0000TTDD with type TT in "
        "{{08,09,0B,0C,0D,0E}} and DD >= 1 dimensions ({})",
        name, magic, hint);
  }
  std::vector<uint8_t> dims(4 * static_cast<size_t>(ndim));
  const size_t got_dims = in.read(dims.data(), dims.size());
  EMBER_CHECK(got_dims == dims.size(), "[data::read_idx] {}: truncated header ({} of {} bytes)", name,
              4 + got_dims, 4 + dims.size());
  std::vector<int64_t> shape;
  uint64_t data_bytes = type->bytes;
  // Also the strides' span (zero sizes counted as 1): an empty tensor of
  // 0 x 2^32 x 2^32 x 2^32 holds no byte, but LibTorch cannot stride it.
  uint64_t span = type->bytes;
  bool overflow = false;
  for (int d = 0; d < ndim; ++d) {
    shape.push_back(read_be32(dims.data() + 4 * d));
    const auto size = static_cast<uint64_t>(shape.back());
    overflow = overflow || __builtin_mul_overflow(data_bytes, size, &data_bytes) ||
               __builtin_mul_overflow(span, std::max<uint64_t>(size, 1), &span) ||
               span > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  // Bounded before anything is allocated or inflated.
  EMBER_CHECK(
      !overflow && data_bytes <= static_cast<uint64_t>(max_bytes),
      "[data::read_idx] {}: the header promises {} {} values ({} bytes), more than the limit of {} bytes; "
      "the file is damaged, or raise the limit (read_idx's max_bytes)",
      name, fmt::join(shape, "x"), c10::toString(type->dtype),
      overflow ? std::string("over 2^63") : std::to_string(data_bytes), max_bytes);

  // And by the file itself, before the tensor is allocated: a plain file holds
  // the data as it is, and deflate expands at most 1032:1, so a small file
  // cannot make the reader allocate gigabytes it then fails to fill.
  const uint64_t file_bytes = in.file_bytes();
  const uint64_t header_bytes = 4 + dims.size();
  const uint64_t can_hold =
      in.compressed() ? file_bytes * kMaxDeflateRatio : file_bytes - std::min(file_bytes, header_bytes);
  EMBER_CHECK(data_bytes <= can_hold,
              "[data::read_idx] {}: truncated: the header promises {} bytes of data ({}), but the {}file "
              "has {} bytes; the file was cut short, re-copy it",
              name, data_bytes, fmt::join(shape, "x"), in.compressed() ? "compressed " : "", file_bytes);
  torch::Tensor out = torch::empty(shape, torch::TensorOptions().dtype(type->dtype));
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  const size_t have = in.read(dst, data_bytes);
  EMBER_CHECK(have == data_bytes,
              "[data::read_idx] {}: truncated: the header promises {} bytes of data ({}), found {}; "
              "the file was cut short, re-copy it",
              name, data_bytes, fmt::join(shape, "x"), have);
  std::vector<uint8_t> rest(64 << 10);  // count what follows, up to a bound
  const size_t extra = in.read(rest.data(), rest.size());
  EMBER_CHECK(extra == 0,
              "[data::read_idx] {}: {}{} unexpected bytes after the data ({} promised by the header); "
              "the file is corrupt or not IDX",
              name, extra == rest.size() ? "at least " : "", extra, data_bytes);
  if (type->bytes > 1) {  // big-endian to host (little-endian) order, in place
    const size_t count = data_bytes / type->bytes;
    for (size_t i = 0; i < count; ++i) std::reverse(dst + i * type->bytes, dst + (i + 1) * type->bytes);
  }
  return out;
}

void write_idx(const std::string& path, const torch::Tensor& tensor) {
  const TypeInfo* type = nullptr;
  for (const auto& t : kTypes)
    if (tensor.scalar_type() == t.dtype) type = &t;
  EMBER_CHECK(type != nullptr, "[data::write_idx] {}: dtype {} has no IDX type code", path,
              c10::toString(tensor.scalar_type()));
  EMBER_CHECK(tensor.dim() >= 1 && tensor.dim() <= 255, "[data::write_idx] {}: rank {} not supported", path,
              tensor.dim());
  const torch::Tensor t = tensor.contiguous().cpu();
  std::vector<uint8_t> out{0, 0, type->code, static_cast<uint8_t>(t.dim())};
  for (int64_t s : t.sizes()) write_be32(out, static_cast<uint32_t>(s));
  const auto* src = static_cast<const uint8_t*>(t.data_ptr());
  const size_t count = static_cast<size_t>(t.numel());
  for (size_t i = 0; i < count; ++i)
    for (size_t b = 0; b < type->bytes; ++b) out.push_back(src[i * type->bytes + type->bytes - 1 - b]);

  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  gzFile f = gzopen(path.c_str(), gz ? "wb6" : "wbT");  // 'T': plain, no gzip header
  EMBER_CHECK(f != nullptr, "[data::write_idx] {}: cannot create ({})", path, std::strerror(errno));
  const int written = gzwrite(f, out.data(), static_cast<unsigned>(out.size()));
  const int rc = gzclose(f);
  EMBER_CHECK(written == static_cast<int>(out.size()) && rc == Z_OK, "[data::write_idx] {}: write failed",
              path);
}

TensorDataset load_mnist(const std::string& root, Split split, int64_t classes) {
  EMBER_CHECK(classes >= 1, "[data::load_mnist] classes must be >= 1, got {}", classes);
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = find_split_file(root, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_split_file(root, prefix + "-labels-idx1-ubyte");
  torch::Tensor images = read_idx(images_path);
  torch::Tensor labels = read_idx(labels_path);
  EMBER_CHECK(images.dim() == 3 && images.scalar_type() == torch::kUInt8,
              "[data::load_mnist] {}: expected uint8 images [N, H, W], got {} {}", images_path,
              c10::toString(images.scalar_type()), fmt::join(images.sizes(), "x"));
  EMBER_CHECK(labels.dim() == 1, "[data::load_mnist] {}: expected labels [N], got {}", labels_path,
              fmt::join(labels.sizes(), "x"));
  EMBER_CHECK(images.size(0) == labels.size(0),
              "[data::load_mnist] {} has {} images but {} has {} labels; the two files come from "
              "different splits or one is damaged",
              basename(images_path), images.size(0), basename(labels_path), labels.size(0));
  labels = labels.to(torch::kInt64);
  const torch::Tensor bad = ((labels < 0) | (labels >= classes)).nonzero();
  if (bad.numel() > 0) {
    const int64_t at = bad.flatten()[0].item<int64_t>();
    throw Error(
        ErrorKind::kData,
        fmt::format(
            "[data::load_mnist] {}: sample {} has label {}, but the dataset has {} classes (labels 0..{}); "
            "{} of {} labels are out of range: the file is damaged or not of this dataset",
            labels_path, at, labels[at].item<int64_t>(), classes, classes - 1, bad.size(0), labels.size(0)));
  }
  return {images, labels};
}

}  // namespace ember::data
