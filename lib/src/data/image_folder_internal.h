#pragma once
// Internal: what the parts of data::load_image_folder share: the scan, the cache, the file
// sniffing and the decoder (image_folder_scan/_cache/_decode.cpp, image_sniff.cpp).
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ember/data/image_folder.h"

namespace ember::data::detail {

namespace fs = std::filesystem;

inline constexpr const char* kWhere = "[data::load_image_folder]";

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

// ---- image_folder_scan.cpp

void check_options(const ImageFolderOptions& o);

/// Finds classes and images as torchvision's ImageFolder does: classes are
/// the sub-folders of root (symlinks followed), sorted; the images of a class
/// are found by a recursive walk and sorted by (folder path, file name),
/// which is the order of `sorted(os.walk(...))` + `sorted(fnames)`.
Scan scan_folder(const std::string& root, const ImageFolderOptions& o);

inline std::string join_path(const std::string& root, const std::string& rel) {
  return (fs::path(root) / rel).string();
}

// ---- image_folder_cache.cpp

inline std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

/// Everything a cached dataset depends on, one fact per line.
std::string cache_key(const std::string& root, const ImageFolderOptions& o, const Scan& scan);

struct CacheRead {
  std::optional<ImageFolder> hit;
  CacheStatus status;
  std::string message;  // why there was no hit
};

/// Reads the cache at `path` if it holds the dataset `key` describes. Any
/// failure to read it (a partial file, another format, inconsistent contents)
/// is reported as kCorrupt, never thrown.
CacheRead read_cache(const std::string& path, const std::string& key, const std::string& root,
                     const ImageFolderOptions& o);

/// Fails before any decoding when the cache could not be written afterwards.
void check_cache_writable(const std::string& path);

/// torch::save-style archive, written to a temporary file and renamed over
/// `path`, so a reader never sees a partial cache.
void write_cache(const std::string& path, const std::string& key, const ImageFolder& r,
                 const std::vector<std::string>& rel, const std::vector<std::string>& skipped_rel,
                 const std::vector<std::string>& reasons);

// ---- image_sniff.cpp

/// Why `p` is not a whole JPEG, PNG or BMP ("" when it is whole, or is
/// another format, which bound_refusal refuses). Told apart by content, not
/// by the extension.
std::string truncation_of(const uint8_t* p, size_t n);

/// The format of `p` by its first bytes: "JPEG", "PNG" or "BMP" exactly when
/// OpenCV's imdecode would give it to that decoder; the name of another
/// format OpenCV or common tools read ("TIFF", "WebP", "PNM", ...); "" for
/// none of those.
std::string content_format(const uint8_t* p, size_t n);

/// Reads the width and height that a JPEG (its one frame header before the
/// first scan), PNG (IHDR, the first chunk) or BMP (its info header)
/// declares, where the decoder reads them. "" on success, or why there is no
/// such size (the file must not be decoded: a decoder could find another).
std::string image_size_of(const uint8_t* p, size_t n, int64_t* width, int64_t* height);

/// Why `p` must not be decoded, whatever its file name: content other than
/// JPEG, PNG or BMP (OpenCV decodes TIFF, WebP, PNM, ... by content, and
/// Ember does not read their sizes), no size where the decoder reads it, an
/// empty size, or more pixels (either side, or width x height) than
/// `max_pixels`. "" when it may be decoded.
std::string bound_refusal(const uint8_t* p, size_t n, int64_t max_pixels);

// ---- image_folder_decode.cpp

/// Decodes every entry into one uint8 [N, H, W, 3] tensor on `threads`
/// threads. Each thread takes the next undone index (so slow images do not
/// hold up a fixed share) and writes straight into its slot: the result does
/// not depend on the number of threads. errors[i] is "" or why entry i failed;
/// with kFail, decoding stops at the first failure (later slots stay undone).
torch::Tensor decode_all(const std::string& root, const Scan& scan, const ImageFolderOptions& o,
                         std::vector<std::string>& errors);

}  // namespace ember::data::detail
