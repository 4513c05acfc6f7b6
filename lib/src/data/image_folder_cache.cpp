// data::load_image_folder's cache: the key a cached dataset depends on, and the reading and
// (atomic) writing of the cache file.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <cerrno>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.h"
#include "data/image_folder_internal.h"

namespace ember::data::detail {
namespace {

// Bump when the cache's layout or the decoding changes, so old caches are rebuilt.
constexpr const char* kCacheFormat = "ember.image_folder.v1";

const char* mode_name(ResizeMode mode) {
  return mode == ResizeMode::kStretch ? "stretch" : "shorter_side_center_crop";
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

/// Throws (a std::exception) unless `v` is a list of strings.
std::vector<std::string> strings_of(const c10::IValue& v) {
  EMBER_CHECK(v.isList(), "expected a list of strings, got {}", v.tagKind());
  std::vector<std::string> out;
  for (const c10::IValue& x : v.toListRef()) out.push_back(x.toStringRef());
  return out;
}

c10::IValue string_list(const std::vector<std::string>& v) {
  return c10::IValue(c10::List<std::string>(v));
}

}  // namespace

std::string cache_key(const std::string& root, const ImageFolderOptions& o, const Scan& scan) {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(root, ec);
  if (ec) canonical = fs::absolute(root);
  std::string key = fmt::format("{}\nroot {}\nsize {}x{}\nresize {}\nmax_pixels {}\nclasses {}\n",
                                kCacheFormat, canonical.string(), o.size()[0], o.size()[1],
                                mode_name(o.resize()), o.max_pixels(), fmt::join(scan.classes, "/"));
  for (const Entry& e : scan.entries)
    key += fmt::format("file {} bytes {} mtime_ns {}\n", e.rel, e.bytes, e.mtime_ns);
  return key;
}

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
    ember::detail::fail("{} cache {}: cannot write it ({}); the dataset was decoded but not cached", kWhere,
                        path, first_line(e.what()));
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    ember::detail::fail("{} cache {}: cannot rename {} onto it ({})", kWhere, path, tmp, ec.message());
  }
}

}  // namespace ember::data::detail
