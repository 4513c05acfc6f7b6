// data::load_image_folder: the threaded OpenCV decode of the scanned images into one tensor,
// and the load itself (scan, cache, decode, skip). The only image_folder file that uses OpenCV.
#include "ember/data/image_folder.h"

#include <fmt/format.h>
#include <torch/types.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#if EMBER_WITH_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

#include "core/check.h"
#include "data/image_folder_internal.h"

namespace ember::data {

namespace detail {

#if EMBER_WITH_OPENCV

namespace {

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
std::string decode_into(const std::string& path, int64_t H, int64_t W, ResizeMode mode, int64_t max_pixels,
                        uint8_t* out) {
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
  // Refused before decoding: a small file can declare an image of gigabytes,
  // per decoding thread, in a format OpenCV picks by content whatever the
  // name. OpenCV's own ceiling (OPENCV_IO_MAX_IMAGE_PIXELS, 2^30 pixels: 3 GiB
  // decoded) is no second guard Ember can set: libopencv_imgcodecs reads it
  // into a static when it is loaded, before main.
  const std::string refused = bound_refusal(bytes.data(), bytes.size(), max_pixels);
  if (!refused.empty()) return refused;
  const cv::Mat encoded(1, static_cast<int>(bytes.size()), CV_8UC1, bytes.data());
  // IMREAD_COLOR: always 8-bit, 3-channel BGR (gray is replicated, alpha dropped).
  const cv::Mat bgr = cv::imdecode(encoded, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
  if (bgr.empty()) return "cannot decode: not an image, corrupt, or a format this OpenCV cannot read";
  cv::Mat rgb(static_cast<int>(H), static_cast<int>(W), CV_8UC3, out);
  cv::cvtColor(fit(bgr, H, W, mode), rgb, cv::COLOR_BGR2RGB);
  if (rgb.data != out) return "internal error: the decoded image was not written in place";
  return "";
}

}  // namespace

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
                            o.max_pixels(), base + i * H * W * 3);
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
    if (pool.empty()) ember::detail::fail("{} cannot start a decoding thread: {}", kWhere, e.what());
  }
  work();
  for (std::thread& t : pool) t.join();
  return inputs;
}

#endif  // EMBER_WITH_OPENCV

}  // namespace detail

using detail::cache_key;
using detail::CacheRead;
using detail::check_cache_writable;
using detail::check_options;
using detail::decode_all;
using detail::Entry;
using detail::join_path;
using detail::kWhere;
using detail::read_cache;
using detail::Scan;
using detail::scan_folder;
using detail::write_cache;

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
  ember::detail::fail(
      "{} {}: Ember was built without OpenCV, so it cannot decode images{}; install libopencv-imgcodecs-dev "
      "libopencv-imgproc-dev (Debian) and rebuild Ember (CMake finds them; -DEMBER_OPENCV=ON requires them)",
      kWhere, root, cache.empty() ? "" : fmt::format(" (and the cache is of no use: {})", cache_message));
#else
  if (cache_status == CacheStatus::kCorrupt)
    std::cerr << fmt::format("{} cache {}; decoding the images and rewriting it\n", kWhere, cache_message);
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
      ember::detail::fail(
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
