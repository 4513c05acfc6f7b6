#include "ember/data/image_folder.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#if EMBER_WITH_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

#include "core/check.h"

namespace ember::data {
namespace {

namespace fs = std::filesystem;

constexpr const char* kWhere = "[data::load_image_folder]";
// Bump when the cache's layout or the decoding changes, so old caches are rebuilt.
constexpr const char* kCacheFormat = "ember.image_folder.v1";

/// One candidate image found by the scan.
struct Entry {
  std::string rel;  // path inside root, '/'-separated: <class>/.../<file>
  int64_t label;
  int64_t bytes;     // file size
  int64_t mtime_ns;  // modification time
};

struct Scan {
  std::vector<std::string> classes;
  std::vector<Entry> entries;  // by class, then as torchvision orders them
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// ".jpg"-style lower-case extensions.
std::vector<std::string> normalised_extensions(const std::vector<std::string>& extensions) {
  std::vector<std::string> out;
  for (const std::string& e : extensions) {
    if (e.empty()) continue;
    out.push_back(lower(e.front() == '.' ? e : "." + e));
  }
  return out;
}

const char* mode_name(ResizeMode mode) {
  return mode == ResizeMode::kStretch ? "stretch" : "shorter_side_center_crop";
}

void check_options(const ImageFolderOptions& o) {
  const auto& s = o.size();
  EMBER_CHECK(s.size() == 2 && s[0] > 0 && s[1] > 0 && s[0] <= INT_MAX && s[1] <= INT_MAX,
              "{} size must be {{H, W}} with both > 0, got {{{}}}", kWhere, fmt::join(s, ", "));
  EMBER_CHECK(o.threads() >= 0, "{} threads must be >= 0 (0 = one per hardware thread), got {}", kWhere,
              o.threads());
  EMBER_CHECK(!normalised_extensions(o.extensions()).empty(),
              "{} extensions is empty: no file would count as an image (default: .jpg .jpeg .png .bmp)",
              kWhere);
}

/// Finds classes and images as torchvision's ImageFolder does: classes are
/// the sub-folders of root (symlinks followed), sorted; the images of a class
/// are found by a recursive walk and sorted by (folder path, file name),
/// which is the order of `sorted(os.walk(...))` + `sorted(fnames)`.
Scan scan_folder(const std::string& root, const ImageFolderOptions& o) {
  std::error_code ec;
  EMBER_CHECK(
      fs::exists(root, ec),
      "{} {}: no such folder; pass the folder holding one sub-folder per class (root/<class>/<image>)",
      kWhere, root);
  EMBER_CHECK(fs::is_directory(root, ec),
              "{} {}: not a folder; pass the folder holding one sub-folder per class", kWhere, root);
  const std::vector<std::string> extensions = normalised_extensions(o.extensions());
  Scan scan;
  try {
    for (const auto& entry : fs::directory_iterator(root))
      if (entry.is_directory()) scan.classes.push_back(entry.path().filename().string());
    std::sort(scan.classes.begin(), scan.classes.end());
    EMBER_CHECK(!scan.classes.empty(),
                "{} {}: no class folders; expected root/<class>/<image>, one sub-folder per class "
                "(torchvision's ImageFolder layout)",
                kWhere, root);
    const fs::path base(root);
    for (size_t label = 0; label < scan.classes.size(); ++label) {
      const fs::path dir = base / scan.classes[label];
      std::vector<std::pair<std::string, std::string>> found;  // (folder inside root, file name)
      const auto walk_options =
          fs::directory_options::follow_directory_symlink | fs::directory_options::skip_permission_denied;
      for (auto it = fs::recursive_directory_iterator(dir, walk_options);
           it != fs::recursive_directory_iterator(); ++it) {
        if (!it->is_regular_file(ec)) continue;
        const fs::path& p = it->path();
        if (std::find(extensions.begin(), extensions.end(), lower(p.extension().string())) ==
            extensions.end())
          continue;
        found.emplace_back(p.parent_path().lexically_relative(base).generic_string(), p.filename().string());
      }
      EMBER_CHECK(
          !found.empty(),
          "{} {}: class folder '{}' has no images (extensions {}, searched recursively); add images or "
          "remove the folder",
          kWhere, dir.string(), scan.classes[label], fmt::join(extensions, " "));
      std::sort(found.begin(), found.end());
      for (const auto& [folder, name] : found) {
        const fs::path path = base / folder / name;
        const auto mtime = fs::last_write_time(path);
        scan.entries.push_back(
            {folder + "/" + name, static_cast<int64_t>(label), static_cast<int64_t>(fs::file_size(path)),
             std::chrono::duration_cast<std::chrono::nanoseconds>(mtime.time_since_epoch()).count()});
      }
    }
  } catch (const fs::filesystem_error& e) {
    detail::fail("{} {}: cannot list the folder: {}", kWhere, root, e.what());
  }
  return scan;
}

/// Everything a cached dataset depends on, one fact per line.
std::string cache_key(const std::string& root, const ImageFolderOptions& o, const Scan& scan) {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(root, ec);
  if (ec) canonical = fs::absolute(root);
  std::string key =
      fmt::format("{}\nroot {}\nsize {}x{}\nresize {}\nclasses {}\n", kCacheFormat, canonical.string(),
                  o.size()[0], o.size()[1], mode_name(o.resize()), fmt::join(scan.classes, "/"));
  for (const Entry& e : scan.entries)
    key += fmt::format("file {} bytes {} mtime_ns {}\n", e.rel, e.bytes, e.mtime_ns);
  return key;
}

/// The first line where two keys differ, for the cache message.
std::string first_difference(const std::string& cached, const std::string& now) {
  size_t a = 0, b = 0;
  while (a < cached.size() || b < now.size()) {
    size_t ae = cached.find('\n', a), be = now.find('\n', b);
    if (ae == std::string::npos) ae = cached.size();
    if (be == std::string::npos) be = now.size();
    std::string la = cached.substr(a, ae - a), lb = now.substr(b, be - b);
    if (la != lb)
      return fmt::format("cached '{}', now '{}'", la.empty() ? "(end)" : la, lb.empty() ? "(end)" : lb);
    a = ae + 1;
    b = be + 1;
  }
  return "keys differ";
}

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

/// Throws (a std::exception) unless `v` is a list of strings.
std::vector<std::string> strings_of(const c10::IValue& v) {
  EMBER_CHECK(v.isList(), "expected a list of strings, got {}", v.tagKind());
  std::vector<std::string> out;
  for (const c10::IValue& x : v.toListRef()) out.push_back(x.toStringRef());
  return out;
}

std::string join_path(const std::string& root, const std::string& rel) {
  return (fs::path(root) / rel).string();
}

struct CacheRead {
  std::optional<ImageFolder> hit;
  CacheStatus status;
  std::string message;  // why there was no hit
};

/// Reads the cache at `path` if it holds the dataset `key` describes. Any
/// failure to read it (a partial file, another format, inconsistent contents)
/// is reported as kCorrupt, never thrown.
CacheRead read_cache(const std::string& path, const std::string& key, const std::string& root,
                     const ImageFolderOptions& o) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    return {std::nullopt, CacheStatus::kCreated, fmt::format("{}: no cache file yet", path)};
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    c10::IValue format, cached_key;
    archive.read("format", format);
    EMBER_CHECK(format.isString(), "no format string");
    if (format.toStringRef() != kCacheFormat)
      return {std::nullopt, CacheStatus::kStale,
              fmt::format("{}: written as '{}', this Ember reads '{}'", path, format.toStringRef(),
                          kCacheFormat)};
    archive.read("key", cached_key);
    EMBER_CHECK(cached_key.isString(), "no key string");
    if (cached_key.toStringRef() != key)
      return {std::nullopt, CacheStatus::kStale,
              fmt::format("{}: made for other files or options (first difference: {})", path,
                          first_difference(cached_key.toStringRef(), key))};
    c10::IValue classes, files, skipped_files, skipped_reasons;
    archive.read("classes", classes);
    archive.read("files", files);
    archive.read("skipped_files", skipped_files);
    archive.read("skipped_reasons", skipped_reasons);
    ImageFolder r;
    archive.read("inputs", r.data.inputs);
    archive.read("targets", r.data.targets);
    r.classes = strings_of(classes);
    const std::vector<std::string> rel = strings_of(files), skipped_rel = strings_of(skipped_files),
                                   reasons = strings_of(skipped_reasons);
    const torch::Tensor& x = r.data.inputs;
    const torch::Tensor& y = r.data.targets;
    const auto n = static_cast<int64_t>(rel.size());
    EMBER_CHECK(x.defined() && x.scalar_type() == torch::kUInt8 && x.dim() == 4 && x.size(0) == n && n > 0 &&
                    x.size(1) == o.size()[0] && x.size(2) == o.size()[1] && x.size(3) == 3,
                "inputs do not match the file list");
    EMBER_CHECK(y.defined() && y.scalar_type() == torch::kInt64 && y.dim() == 1 && y.size(0) == n &&
                    y.min().item<int64_t>() >= 0 &&
                    y.max().item<int64_t>() < static_cast<int64_t>(r.classes.size()),
                "targets do not match the file list");
    EMBER_CHECK(skipped_rel.size() == reasons.size(), "skipped files and reasons differ in number");
    if (!skipped_rel.empty() && o.on_error() == OnError::kFail)
      return {std::nullopt, CacheStatus::kStale,
              fmt::format("{}: made with on_error=skip, leaving out {} unreadable files", path,
                          skipped_rel.size())};
    for (const std::string& f : rel) r.files.push_back(join_path(root, f));
    for (size_t i = 0; i < skipped_rel.size(); ++i)
      r.skipped.push_back(join_path(root, skipped_rel[i]) + ": " + reasons[i]);
    r.cache_status = CacheStatus::kLoaded;
    r.cache_message = fmt::format("{}: loaded", path);
    return {std::move(r), CacheStatus::kLoaded, ""};
  } catch (const std::exception& e) {
    return {std::nullopt, CacheStatus::kCorrupt,
            fmt::format("{}: unreadable ({})", path, first_line(e.what()))};
  }
}

#if EMBER_WITH_OPENCV

/// Fails before any decoding when the cache could not be written afterwards.
void check_cache_writable(const std::string& path) {
  std::error_code ec;
  EMBER_CHECK(!fs::is_directory(path, ec), "{} cache {}: is a folder; pass the path of a file", kWhere, path);
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  fs::create_directories(dir, ec);
  EMBER_CHECK(!ec && ::access(dir.c_str(), W_OK) == 0,
              "{} cache {}: cannot write into {} ({}); pass another cache path, or cache(\"\") for none",
              kWhere, path, dir.string(),
              ec ? ec.message() : std::error_code(errno, std::generic_category()).message());
}

c10::IValue string_list(const std::vector<std::string>& v) {
  return c10::IValue(c10::List<std::string>(v));
}

/// torch::save-style archive, written to a temporary file and renamed over
/// `path`, so a reader never sees a partial cache.
void write_cache(const std::string& path, const std::string& key, const ImageFolder& r,
                 const std::vector<std::string>& rel, const std::vector<std::string>& skipped_rel,
                 const std::vector<std::string>& reasons) {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(std::string(kCacheFormat)));
  archive.write("key", c10::IValue(key));
  archive.write("classes", string_list(r.classes));
  archive.write("files", string_list(rel));
  archive.write("skipped_files", string_list(skipped_rel));
  archive.write("skipped_reasons", string_list(reasons));
  archive.write("inputs", r.data.inputs);
  archive.write("targets", r.data.targets);
  const std::string tmp =
      fmt::format("{}.tmp.{}.{}", path, ::getpid(), std::hash<std::thread::id>{}(std::this_thread::get_id()));
  std::error_code ec;
  try {
    archive.save_to(tmp);
  } catch (const std::exception& e) {
    fs::remove(tmp, ec);
    detail::fail("{} cache {}: cannot write it ({}); the dataset was decoded but not cached", kWhere, path,
                 first_line(e.what()));
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    detail::fail("{} cache {}: cannot rename {} onto it ({})", kWhere, path, tmp, ec.message());
  }
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
uint32_t le32(const uint8_t* p) {
  return (uint32_t{p[3]} << 24) | (uint32_t{p[2]} << 16) | (uint32_t{p[1]} << 8) | p[0];
}

/// Walks the JPEG's segments to its end-of-image marker (FF D9). libjpeg
/// decodes a truncated file into a partial image padded with grey and only
/// warns, so the decoder's result alone does not show truncation. Bytes after
/// EOI (camera trailers) are allowed.
std::string jpeg_truncation(const uint8_t* p, size_t n) {
  const std::string truncated = "truncated JPEG: the end-of-image marker FF D9 is missing";
  size_t i = 2;  // after SOI
  while (true) {
    while (i < n && p[i] != 0xFF) ++i;  // stray bytes between segments (libjpeg skips them)
    while (i < n && p[i] == 0xFF) ++i;  // fill bytes
    if (i >= n) return truncated;
    const uint8_t marker = p[i++];
    if (marker == 0xD9) return "";  // EOI
    // Markers without a length: TEM, SOI, RST0-7 (and 00, which is no marker outside a scan).
    if (marker == 0x00 || marker == 0x01 || marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7)) continue;
    if (i + 2 > n) return truncated;
    const size_t length = (size_t{p[i]} << 8) | p[i + 1];  // counts its own two bytes
    if (length < 2)
      return fmt::format("corrupt JPEG: segment FF {:02X} at byte {} has length {}", marker, i - 2, length);
    i += length;
    if (i > n) return truncated;
    if (marker != 0xDA) continue;
    // After SOS: entropy-coded data up to the next marker; FF 00 is a stuffed
    // FF byte and FF D0-D7 restart markers belong to the scan.
    while (true) {
      const void* ff = i < n ? std::memchr(p + i, 0xFF, n - i) : nullptr;
      if (ff == nullptr) return truncated;
      i = static_cast<size_t>(static_cast<const uint8_t*>(ff) - p);
      size_t j = i + 1;
      while (j < n && p[j] == 0xFF) ++j;
      if (j >= n) return truncated;
      if (p[j] == 0x00 || (p[j] >= 0xD0 && p[j] <= 0xD7)) {
        i = j + 1;
        continue;
      }
      i = j - 1;  // the FF before the marker byte
      break;
    }
  }
}

/// Walks the PNG's chunks to IEND (length, type, data, CRC each).
std::string png_truncation(const uint8_t* p, size_t n) {
  size_t i = 8;  // after the signature
  while (true) {
    if (i + 8 > n) return "truncated PNG: the IEND chunk is missing";
    if (std::memcmp(p + i + 4, "IEND", 4) == 0) return "";
    i += 12 + size_t{be32(p + i)};
    if (i > n) return "truncated PNG: the IEND chunk is missing";
  }
}

/// Why `p` is not a whole JPEG, PNG or BMP ("" when it is whole, or is
/// another format, which is left to the decoder). Told apart by content, not
/// by the extension.
std::string truncation_of(const uint8_t* p, size_t n) {
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return jpeg_truncation(p, n);
  if (n >= 8 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) return png_truncation(p, n);
  if (n >= 14 && p[0] == 'B' && p[1] == 'M' && le32(p + 2) > n)
    return fmt::format("truncated BMP: {} of the {} bytes its header declares", n, le32(p + 2));
  return "";
}

/// `img` at {H, W} per `mode`; may be a view into `img` or a new image.
cv::Mat fit(const cv::Mat& img, int64_t H, int64_t W, ResizeMode mode) {
  const int64_t h = img.rows, w = img.cols;
  if (mode == ResizeMode::kStretch) {
    if (h == H && w == W) return img;
    cv::Mat out;
    cv::resize(img, out, cv::Size(static_cast<int>(W), static_cast<int>(H)), 0, 0,
               H <= h && W <= w ? cv::INTER_AREA : cv::INTER_LINEAR);
    return out;
  }
  // Scale so both sides cover {H, W}; the other side as torchvision's Resize
  // computes it (truncated), never below the crop.
  int64_t nh = H, nw = W;
  if (H * w >= W * h) {
    nw = std::max(W, w * H / h);
  } else {
    nh = std::max(H, h * W / w);
  }
  cv::Mat scaled = img;
  if (nh != h || nw != w)
    cv::resize(img, scaled, cv::Size(static_cast<int>(nw), static_cast<int>(nh)), 0, 0,
               nh * nw < h * w ? cv::INTER_AREA : cv::INTER_LINEAR);
  // torchvision's CenterCrop: offset round((size - crop) / 2), Python's round (half to even).
  const auto top = static_cast<int>(std::nearbyint(static_cast<double>(nh - H) / 2.0));
  const auto left = static_cast<int>(std::nearbyint(static_cast<double>(nw - W) / 2.0));
  return scaled(cv::Rect(left, top, static_cast<int>(W), static_cast<int>(H)));
}

/// Decodes `path` into `out` (H * W * 3 bytes, RGB). Returns "" or why the
/// file could not be used.
std::string decode_into(const std::string& path, int64_t H, int64_t W, ResizeMode mode, uint8_t* out) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return fmt::format("cannot open ({})", std::error_code(errno, std::generic_category()).message());
  const std::streamoff size = in.tellg();
  if (size == 0) return "empty file";
  if (size < 0 || size > INT_MAX)
    return fmt::format("cannot read: size {} bytes", static_cast<int64_t>(size));
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), size);
  if (!in) return fmt::format("read error after {} of {} bytes", static_cast<int64_t>(in.gcount()), size);
  const std::string truncated = truncation_of(bytes.data(), bytes.size());
  if (!truncated.empty()) return truncated;
  const cv::Mat encoded(1, static_cast<int>(bytes.size()), CV_8UC1, bytes.data());
  // IMREAD_COLOR: always 8-bit, 3-channel BGR (gray is replicated, alpha dropped).
  const cv::Mat bgr = cv::imdecode(encoded, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
  if (bgr.empty()) return "cannot decode: not an image, corrupt, or a format this OpenCV cannot read";
  cv::Mat rgb(static_cast<int>(H), static_cast<int>(W), CV_8UC3, out);
  cv::cvtColor(fit(bgr, H, W, mode), rgb, cv::COLOR_BGR2RGB);
  if (rgb.data != out) return "internal error: the decoded image was not written in place";
  return "";
}

/// Decodes every entry into one uint8 [N, H, W, 3] tensor on `threads`
/// threads. Each thread takes the next undone index (so slow images do not
/// hold up a fixed share) and writes straight into its slot: the result does
/// not depend on the number of threads. errors[i] is "" or why entry i failed;
/// with kFail, decoding stops at the first failure (later slots stay undone).
torch::Tensor decode_all(const std::string& root, const Scan& scan, const ImageFolderOptions& o,
                         std::vector<std::string>& errors) {
  const auto n = static_cast<int64_t>(scan.entries.size());
  const int64_t H = o.size()[0], W = o.size()[1];
  torch::Tensor inputs = torch::empty({n, H, W, 3}, torch::kUInt8);
  uint8_t* base = inputs.data_ptr<uint8_t>();
  errors.assign(static_cast<size_t>(n), "");
  int64_t threads = o.threads() > 0 ? o.threads() : static_cast<int64_t>(std::thread::hardware_concurrency());
  threads = std::clamp<int64_t>(threads, 1, n);
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  const bool fail_fast = o.on_error() == OnError::kFail;
  auto work = [&] {
    for (int64_t i = next++; i < n && !stop; i = next++) {
      std::string& error = errors[static_cast<size_t>(i)];
      try {
        error = decode_into(join_path(root, scan.entries[static_cast<size_t>(i)].rel), H, W, o.resize(),
                            base + i * H * W * 3);
      } catch (const std::exception& e) {
        error = fmt::format("cannot decode: {}", first_line(e.what()));
      } catch (...) {
        error = "cannot decode: unknown error";
      }
      if (!error.empty() && fail_fast) stop = true;
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  } catch (const std::system_error& e) {  // cannot start more threads: the started ones do the work
    if (pool.empty()) detail::fail("{} cannot start a decoding thread: {}", kWhere, e.what());
  }
  work();
  for (std::thread& t : pool) t.join();
  return inputs;
}

#endif  // EMBER_WITH_OPENCV

}  // namespace

ImageFolder load_image_folder(const std::string& root, const ImageFolderOptions& options) {
  check_options(options);
  const Scan scan = scan_folder(root, options);
  const std::string& cache = options.cache();
  std::string key;
  CacheStatus cache_status = CacheStatus::kOff;
  std::string cache_message;
  if (!cache.empty()) {
    key = cache_key(root, options, scan);
    CacheRead read = read_cache(cache, key, root, options);
    if (read.hit) return std::move(*read.hit);
    cache_status = read.status;
    cache_message = read.message;
  }
#if !EMBER_WITH_OPENCV
  (void)cache_status;
  detail::fail(
      "{} {}: Ember was built without OpenCV, so it cannot decode images{}; install libopencv-imgcodecs-dev "
      "libopencv-imgproc-dev (Debian) and rebuild Ember (CMake finds them; -DEMBER_OPENCV=ON requires them)",
      kWhere, root, cache.empty() ? "" : fmt::format(" (and the cache is of no use: {})", cache_message));
#else
  if (cache_status == CacheStatus::kCorrupt)
    std::cerr << kWhere << " cache " << cache_message << "; decoding the images and rewriting it\n";
  if (!cache.empty()) check_cache_writable(cache);
  std::vector<std::string> errors;
  torch::Tensor inputs = decode_all(root, scan, options, errors);
  const auto n = static_cast<int64_t>(scan.entries.size());

  if (options.on_error() == OnError::kFail) {
    const auto bad =
        std::find_if(errors.begin(), errors.end(), [](const std::string& e) { return !e.empty(); });
    if (bad != errors.end()) {
      const auto others =
          std::count_if(bad + 1, errors.end(), [](const std::string& e) { return !e.empty(); });
      detail::fail(
          "{} {}: {}{} (pass on_error=skip to skip unreadable images)", kWhere,
          join_path(root, scan.entries[static_cast<size_t>(bad - errors.begin())].rel), *bad,
          others > 0 ? fmt::format("; {} more unreadable files found before decoding stopped", others) : "");
    }
  }

  // Keep the decoded images, moving them down over the slots of skipped ones.
  ImageFolder result;
  result.classes = scan.classes;
  std::vector<std::string> rel, skipped_rel, reasons;
  std::vector<int64_t> labels;
  const int64_t image_bytes = options.size()[0] * options.size()[1] * 3;
  uint8_t* data = inputs.data_ptr<uint8_t>();
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Entry& e = scan.entries[static_cast<size_t>(i)];
    const std::string& error = errors[static_cast<size_t>(i)];
    if (!error.empty()) {
      skipped_rel.push_back(e.rel);
      reasons.push_back(error);
      result.skipped.push_back(join_path(root, e.rel) + ": " + error);
      continue;
    }
    if (kept != i)
      std::memcpy(data + kept * image_bytes, data + i * image_bytes, static_cast<size_t>(image_bytes));
    rel.push_back(e.rel);
    result.files.push_back(join_path(root, e.rel));
    labels.push_back(e.label);
    ++kept;
  }
  EMBER_CHECK(kept > 0, "{} {}: none of the {} images could be read; the first: {}", kWhere, root, n,
              result.skipped.front());
  result.data = {kept == n ? inputs : inputs.narrow(0, 0, kept), torch::tensor(labels, torch::kInt64)};
  if (!cache.empty()) {
    write_cache(cache, key, result, rel, skipped_rel, reasons);
    result.cache_status = cache_status;
    result.cache_message = cache_message;
  }
  return result;
#endif
}

}  // namespace ember::data
