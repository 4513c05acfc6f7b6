#pragma once
// Image folders as torchvision's ImageFolder lays them out:
//
//   root/<class>/**/<image>.{jpg,jpeg,png,bmp}
//
// Classes are the sub-folders of `root`, sorted by name; the label of an image
// is the index of its class. Within a class, images are found recursively and
// ordered as torchvision orders them (by folder path, then file name). Every
// image is decoded once (OpenCV imdecode, on `threads` threads), converted to
// RGB, resized to one size and stored whole in memory as uint8 NHWC, the layout
// the augmentation ops take. Grayscale and RGBA files become 3-channel RGB (the
// alpha channel is dropped, as PIL's convert("RGB") does); EXIF orientation is
// ignored, as torchvision's default loader ignores it.
//
// Files are found by extension but decoded by content, which must be JPEG,
// PNG or BMP under any of those names (ImageNet holds a PNG named .JPEG):
// those are the formats whose declared size Ember reads before decoding
// (max_pixels). Any other content (TIFF, WebP, PNM... which OpenCV would
// decode whatever its size) is refused as unreadable (on_error).
//
// Decoding needs OpenCV (CMake option EMBER_OPENCV); an Ember built without it
// can still load a dataset from a valid cache file.

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ember/core/config.h"
#include "ember/data/dataset.h"

namespace ember::data {

enum class ResizeMode {
  /// Scale (aspect ratio kept) so that the image covers {H, W}, i.e. the
  /// shorter side fits, then cut the centre {H, W} out. For a square size this
  /// is torchvision's Resize(S) + CenterCrop(S). INTER_AREA when shrinking,
  /// INTER_LINEAR when enlarging.
  kShorterSideCenterCrop,
  /// Scale each axis to {H, W} on its own (aspect ratio not kept). INTER_AREA
  /// when neither axis grows, INTER_LINEAR otherwise.
  kStretch,
};

/// What to do with a file that cannot be read or decoded (corrupt, truncated,
/// not an image, not JPEG, PNG or BMP content, larger than max_pixels).
enum class OnError {
  kFail,  ///< throw ember::Error naming the file
  kSkip,  ///< leave the file out and list it in ImageFolder::skipped
};

/// How `ImageFolderOptions::cache` was used by one load.
enum class CacheStatus {
  kOff,      ///< no cache file was asked for
  kLoaded,   ///< the cache matched: read from it, nothing decoded
  kCreated,  ///< there was no cache file: decoded, then written
  kStale,    ///< the cache was for other files or options: decoded, then rewritten
  kCorrupt,  ///< the cache file could not be read: decoded, then rewritten
};

struct ImageFolderOptions {
  /// `size`: {H, W} of every output image, in pixels (both > 0), e.g.
  /// ImageFolderOptions({224, 224}).threads(8).cache("train.cache").
  explicit ImageFolderOptions(std::vector<int64_t> size) : size_(std::move(size)) {}

  /// Output {H, W} in pixels.
  TORCH_ARG(std::vector<int64_t>, size);
  /// How an image is brought to `size`.
  TORCH_ARG(ResizeMode, resize) = ResizeMode::kShorterSideCenterCrop;
  /// Decoding threads; 0 = std::thread::hardware_concurrency(). Never more
  /// than there are images.
  TORCH_ARG(int64_t, threads) = 0;
  /// Unreadable, corrupt or truncated images: fail (default) or skip.
  TORCH_ARG(OnError, on_error) = OnError::kFail;
  /// An image whose header declares more pixels (width x height, or either
  /// side) is refused before decoding, as an unreadable one (on_error): a
  /// small file can declare gigabytes, per decoding thread. 64 Mi pixels
  /// (192 MiB decoded) by default.
  TORCH_ARG(int64_t, max_pixels) = int64_t{64} << 20;
  /// Path of a cache file (torch::save format) holding the decoded dataset and
  /// a key: the root, size, resize mode, max_pixels and every file's path, byte size and
  /// modification time. "" = no cache. A matching cache is loaded without
  /// decoding; otherwise the folder is decoded and the cache (re)written
  /// atomically (temporary file + rename).
  TORCH_ARG(std::string, cache) = "";
  /// File name extensions that count as images, case-insensitive, with or
  /// without the dot. The content must still be JPEG, PNG or BMP, whatever the extension.
  TORCH_ARG(std::vector<std::string>, extensions) = {".jpg", ".jpeg", ".png", ".bmp"};
};

struct ImageFolder {
  /// inputs: uint8 [N, H, W, 3], RGB, NHWC; targets: int64 [N], class indices.
  TensorDataset data;
  /// Class names (the sub-folders of root), sorted; targets index this.
  std::vector<std::string> classes;
  /// Path of each sample (root + "/" + path inside root), in dataset order.
  std::vector<std::string> files;
  /// Files left out with OnError::kSkip, as "path: reason".
  std::vector<std::string> skipped;
  /// What happened with options.cache, and why when it was not loaded
  /// (e.g. which file changed, or the read error of a corrupt cache).
  CacheStatus cache_status = CacheStatus::kOff;
  std::string cache_message;
};

/// Loads every image under `root` (layout above) at options.size(). Errors
/// (ember::Error) name the path: a missing root, a root without class
/// folders, a class folder without images, an unreadable image (with
/// OnError::kFail), every image unreadable (with OnError::kSkip).
ImageFolder load_image_folder(const std::string& root, const ImageFolderOptions& options);

/// Declares data.size, data.threads, data.on_error and data.cache_dir with the values of `defaults`.
void declare_image_folder_keys(core::Config& config, const ImageFolderOptions& defaults);
/// The options of split `split` from those keys (cache file
/// <data.cache_dir>/<split>-<H>x<W>.cache when data.cache_dir is set; the
/// folder is created when the cache is written). Bad values are config errors.
ImageFolderOptions image_folder_options_from_config(const core::Config& config, const std::string& split);

}  // namespace ember::data
