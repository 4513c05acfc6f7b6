// Image folders (torchvision ImageFolder layout): PNG, JPEG and BMP files
// written here with OpenCV into temp folders; classes, labels and order;
// exact pixels and RGB order (lossless PNG); resize modes; gray and RGBA
// files; corrupt and truncated files with kFail and kSkip; folder errors; the
// cache (round trip, invalidation, corruption); thread count independence.
// Tests that write images are skipped when Ember was built without OpenCV.
#include <ember/core/error.h>
#include <ember/data/image_folder.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "data/image_folder_internal.h"

#if EMBER_WITH_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

#include "train/test_task.h"  // temp_dir, error_of, write_bytes

using namespace ember;
using data::CacheStatus;
using data::ImageFolder;
using data::ImageFolderOptions;
using data::OnError;
using data::ResizeMode;
using test_util::error_of;
using test_util::write_bytes;
namespace fs = std::filesystem;

#if EMBER_WITH_OPENCV
#define SKIP_WITHOUT_OPENCV() (void)0
#else
#define SKIP_WITHOUT_OPENCV() GTEST_SKIP() << "Ember was built without OpenCV"
#endif

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The file bytes of `image` (uint8 [H, W] gray, [H, W, 3] RGB or [H, W, 4]
/// RGBA) encoded as `ext` (".png", ".jpg", ".bmp"); JPEG quality 95.
std::string encode(const torch::Tensor& image, const std::string& ext) {
#if EMBER_WITH_OPENCV
  torch::Tensor t = image.contiguous();
  const int channels = t.dim() == 2 ? 1 : static_cast<int>(t.size(2));
  cv::Mat m(static_cast<int>(t.size(0)), static_cast<int>(t.size(1)), CV_8UC(channels),
            t.data_ptr<uint8_t>());
  cv::Mat bgr = channels == 1 ? m : cv::Mat();  // never converted in place: `image` stays as it is
  if (channels == 3) cv::cvtColor(m, bgr, cv::COLOR_RGB2BGR);
  if (channels == 4) cv::cvtColor(m, bgr, cv::COLOR_RGBA2BGRA);
  std::vector<uchar> buf;
  if (!cv::imencode(ext, bgr, buf, {cv::IMWRITE_JPEG_QUALITY, 95}))
    throw std::runtime_error("imencode " + ext);
  return std::string(buf.begin(), buf.end());
#else
  throw std::runtime_error("encode needs OpenCV");
#endif
}

/// Writes `image` at `path` (folders created), format from the extension.
void write_image(const std::string& path, const torch::Tensor& image) {
  train::make_dirs(fs::path(path).parent_path().string());
  std::string ext = fs::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  write_bytes(path, encode(image, ext == ".jpeg" ? ".jpg" : ext));
}

/// uint8 [h, w, 3] of one colour.
torch::Tensor solid(int64_t h, int64_t w, int r, int g, int b) {
  return torch::tensor({r, g, b}, torch::kUInt8).view({1, 1, 3}).expand({h, w, 3}).contiguous();
}

torch::Tensor random_image(int64_t h, int64_t w, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(0, 256, {h, w, 3}, gen, torch::kUInt8);
}

/// The RGB value of pixel (y, x) of sample i.
std::vector<int> rgb_at(const ImageFolder& f, int64_t i, int64_t y, int64_t x) {
  const torch::Tensor p = f.data.inputs[i][y][x].to(torch::kInt32);
  return {p[0].item<int>(), p[1].item<int>(), p[2].item<int>()};
}

/// True when every pixel of sample i is within `tol` of (r, g, b).
bool all_near(const ImageFolder& f, int64_t i, int r, int g, int b, int tol = 0) {
  const torch::Tensor diff =
      f.data.inputs[i].to(torch::kInt32) - torch::tensor({r, g, b}, torch::kInt32).view({1, 1, 3});
  return diff.abs().max().item<int>() <= tol;
}

/// The message of the ember::Error that load_image_folder throws ("" if none).
std::string load_error(const std::string& root, const ImageFolderOptions& options) {
  return error_of([&] { data::load_image_folder(root, options); });
}

/// Sets the modification time of `path` `seconds` away from now.
void touch(const std::string& path, int seconds) {
  fs::last_write_time(path, fs::file_time_type::clock::now() + std::chrono::seconds(seconds));
}

}  // namespace

TEST(ImageFolder, ClassesLabelsAndOrderFollowTorchvision) {
  SKIP_WITHOUT_OPENCV();
  const std::string root = test_util::temp_dir("imgf_order");
  // torchvision walks each class with sorted(os.walk()) then sorted(file names):
  // folder "cat" < "cat/a" < "cat/a_b" (while the full paths would sort
  // cat/a/y.png < cat/a_b/x.png < cat/z.png).
  write_image(root + "/cat/z.png", solid(4, 4, 10, 0, 0));
  write_image(root + "/cat/a/y.PNG", solid(4, 4, 20, 0, 0));  // extensions are case-insensitive
  write_image(root + "/cat/a_b/x.bmp", solid(4, 4, 30, 0, 0));
  write_bytes(root + "/cat/notes.txt", "not an image, not listed");
  write_image(root + "/dog/2.jpeg", solid(6, 8, 0, 200, 0));
  write_image(root + "/dog/1.JPG", solid(6, 8, 0, 100, 0));
  write_image(root + "/bird/deep/er/est.png", solid(3, 5, 0, 0, 50));
  write_image(root + "/stray.png", solid(4, 4, 255, 255, 255));  // not in a class folder: ignored

  const ImageFolder f = data::load_image_folder(root, ImageFolderOptions({4, 4}).threads(2));
  EXPECT_EQ(f.classes, (std::vector<std::string>{"bird", "cat", "dog"}));
  EXPECT_EQ(f.files, (std::vector<std::string>{root + "/bird/deep/er/est.png", root + "/cat/z.png",
                                               root + "/cat/a/y.PNG", root + "/cat/a_b/x.bmp",
                                               root + "/dog/1.JPG", root + "/dog/2.jpeg"}));
  EXPECT_TRUE(torch::equal(f.data.targets, torch::tensor({0, 1, 1, 1, 2, 2}, torch::kInt64)));
  ASSERT_EQ(f.data.inputs.sizes(), (std::vector<int64_t>{6, 4, 4, 3}));
  EXPECT_EQ(f.data.inputs.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(f.skipped.empty());
  EXPECT_EQ(f.cache_status, CacheStatus::kOff);
  // Each file's colour lands in its own slot (lossless formats exactly, JPEG near).
  EXPECT_TRUE(all_near(f, 0, 0, 0, 50));
  EXPECT_TRUE(all_near(f, 1, 10, 0, 0));
  EXPECT_TRUE(all_near(f, 2, 20, 0, 0));
  EXPECT_TRUE(all_near(f, 3, 30, 0, 0));
  EXPECT_TRUE(all_near(f, 4, 0, 100, 0, 4));
  EXPECT_TRUE(all_near(f, 5, 0, 200, 0, 4));

  // Only the configured extensions count (with or without the dot, any case).
  const ImageFolder some =
      data::load_image_folder(root, ImageFolderOptions({4, 4}).extensions({"png", ".JPEG"}));
  EXPECT_EQ(some.files, (std::vector<std::string>{root + "/bird/deep/er/est.png", root + "/cat/z.png",
                                                  root + "/cat/a/y.PNG", root + "/dog/2.jpeg"}));
  const std::string e = load_error(root, ImageFolderOptions({4, 4}).extensions({"png"}));
  EXPECT_TRUE(contains(e, root + "/dog: class folder 'dog' has no images (extensions .png")) << e;
}

TEST(ImageFolder, PngPixelsAreExactAndInRgbOrder) {
  SKIP_WITHOUT_OPENCV();
  const std::string root = test_util::temp_dir("imgf_exact");
  torch::Tensor image = random_image(5, 7, 3);
  image[1][2] = torch::tensor({10, 20, 30}, torch::kUInt8);  // R, G, B
  write_image(root + "/only/a.png", image);
  for (const ResizeMode mode : {ResizeMode::kStretch, ResizeMode::kShorterSideCenterCrop}) {
    const ImageFolder f = data::load_image_folder(root, ImageFolderOptions({5, 7}).resize(mode));
    ASSERT_EQ(f.data.inputs.sizes(), (std::vector<int64_t>{1, 5, 7, 3}));
    EXPECT_TRUE(torch::equal(f.data.inputs[0], image)) << "same size: no resampling, exact bytes";
    EXPECT_EQ(rgb_at(f, 0, 1, 2), (std::vector<int>{10, 20, 30})) << "R, G, B order, not OpenCV's B, G, R";
  }
  // BMP is lossless too.
  write_image(root + "/only/b.bmp", image);
  const ImageFolder f = data::load_image_folder(root, ImageFolderOptions({5, 7}));
  ASSERT_EQ(f.data.size(), 2);
  EXPECT_TRUE(torch::equal(f.data.inputs[1], image));
}

TEST(ImageFolder, ResizeModesGiveTheSizeAndTheRightPart) {
  SKIP_WITHOUT_OPENCV();
  const std::string root = test_util::temp_dir("imgf_resize");
  // 20 x 40 in four vertical bands of 10 columns: green, red, blue, white.
  torch::Tensor bands = torch::empty({20, 40, 3}, torch::kUInt8);
  bands.narrow(1, 0, 10).copy_(solid(20, 10, 0, 255, 0));
  bands.narrow(1, 10, 10).copy_(solid(20, 10, 255, 0, 0));
  bands.narrow(1, 20, 10).copy_(solid(20, 10, 0, 0, 255));
  bands.narrow(1, 30, 10).copy_(solid(20, 10, 255, 255, 255));
  write_image(root + "/a/bands.png", bands);
  write_image(root + "/b/solid.png", solid(30, 12, 200, 100, 50));

  // Shorter side 20 -> 10 (INTER_AREA, exact 2x2 means), 40 -> 20, centre
  // 10 columns = columns 5..14 of 20: red then blue.
  const ImageFolder crop = data::load_image_folder(root, ImageFolderOptions({10, 10}));
  ASSERT_EQ(crop.data.inputs.sizes(), (std::vector<int64_t>{2, 10, 10, 3}));
  EXPECT_EQ(rgb_at(crop, 0, 0, 0), (std::vector<int>{255, 0, 0}));
  EXPECT_EQ(rgb_at(crop, 0, 9, 4), (std::vector<int>{255, 0, 0}));
  EXPECT_EQ(rgb_at(crop, 0, 5, 5), (std::vector<int>{0, 0, 255}));
  EXPECT_EQ(rgb_at(crop, 0, 9, 9), (std::vector<int>{0, 0, 255}));
  EXPECT_TRUE(all_near(crop, 1, 200, 100, 50)) << "a solid colour stays exact";

  // Stretch 40 -> 10 columns (4:1 means): all four bands, green first.
  const ImageFolder stretch =
      data::load_image_folder(root, ImageFolderOptions({10, 10}).resize(ResizeMode::kStretch));
  ASSERT_EQ(stretch.data.inputs.sizes(), (std::vector<int64_t>{2, 10, 10, 3}));
  EXPECT_EQ(rgb_at(stretch, 0, 3, 0), (std::vector<int>{0, 255, 0}));
  EXPECT_EQ(rgb_at(stretch, 0, 3, 3), (std::vector<int>{255, 0, 0}));
  EXPECT_EQ(rgb_at(stretch, 0, 3, 6), (std::vector<int>{0, 0, 255}));
  EXPECT_EQ(rgb_at(stretch, 0, 3, 9), (std::vector<int>{255, 255, 255}));

  // Non-square outputs, enlarging (INTER_LINEAR) and mixed.
  for (const ResizeMode mode : {ResizeMode::kStretch, ResizeMode::kShorterSideCenterCrop}) {
    const ImageFolder big = data::load_image_folder(root, ImageFolderOptions({48, 33}).resize(mode));
    ASSERT_EQ(big.data.inputs.sizes(), (std::vector<int64_t>{2, 48, 33, 3}));
    EXPECT_TRUE(all_near(big, 1, 200, 100, 50));
    const ImageFolder wide = data::load_image_folder(root, ImageFolderOptions({6, 50}).resize(mode));
    ASSERT_EQ(wide.data.inputs.sizes(), (std::vector<int64_t>{2, 6, 50, 3}));
    EXPECT_TRUE(all_near(wide, 1, 200, 100, 50));
  }
}

TEST(ImageFolder, GrayAndRgbaFilesBecomeRgb) {
  SKIP_WITHOUT_OPENCV();
  const std::string root = test_util::temp_dir("imgf_channels");
  const torch::Tensor gray = random_image(6, 6, 5).select(2, 0).contiguous();  // [6, 6]
  write_image(root + "/g/gray.png", gray);
  torch::Tensor rgba = torch::cat({random_image(6, 6, 6), torch::full({6, 6, 1}, 7, torch::kUInt8)}, 2);
  write_image(root + "/g/rgba.png", rgba);
  const ImageFolder f =
      data::load_image_folder(root, ImageFolderOptions({6, 6}).resize(ResizeMode::kStretch));
  ASSERT_EQ(f.data.inputs.sizes(), (std::vector<int64_t>{2, 6, 6, 3}));
  for (int c = 0; c < 3; ++c)
    EXPECT_TRUE(torch::equal(f.data.inputs[0].select(2, c), gray)) << "channel " << c;
  EXPECT_TRUE(torch::equal(f.data.inputs[1], rgba.narrow(2, 0, 3))) << "alpha dropped, RGB kept";
}

TEST(ImageFolder, CorruptAndTruncatedFilesFailOrAreSkipped) {
  SKIP_WITHOUT_OPENCV();
  const std::string jpeg = encode(random_image(32, 32, 8), ".jpg");
  const std::string png = encode(random_image(16, 16, 9), ".png");
  const std::string bmp = encode(random_image(8, 8, 10), ".bmp");
  ASSERT_EQ(jpeg.substr(jpeg.size() - 2), "\xFF\xD9");
  ASSERT_EQ(png.substr(png.size() - 8, 4), "IEND");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"garbage.png", "this is not an image at all"},
      {"empty.jpg", ""},
      {"half.jpg", jpeg.substr(0, jpeg.size() / 2)},
      {"no_eoi.jpg", jpeg.substr(0, jpeg.size() - 2)},  // everything but the end marker
      {"half.png", png.substr(0, png.size() / 2)},
      {"no_iend.png", png.substr(0, png.size() - 12)},  // all pixel data, no IEND chunk
      {"half.bmp", bmp.substr(0, bmp.size() - 20)},
      {"png_as.jpg", png.substr(0, 40)},  // named .jpg: detected by content
  };
  // Each alone, next to good files: kFail names the file and the way out.
  for (const auto& [name, bytes] : bad) {
    const std::string root = test_util::temp_dir("imgf_bad_one");
    write_image(root + "/a/good.png", solid(8, 8, 1, 2, 3));
    write_image(root + "/b/good.jpg", solid(8, 8, 1, 2, 3));
    write_bytes(root + "/b/" + name, bytes);
    const std::string e = load_error(root, ImageFolderOptions({8, 8}));
    EXPECT_TRUE(contains(e, root + "/b/" + name + ": ")) << name << ": " << e;
    EXPECT_TRUE(contains(e, "(pass on_error=skip to skip unreadable images)")) << e;
  }
  // The truncation reasons say what is missing.
  {
    const std::string root = test_util::temp_dir("imgf_bad_reason");
    train::make_dirs(root + "/b");
    write_bytes(root + "/b/no_eoi.jpg", jpeg.substr(0, jpeg.size() - 2));
    EXPECT_TRUE(contains(load_error(root, ImageFolderOptions({8, 8})), "FF D9"));
    write_bytes(root + "/b/no_eoi.jpg", jpeg);
    write_bytes(root + "/b/no_iend.png", png.substr(0, png.size() - 12));
    EXPECT_TRUE(contains(load_error(root, ImageFolderOptions({8, 8})), "IEND"));
  }
  // All together with kSkip: the rest loads; each bad file is listed once.
  const std::string root = test_util::temp_dir("imgf_bad_all");
  write_image(root + "/a/good.png", solid(8, 8, 1, 2, 3));
  write_image(root + "/b/good.png", solid(8, 8, 4, 5, 6));
  write_bytes(root + "/b/trailer.jpg", jpeg + "camera trailer after EOI");  // complete: loads
  for (const auto& [name, bytes] : bad) write_bytes(root + "/b/" + name, bytes);
  const ImageFolder f =
      data::load_image_folder(root, ImageFolderOptions({8, 8}).on_error(OnError::kSkip).threads(3));
  EXPECT_EQ(f.files,
            (std::vector<std::string>{root + "/a/good.png", root + "/b/good.png", root + "/b/trailer.jpg"}));
  EXPECT_TRUE(torch::equal(f.data.targets, torch::tensor({0, 1, 1}, torch::kInt64)));
  ASSERT_EQ(f.data.inputs.size(0), 3);
  EXPECT_TRUE(all_near(f, 0, 1, 2, 3));
  EXPECT_TRUE(all_near(f, 1, 4, 5, 6)) << "images after skipped ones move down";
  ASSERT_EQ(f.skipped.size(), bad.size());
  for (const auto& [name, bytes] : bad) {
    const std::string prefix = root + "/b/" + name + ": ";
    EXPECT_EQ(std::count_if(
                  f.skipped.begin(), f.skipped.end(),
                  [&](const std::string& s) { return s.rfind(prefix, 0) == 0 && s.size() > prefix.size(); }),
              1)
        << name;
  }
  // Nothing readable at all is an error even with kSkip.
  const std::string none = test_util::temp_dir("imgf_bad_none");
  train::make_dirs(none + "/a");
  train::make_dirs(none + "/b");
  write_bytes(none + "/a/x.png", "nope");
  write_bytes(none + "/b/y.jpg", jpeg.substr(0, 100));
  const std::string e = load_error(none, ImageFolderOptions({8, 8}).on_error(OnError::kSkip));
  EXPECT_TRUE(contains(e, "none of the 2 images could be read")) << e;
}

TEST(ImageFolder, ImagesDeclaringTooManyPixelsAreRefusedBeforeDecoding) {
  SKIP_WITHOUT_OPENCV();
  // The declared size, read from each format's header.
  for (const char* ext : {".jpg", ".png", ".bmp"}) {
    const std::string bytes = encode(random_image(30, 40, 3), ext);
    int64_t w = 0, h = 0;
    ASSERT_EQ(
        data::detail::image_size_of(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &w, &h), "")
        << ext;
    EXPECT_EQ(w, 40) << ext;
    EXPECT_EQ(h, 30) << ext;
    const std::string root = test_util::temp_dir("imgf_pixels");
    train::make_dirs(root + "/a");
    write_bytes(root + "/a/big" + ext, bytes);
    write_image(root + "/b/small.png", solid(8, 8, 1, 2, 3));
    const std::string e = load_error(root, ImageFolderOptions({8, 8}).max_pixels(1199));
    EXPECT_TRUE(
        contains(e, "big" + std::string(ext) + ": declares 40x30 pixels, more than data.max_pixels=1199"))
        << e;
    EXPECT_EQ(data::load_image_folder(root, ImageFolderOptions({8, 8}).max_pixels(1200)).data.size(), 2);
  }
  // A 60-byte PNG that declares 100000 x 100000 pixels (30 GB decoded).
  const auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                       static_cast<char>(v)};
  };
  const std::string forged = std::string("\x89PNG\r\n\x1a\n", 8) + be32(13) + "IHDR" + be32(100000) +
                             be32(100000) + std::string("\x08\x02\x00\x00\x00", 5) + "crc!" + be32(0) +
                             "IEND" + "crc!";
  const std::string root = test_util::temp_dir("imgf_forged");
  train::make_dirs(root + "/a");
  train::make_dirs(root + "/b");
  write_bytes(root + "/a/forged.png", forged);
  write_bytes(root + "/b/other.png", forged);
  const std::string e = load_error(root, ImageFolderOptions({8, 8}));
  EXPECT_TRUE(contains(e, "declares 100000x100000 pixels")) << e;
}

namespace {

std::string le16(uint32_t v) {
  return {static_cast<char>(v), static_cast<char>(v >> 8)};
}
std::string le32(uint32_t v) {
  return le16(v) + le16(v >> 16);
}
std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

/// A PNG chunk: length, type, data, CRC-32 of type and data.
std::string png_chunk(const std::string& type, const std::string& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : type + data) {
    crc ^= static_cast<uint8_t>(c);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return be32(static_cast<uint32_t>(data.size())) + type + data + be32(~crc);
}

/// A little-endian TIFF header whose first IFD declares width x height, 8-bit gray, one strip.
std::string tiff_header(uint32_t width, uint32_t height) {
  const auto entry = [](uint16_t tag, uint16_t type, uint32_t value) {
    return le16(tag) + le16(type) + le32(1) + le32(value);
  };
  return std::string("II*\0", 4) + le32(8) + le16(6) + entry(256, 4, width) + entry(257, 4, height) +
         entry(258, 3, 8) + entry(262, 3, 1) + entry(273, 4, 8 + 2 + 6 * 12 + 4) + entry(279, 4, 16) +
         le32(0) + std::string(16, '\x55');
}

/// A BMP with the 12-byte OS/2 1.x header (16-bit width and height), 24-bit, every pixel RGB (1, 2, 3).
std::string bmp_core(uint16_t width, uint16_t height) {
  const uint32_t pitch = (width * 3u + 3u) & ~3u;
  std::string pixels;
  for (uint32_t y = 0; y < height; ++y) {
    std::string row;
    for (uint32_t x = 0; x < width; ++x) row += "\x03\x02\x01";  // B, G, R
    row.resize(pitch, '\0');
    pixels += row;
  }
  return "BM" + le32(26 + static_cast<uint32_t>(pixels.size())) + le32(0) + le32(26) + le32(12) +
         le16(width) + le16(height) + le16(1) + le16(24) + pixels;
}

}  // namespace

TEST(ImageFolder, ContentOtherThanJpegPngOrBmpIsRefusedBeforeDecoding) {
  SKIP_WITHOUT_OPENCV();
  // OpenCV picks its decoder by content, not by name. Small files declaring
  // 60000 x 60000 pixels (10.8 GB decoded) in formats whose header Ember does
  // not read, under the names of formats it does, and genuine small images of
  // other formats this OpenCV reads (decoded whole, whatever their size,
  // before they were refused).
  std::vector<std::tuple<std::string, std::string, std::string>> hostile = {
      {"ppm.png", "P6\n60000 60000\n255\n" + std::string(64, '\x7f'), "PNM"},
      {"tiff.jpg", tiff_header(60000, 60000), "TIFF"},
      {"small_ppm.bmp", "P6\n2 2\n255\n" + std::string(12, '\x40'), "PNM"},
  };
#if EMBER_WITH_OPENCV
  const std::vector<std::pair<std::string, std::string>> others = {
      {".pgm", "PNM"},          {".tiff", "TIFF"},     {".webp", "WebP"}, {".sr", "Sun raster"},
      {".hdr", "Radiance HDR"}, {".jp2", "JPEG 2000"}, {".pfm", "PFM"},   {".pam", "PAM"}};
  const cv::Mat image(6, 5, CV_8UC3, cv::Scalar(10, 20, 30));
  for (const auto& [ext, format] : others) {
    std::vector<uchar> buf;
    try {
      if (!cv::imencode(ext, image, buf)) continue;
    } catch (const cv::Exception&) {
      continue;  // no encoder for it in this OpenCV
    }
    ASSERT_FALSE(cv::imdecode(buf, cv::IMREAD_COLOR).empty()) << ext << ": this OpenCV decodes it";
    hostile.emplace_back("other" + ext.substr(1) + ".png", std::string(buf.begin(), buf.end()), format);
  }
#endif
  ASSERT_GE(hostile.size(), 6u);
  for (const auto& [name, bytes, format] : hostile)
    EXPECT_EQ(data::detail::content_format(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
              format)
        << name;
  // on_error=fail: each alone names the file, the content and the way out.
  for (const auto& [name, bytes, format] : hostile) {
    const std::string root = test_util::temp_dir("imgf_content_one");
    write_image(root + "/a/good.png", solid(8, 8, 1, 2, 3));
    write_bytes(root + "/a/" + name, bytes);
    const std::string e = load_error(root, ImageFolderOptions({8, 8}));
    EXPECT_TRUE(contains(e, root + "/a/" + name + ": content is " + format + ", not JPEG, PNG or BMP")) << e;
    EXPECT_TRUE(contains(e, "(pass on_error=skip to skip unreadable images)")) << e;
  }
  // on_error=skip: each is skipped with its reason; JPEG, PNG and BMP content
  // loads under any of their names (ImageNet's training set holds a PNG named .JPEG).
  const std::string root = test_util::temp_dir("imgf_content_all");
  write_image(root + "/a/good.png", solid(8, 8, 1, 2, 3));
  train::make_dirs(root + "/b");
  write_bytes(root + "/b/png_named.jpg", encode(solid(8, 8, 4, 5, 6), ".png"));
  write_bytes(root + "/b/bmp_named.png", encode(solid(8, 8, 7, 8, 9), ".bmp"));
  write_bytes(root + "/b/jpg_named.bmp", encode(solid(8, 8, 100, 100, 100), ".jpg"));
  for (const auto& [name, bytes, format] : hostile) write_bytes(root + "/b/" + name, bytes);
  const ImageFolder f =
      data::load_image_folder(root, ImageFolderOptions({8, 8}).on_error(OnError::kSkip).threads(2));
  EXPECT_EQ(f.files, (std::vector<std::string>{root + "/a/good.png", root + "/b/bmp_named.png",
                                               root + "/b/jpg_named.bmp", root + "/b/png_named.jpg"}));
  ASSERT_EQ(f.data.size(), 4);
  EXPECT_TRUE(all_near(f, 1, 7, 8, 9));
  EXPECT_TRUE(all_near(f, 2, 100, 100, 100, 4));
  EXPECT_TRUE(all_near(f, 3, 4, 5, 6));
  ASSERT_EQ(f.skipped.size(), hostile.size());
  for (const auto& [name, bytes, format] : hostile) {
    const std::string reason = root + "/b/" + name + ": content is " + format + ", not JPEG, PNG or BMP";
    EXPECT_EQ(std::count_if(f.skipped.begin(), f.skipped.end(),
                            [&](const std::string& s) { return s.rfind(reason, 0) == 0; }),
              1)
        << name;
  }
}

TEST(ImageFolder, DeclaredSizeIsReadWhereTheDecoderReadsIt) {
  SKIP_WITHOUT_OPENCV();
  // Each file is a 40 x 30 image (1200 pixels) its decoder accepts; the size
  // must be found however the header states it.
  const std::string jpeg = encode(solid(30, 40, 90, 90, 90), ".jpg");
  ASSERT_EQ(jpeg.substr(2, 2), "\xFF\xE0");  // APP0 (JFIF) after SOI
  const size_t after_app0 = 4 + ((static_cast<uint8_t>(jpeg[4]) << 8) | static_cast<uint8_t>(jpeg[5]));
  std::string bmp_top_down = encode(solid(30, 40, 1, 2, 3), ".bmp");
  const int32_t minus_30 = -30;
  bmp_top_down.replace(22, 4, le32(static_cast<uint32_t>(minus_30)));  // rows stored top-down
  const std::vector<std::pair<std::string, std::string>> sized = {
      // libjpeg skips bytes between segments (with a warning).
      {"stray.jpg", jpeg.substr(0, after_app0) + "stray" + jpeg.substr(after_app0)},
      {"os2.bmp", bmp_core(40, 30)},  // 12-byte header: 16-bit width and height
      {"top_down.bmp", bmp_top_down},
  };
  for (const auto& [name, bytes] : sized) {
    const std::string root = test_util::temp_dir("imgf_sized");
    train::make_dirs(root + "/a");
    write_bytes(root + "/a/" + name, bytes);
    const std::string e = load_error(root, ImageFolderOptions({8, 8}).max_pixels(1199));
    EXPECT_TRUE(contains(e, name + ": declares 40x30 pixels, more than data.max_pixels=1199")) << e;
    const ImageFolder f = data::load_image_folder(root, ImageFolderOptions({8, 8}).max_pixels(1200));
    ASSERT_EQ(f.data.size(), 1) << name;
    EXPECT_TRUE(all_near(f, 0, name == "stray.jpg" ? 90 : 1, name == "stray.jpg" ? 90 : 2,
                         name == "stray.jpg" ? 90 : 3, 4))
        << name;
  }
  // Headers that do not declare one size where the decoder reads it are refused.
  const std::string png = encode(solid(30, 40, 1, 2, 3), ".png");
  std::string sof = jpeg.substr(jpeg.find("\xFF\xC0"));
  sof = sof.substr(0, 2 + ((static_cast<uint8_t>(sof[2]) << 8) | static_cast<uint8_t>(sof[3])));
  std::string bmp_v2 = encode(solid(30, 40, 1, 2, 3), ".bmp");
  bmp_v2.replace(14, 4, le32(20));
  const std::vector<std::tuple<std::string, std::string, std::string>> refused = {
      // The PNG specification puts IHDR first; libpng skips an unknown
      // ancillary chunk before it.
      {"late_ihdr.png", png.substr(0, 8) + png_chunk("ruSt", "x") + png.substr(8),
       "the first chunk is not IHDR"},
      {"two_sofs.jpg", jpeg.substr(0, after_app0) + sof + jpeg.substr(after_app0), "a second frame header"},
      {"no_sof.jpg", std::string(jpeg).erase(jpeg.find(sof), sof.size()), "no frame header"},
      {"v2.bmp", bmp_v2, "info header of 20 bytes"},
  };
  for (const auto& [name, bytes, reason] : refused) {
    const std::string root = test_util::temp_dir("imgf_unsized");
    train::make_dirs(root + "/a");
    write_bytes(root + "/a/" + name, bytes);
    const std::string e = load_error(root, ImageFolderOptions({8, 8}));
    EXPECT_TRUE(contains(e, name + ": ")) << e;
    EXPECT_TRUE(contains(e, reason)) << name << ": " << e;
  }
}

TEST(ImageFolder, FolderAndOptionErrorsNameThePath) {
  // These fail while scanning, before anything is decoded: no OpenCV needed.
  const std::string root = test_util::temp_dir("imgf_errors");
  std::string e = load_error(root + "/missing", ImageFolderOptions({8, 8}));
  EXPECT_TRUE(contains(e, root + "/missing: no such folder")) << e;

  write_bytes(root + "/loose.png", "x");
  e = load_error(root, ImageFolderOptions({8, 8}));
  EXPECT_TRUE(contains(e, root + ": no class folders")) << e;

  train::make_dirs(root + "/cat");
  write_bytes(root + "/cat/a.png", "x");
  train::make_dirs(root + "/dog/sub");
  write_bytes(root + "/dog/sub/readme.txt", "no images here");
  e = load_error(root, ImageFolderOptions({8, 8}));
  EXPECT_TRUE(contains(e, root + "/dog: class folder 'dog' has no images")) << e;

  EXPECT_TRUE(contains(load_error(root, ImageFolderOptions({8})), "size must be"));
  EXPECT_TRUE(contains(load_error(root, ImageFolderOptions({8, 0})), "size must be"));
  EXPECT_TRUE(contains(load_error(root, ImageFolderOptions({8, 8}).threads(-1)), "threads must be"));
  EXPECT_TRUE(contains(load_error(root, ImageFolderOptions({8, 8}).extensions({})), "extensions is empty"));
}

TEST(ImageFolder, CacheRoundTripInvalidationAndCorruption) {
  SKIP_WITHOUT_OPENCV();
  const std::string root = test_util::temp_dir("imgf_cache");
  const std::string cache = test_util::temp_dir("imgf_cache_dir") + "/sub/train.cache";  // folder created
  write_image(root + "/a/1.png", random_image(12, 9, 1));
  write_image(root + "/a/2.jpg", random_image(10, 10, 2));
  write_image(root + "/b/3.png", random_image(7, 15, 3));
  const auto options = ImageFolderOptions({8, 8}).cache(cache);

  const ImageFolder fresh = data::load_image_folder(root, options);
  EXPECT_EQ(fresh.cache_status, CacheStatus::kCreated) << fresh.cache_message;
  ASSERT_TRUE(fs::exists(cache));
  const ImageFolder decoded = data::load_image_folder(root, ImageFolderOptions({8, 8}));
  EXPECT_TRUE(torch::equal(fresh.data.inputs, decoded.data.inputs));

  const ImageFolder hit = data::load_image_folder(root, options);
  EXPECT_EQ(hit.cache_status, CacheStatus::kLoaded) << hit.cache_message;
  EXPECT_TRUE(torch::equal(hit.data.inputs, decoded.data.inputs));
  EXPECT_TRUE(torch::equal(hit.data.targets, decoded.data.targets));
  EXPECT_EQ(hit.classes, decoded.classes);
  EXPECT_EQ(hit.files, decoded.files);

  // A hit decodes nothing: garbage of the same size and time still loads.
  const std::string png_path = root + "/a/1.png";
  const std::string original = read_bytes(png_path);
  const auto mtime = fs::last_write_time(png_path);
  write_bytes(png_path, std::string(original.size(), 'x'));
  fs::last_write_time(png_path, mtime);
  EXPECT_EQ(data::load_image_folder(root, options).cache_status, CacheStatus::kLoaded);
  write_bytes(png_path, original);
  fs::last_write_time(png_path, mtime);

  // A changed file (new time) invalidates it; the next load hits again.
  write_image(root + "/b/3.png", solid(7, 15, 9, 8, 7));
  touch(root + "/b/3.png", 10);
  const ImageFolder stale = data::load_image_folder(root, options);
  EXPECT_EQ(stale.cache_status, CacheStatus::kStale);
  EXPECT_TRUE(contains(stale.cache_message, "b/3.png")) << stale.cache_message;
  EXPECT_TRUE(all_near(stale, 2, 9, 8, 7));
  EXPECT_TRUE(torch::equal(stale.data.inputs.narrow(0, 0, 2), decoded.data.inputs.narrow(0, 0, 2)));
  EXPECT_EQ(data::load_image_folder(root, options).cache_status, CacheStatus::kLoaded);
  // So do a new file and other options.
  write_image(root + "/b/4.png", solid(5, 5, 1, 1, 1));
  EXPECT_EQ(data::load_image_folder(root, options).cache_status, CacheStatus::kStale);
  const ImageFolder other = data::load_image_folder(root, ImageFolderOptions({4, 6}).cache(cache));
  EXPECT_EQ(other.cache_status, CacheStatus::kStale);
  EXPECT_EQ(other.data.inputs.sizes(), (std::vector<int64_t>{4, 4, 6, 3}));

  // A corrupt or partial cache is reported and rebuilt, never a crash.
  const std::string good_cache = read_bytes(cache);
  for (const std::string& junk :
       {std::string("not a cache"), good_cache.substr(0, good_cache.size() / 2), std::string()}) {
    write_bytes(cache, junk);
    const ImageFolder rebuilt = data::load_image_folder(root, ImageFolderOptions({4, 6}).cache(cache));
    EXPECT_EQ(rebuilt.cache_status, CacheStatus::kCorrupt) << junk.size();
    EXPECT_TRUE(contains(rebuilt.cache_message, cache + ": unreadable")) << rebuilt.cache_message;
    EXPECT_TRUE(torch::equal(rebuilt.data.inputs, other.data.inputs));
    EXPECT_EQ(data::load_image_folder(root, ImageFolderOptions({4, 6}).cache(cache)).cache_status,
              CacheStatus::kLoaded);
  }
  // Written atomically: no temporary files left next to it.
  int entries = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(cache).parent_path())) entries += entry.exists();
  EXPECT_EQ(entries, 1);
}

TEST(ImageFolder, CacheRemembersSkippedFiles) {
  SKIP_WITHOUT_OPENCV();
  const std::string root = test_util::temp_dir("imgf_cache_skip");
  const std::string cache = test_util::temp_dir("imgf_cache_skip_dir") + "/skip.cache";
  write_image(root + "/a/1.png", solid(4, 4, 1, 2, 3));
  write_bytes(root + "/a/2.png", "broken");
  const auto skip = ImageFolderOptions({4, 4}).on_error(OnError::kSkip).cache(cache);
  const ImageFolder first = data::load_image_folder(root, skip);
  const ImageFolder hit = data::load_image_folder(root, skip);
  EXPECT_EQ(hit.cache_status, CacheStatus::kLoaded);
  EXPECT_EQ(hit.skipped, first.skipped);
  ASSERT_EQ(hit.skipped.size(), 1u);
  EXPECT_EQ(hit.files, (std::vector<std::string>{root + "/a/1.png"}));
  // A cache that left files out does not satisfy on_error=fail.
  const std::string e = load_error(root, ImageFolderOptions({4, 4}).cache(cache));
  EXPECT_TRUE(contains(e, root + "/a/2.png: ")) << e;
}

TEST(ImageFolder, ThreadCountDoesNotChangeTheResult) {
  SKIP_WITHOUT_OPENCV();
  const std::string root = test_util::temp_dir("imgf_threads");
  for (int i = 0; i < 14; ++i) {
    const std::string cls = std::string(1, static_cast<char>('a' + i % 3));
    const std::string ext = i % 2 ? ".jpg" : ".png";
    write_image(root + "/" + cls + "/img" + std::to_string(i) + ext, random_image(9 + i, 23 - i, 100 + i));
  }
  for (const ResizeMode mode : {ResizeMode::kShorterSideCenterCrop, ResizeMode::kStretch}) {
    const auto options = ImageFolderOptions({9, 11}).resize(mode);
    const ImageFolder one = data::load_image_folder(root, ImageFolderOptions(options).threads(1));
    const ImageFolder three = data::load_image_folder(root, ImageFolderOptions(options).threads(3));
    const ImageFolder all = data::load_image_folder(root, ImageFolderOptions(options).threads(0));
    ASSERT_EQ(one.data.inputs.sizes(), (std::vector<int64_t>{14, 9, 11, 3}));
    EXPECT_TRUE(torch::equal(one.data.inputs, three.data.inputs));
    EXPECT_TRUE(torch::equal(one.data.inputs, all.data.inputs));
    EXPECT_TRUE(torch::equal(one.data.targets, three.data.targets));
    EXPECT_EQ(one.files, three.files);
  }
}

TEST(ImageFolder, WithoutOpenCvDecodingIsAClearError) {
#if EMBER_WITH_OPENCV
  GTEST_SKIP() << "Ember was built with OpenCV";
#else
  const std::string root = test_util::temp_dir("imgf_no_opencv");
  train::make_dirs(root + "/a");
  write_bytes(root + "/a/x.png", "x");
  const std::string e = load_error(root, ImageFolderOptions({8, 8}));
  EXPECT_TRUE(contains(e, "built without OpenCV")) << e;
  EXPECT_TRUE(contains(e, "libopencv-imgcodecs-dev")) << e;
#endif
}
