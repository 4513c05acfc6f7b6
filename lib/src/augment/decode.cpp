// augment::decode_image: JPEG (libjpeg-turbo, cropped and DCT-scaled) and PNG
// (libpng) into a resized, flipped uint8 crop.
#include "ember/augment/decode.h"

#include <ATen/Version.h>

#include <c10/util/ParallelGuard.h>
#include <jpeglib.h>
// (after jpeglib.h, which it needs)
#include <jerror.h>
#include <png.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "core/check.h"
#include "ember/augment/param.h"

namespace ember::augment {
namespace {

bool is_jpeg(std::string_view b) {
  return b.size() >= 3 && static_cast<uint8_t>(b[0]) == 0xff && static_cast<uint8_t>(b[1]) == 0xd8 &&
         static_cast<uint8_t>(b[2]) == 0xff;
}
bool is_png(std::string_view b) {
  return b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0;
}

// --- JPEG through libjpeg, with its errors turned into a return value ---

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_jpeg_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}
void no_jpeg_output(j_common_ptr) {}  // warnings (a corrupt-data warning is still decoded) stay quiet

/// Warnings: the end of the data before the image's end (a truncated file,
/// which libjpeg would pad with gray) is an error; the rest pass quietly.
void on_jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* e = reinterpret_cast<JpegError*>(cinfo->err);
    std::snprintf(e->message, sizeof e->message, "the data ends before the image does (a truncated file)");
    std::longjmp(e->jump, 1);
  }
}

/// The decoded crop: rows x cols x channels bytes at `pixels` (RGB; CMYK
/// converted), and where the asked box lies in it after scaling.
struct Decoded {
  std::vector<uint8_t> pixels;
  int64_t rows = 0, cols = 0;  // of `pixels`
  CropBox box;                 // the crop inside `pixels`
};

/// Decodes the rows and iMCU columns of `box` at scale n/8. Returns an error
/// text (empty on success). No C++ object with a destructor lives across
/// setjmp but `out`, which the caller owns.
std::string decode_jpeg_crop(std::string_view bytes, const CropBox& box, const std::vector<int64_t>& size,
                             bool dct_scaling, int64_t max_pixels, Decoded& out) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = on_jpeg_error;
  err.mgr.output_message = no_jpeg_output;
  err.mgr.emit_message = on_jpeg_message;
  err.message[0] = '\0';
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return std::string("libjpeg: ") + err.message;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  const int64_t width = cinfo.image_width, height = cinfo.image_height;
  if (width * height > max_pixels) {
    jpeg_destroy_decompress(&cinfo);
    return "declares " + std::to_string(width) + "x" + std::to_string(height) + " pixels, over max_pixels";
  }
  if (box.top + box.height > height || box.left + box.width > width) {
    jpeg_destroy_decompress(&cinfo);
    return "the crop " + std::to_string(box.height) + "x" + std::to_string(box.width) + " at (" +
           std::to_string(box.top) + ", " + std::to_string(box.left) + ") lies outside the " +
           std::to_string(height) + "x" + std::to_string(width) + " image";
  }
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  // DCT scaling at 1/8, 2/8 or 4/8 only: libjpeg-turbo's SIMD inverse DCTs are those sizes (and 8/8); at
  // 3/8, 5/8, 6/8 and 7/8 the luma and the chroma (upsampled in the IDCT, at twice the size) take its
  // scalar IDCTs, slower than decoding at full size.
  unsigned num = 8;
  if (dct_scaling) {
    for (const unsigned n : {1u, 2u, 4u})
      if (box.height * n >= 8 * size[0] && box.width * n >= 8 * size[1]) {
        num = n;
        break;
      }
  }
  cinfo.scale_num = num;
  cinfo.scale_denom = 8;
  jpeg_start_decompress(&cinfo);
  const int64_t ow = cinfo.output_width, oh = cinfo.output_height;
  // The box in the scaled image: edges scaled and clamped.
  const auto scaled = [&](int64_t v, int64_t limit) {
    return std::clamp<int64_t>(static_cast<int64_t>(std::llround(static_cast<double>(v) * num / 8.0)), 0,
                               limit);
  };
  const int64_t top = scaled(box.top, oh - 1), left = scaled(box.left, ow - 1);
  const int64_t bottom = std::max(top + 1, scaled(box.top + box.height, oh));
  const int64_t right = std::max(left + 1, scaled(box.left + box.width, ow));
  JDIMENSION xoff = static_cast<JDIMENSION>(left), cw = static_cast<JDIMENSION>(right - left);
  if (cw < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &cw);  // widens to iMCU boundaries
  const int channels = cinfo.output_components;
  // crop_scanline narrows output_width to cw: rows are that wide from now on.
  const int64_t row_bytes = static_cast<int64_t>(cinfo.output_width) * channels;
  out.pixels.resize(static_cast<size_t>((bottom - top) * row_bytes));
  if (top > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(top));
  for (int64_t r = 0; r < bottom - top;) {
    JSAMPROW row = out.pixels.data() + r * row_bytes;
    const JDIMENSION got = jpeg_read_scanlines(&cinfo, &row, 1);
    if (got == 0) break;
    r += got;
  }
  jpeg_abort_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  out.rows = bottom - top;
  out.cols = static_cast<int64_t>(row_bytes / channels);
  out.box = CropBox{0, left - static_cast<int64_t>(xoff), bottom - top, right - left};
  if (channels == 4) {
    // Adobe's CMYK is stored inverted: R = C * K / 255 on the stored values.
    std::vector<uint8_t> rgb(static_cast<size_t>(out.rows * out.cols * 3));
    for (int64_t i = 0; i < out.rows * out.cols; ++i) {
      const uint8_t* p = out.pixels.data() + 4 * i;
      for (int c = 0; c < 3; ++c) rgb[3 * i + c] = static_cast<uint8_t>((p[c] * p[3] + 127) / 255);
    }
    out.pixels = std::move(rgb);
  } else if (channels != 3) {
    return "an unexpected " + std::to_string(channels) + "-channel output";
  }
  return "";
}

std::string decode_png_whole(std::string_view bytes, int64_t max_pixels, Decoded& out) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()))
    return std::string("libpng: ") + image.message;
  if (static_cast<int64_t>(image.width) * image.height > max_pixels) {
    png_image_free(&image);
    return "declares " + std::to_string(image.width) + "x" + std::to_string(image.height) +
           " pixels, over max_pixels";
  }
  image.format = PNG_FORMAT_RGBA;  // alpha read, then dropped (PIL's convert("RGB"))
  std::vector<uint8_t> rgba(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, rgba.data(), 0, nullptr))
    return std::string("libpng: ") + image.message;
  out.rows = image.height;
  out.cols = image.width;
  out.pixels.resize(static_cast<size_t>(out.rows * out.cols * 3));
  for (int64_t i = 0; i < out.rows * out.cols; ++i)
    for (int c = 0; c < 3; ++c) out.pixels[3 * i + c] = rgba[4 * i + c];
  return "";
}

}  // namespace

std::vector<int64_t> image_size(std::string_view bytes) {
  if (is_jpeg(bytes)) {
    jpeg_decompress_struct cinfo;
    JpegError err;
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = on_jpeg_error;
    err.mgr.output_message = no_jpeg_output;
    if (setjmp(err.jump)) {
      jpeg_destroy_decompress(&cinfo);
      ember::detail::fail(ErrorKind::kData, "a damaged JPEG (libjpeg: {})", err.message);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
                 static_cast<unsigned long>(bytes.size()));
    jpeg_read_header(&cinfo, TRUE);
    std::vector<int64_t> hw{cinfo.image_height, cinfo.image_width};
    jpeg_destroy_decompress(&cinfo);
    return hw;
  }
  if (is_png(bytes)) {
    png_image image;
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()))
      ember::detail::fail(ErrorKind::kData, "a damaged PNG (libpng: {})", image.message);
    std::vector<int64_t> hw{image.height, image.width};
    png_image_free(&image);
    return hw;
  }
  ember::detail::fail(ErrorKind::kData, "not JPEG or PNG content (the first bytes say neither)");
}

torch::Tensor decode_crop(std::string_view bytes, const CropBox& box, const std::vector<int64_t>& size,
                          bool hflip, bool vflip, const DecodeOptions& decode) {
  const bool dct_scaling = decode.dct_scaling();
  const int64_t max_pixels = decode.max_pixels();
  EMBER_CHECK(size.size() == 2 && size[0] > 0 && size[1] > 0,
              "[data::decode_crop] size is {{H, W}}, both > 0");
  EMBER_CHECK(box.height > 0 && box.width > 0 && box.top >= 0 && box.left >= 0,
              "[data::decode_crop] an empty or negative crop box");
  Decoded d;
  std::string bad;
  if (is_jpeg(bytes)) {
    bad = decode_jpeg_crop(bytes, box, size, dct_scaling, max_pixels, d);
  } else if (is_png(bytes)) {
    bad = decode_png_whole(bytes, max_pixels, d);
    d.box = box;
  } else {
    bad = "not JPEG or PNG content (the first bytes say neither)";
  }
  if (!bad.empty()) ember::detail::fail(ErrorKind::kData, "{}", bad);
  EMBER_CHECK_KIND(kData, d.box.top + d.box.height <= d.rows && d.box.left + d.box.width <= d.cols,
                   "a crop {}x{} at ({}, {}) outside the {}x{} image", d.box.height, d.box.width, d.box.top,
                   d.box.left, d.rows, d.cols);
  // NCHW view of the crop (channels-last strides), resized as torchvision's
  // v2 resize does uint8 images: bilinear, antialiased, align_corners=false.
  torch::Tensor whole = torch::from_blob(d.pixels.data(), {1, d.rows, d.cols, 3}, torch::kUInt8);
  torch::Tensor crop =
      whole.narrow(1, d.box.top, d.box.height).narrow(2, d.box.left, d.box.width).permute({0, 3, 1, 2});
  torch::Tensor out;
  {
    c10::ParallelGuard serial(true);  // one sample per decode thread: no nested intra-op threads
    if (d.box.height == size[0] && d.box.width == size[1]) {
      out = crop.clone(at::MemoryFormat::ChannelsLast);
    } else {
      // torchvision resizes uint8 on the CPU with ATen's uint8 kernel only
      // where ATen dispatches to AVX2 or AVX-512; below that, in float32 and
      // rounded back (its _do_native_uint8_resize_on_cpu). The same choice
      // gives torchvision's pixels at every dispatch level.
      static const bool native_uint8 = [] {
        const std::string level = at::get_cpu_capability();
        return level == "AVX2" || level == "AVX512";
      }();
      const torch::Tensor input = crop.contiguous(at::MemoryFormat::ChannelsLast);
      const auto options = torch::nn::functional::InterpolateFuncOptions()
                               .size(std::vector<int64_t>{size[0], size[1]})
                               .mode(torch::kBilinear)
                               .align_corners(false)
                               .antialias(true);
      out = native_uint8 ? torch::nn::functional::interpolate(input, options)
                         : torch::nn::functional::interpolate(input.to(torch::kFloat), options)
                               .round_()
                               .to(torch::kUInt8);
    }
  }
  out = out.permute({0, 2, 3, 1})[0];  // [H, W, 3]
  if (hflip) out = out.flip({1});
  if (vflip) out = out.flip({0});
  return out.contiguous();
}

DecodePlan decode_plan(int64_t height, int64_t width, const AugmentOptions& o, uint64_t seed, int64_t sample,
                       int64_t epoch, const DecodeOptions& decode) {
  EMBER_CHECK(height > 0 && width > 0, "[augment::decode_plan] an image of {}x{}", height, width);
  const std::vector<int64_t>& size = o.size();
  EMBER_CHECK(size.size() == 2 && size[0] > 0 && size[1] > 0,
              "[augment::decode_plan] size is {{H, W}}, both > 0");
  DecodePlan plan;
  switch (o.crop()) {
    case CropMode::kRandomResized: {
      const torch::Tensor p =
          sample_params(o, torch::tensor({sample}, torch::kInt64), height, width, seed, epoch);
      const auto v = [&](Param k) { return static_cast<int64_t>(p[0][k].item<float>()); };
      plan.box = CropBox{v(kY0), v(kX0), v(kH), v(kW)};
      plan.hflip = v(kHFlip) != 0;
      plan.vflip = v(kVFlip) != 0;
      break;
    }
    case CropMode::kNone: {
      // Resize(shorter side -> resize) + CenterCrop(size), as a crop of the original.
      const int64_t resize = decode.resize() > 0
                                 ? decode.resize()
                                 : static_cast<int64_t>(std::lround(std::max(size[0], size[1]) / 0.875));
      const double per = static_cast<double>(std::min(height, width)) / static_cast<double>(resize);
      // (sides rounded half to even, as Python's round)
      plan.box.height = std::clamp<int64_t>(std::llrint(static_cast<double>(size[0]) * per), 1, height);
      plan.box.width = std::clamp<int64_t>(std::llrint(static_cast<double>(size[1]) * per), 1, width);
      plan.box.top = (height - plan.box.height) / 2;
      plan.box.left = (width - plan.box.width) / 2;
      break;
    }
    case CropMode::kPad:
      ember::detail::fail(
          ErrorKind::kConfig,
          "[augment] crop \"pad\" needs images of one size; decoded images take crop \"resized\" "
          "(training) or \"none\" (evaluation)");
  }
  return plan;
}

DecodePlan decode_plan(std::string_view bytes, const AugmentOptions& options, uint64_t seed, int64_t sample,
                       int64_t epoch, const DecodeOptions& decode) {
  const std::vector<int64_t> hw = image_size(bytes);
  EMBER_CHECK_KIND(kData, hw[0] * hw[1] <= decode.max_pixels(), "declares {}x{} pixels, over max_pixels ({})",
                   hw[0], hw[1], decode.max_pixels());
  return decode_plan(hw[0], hw[1], options, seed, sample, epoch, decode);
}

torch::Tensor decode_image(std::string_view bytes, const AugmentOptions& options, uint64_t seed,
                           int64_t sample, int64_t epoch, const DecodeOptions& decode) {
  const DecodePlan plan = decode_plan(bytes, options, seed, sample, epoch, decode);
  return decode_crop(bytes, plan.box, options.size(), plan.hflip, plan.vflip, decode);
}

AugmentOptions after_decode(const AugmentOptions& options) {
  AugmentOptions o = options;
  o.crop(CropMode::kNone).hflip(0).vflip(0);
  return o;
}

}  // namespace ember::augment

// decode_crop as a PyTorch operator (torch.ops.ember.decode_crop), for the
// parity tests and benchmarks against torchvision: bytes is a uint8 CPU tensor
// of the encoded file, box {top, left, height, width}, size {H, W}.
namespace {
torch::Tensor decode_crop_op(const torch::Tensor& bytes, c10::IntArrayRef box, c10::IntArrayRef size,
                             bool hflip, bool vflip, bool dct_scaling) {
  EMBER_CHECK(
      bytes.scalar_type() == torch::kUInt8 && bytes.dim() == 1 && bytes.is_cpu() && bytes.is_contiguous(),
      "[ember::decode_crop] bytes must be a contiguous uint8 [N] CPU tensor");
  EMBER_CHECK(box.size() == 4, "[ember::decode_crop] box is {{top, left, height, width}}");
  const std::string_view view(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                              static_cast<size_t>(bytes.numel()));
  return ember::augment::decode_crop(view, {box[0], box[1], box[2], box[3]}, size.vec(), hflip, vflip,
                                     ember::augment::DecodeOptions().dct_scaling(dct_scaling));
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def(
      "decode_crop(Tensor bytes, int[] box, int[] size, bool hflip, bool vflip, bool dct_scaling) -> Tensor");
}
TORCH_LIBRARY_IMPL(ember, CPU, m) {
  m.impl("decode_crop", &decode_crop_op);
}
