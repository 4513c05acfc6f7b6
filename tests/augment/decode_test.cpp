// augment::decode_image and its parts on JPEG and PNG made here (libjpeg,
// libpng): the crop and flips are sample_params' for the image's size, the
// evaluation crop is Resize + CenterCrop's, DCT scaling keeps the picture,
// damaged and oversized files are refused. Pixel parity with torchvision:
// tests/augment/decode_parity_test.py.
#include <ember/augment/decode.h>
#include <ember/augment/nvjpeg.h>
#include <ember/augment/param.h>
#include <ember/core/error.h>
#include <gtest/gtest.h>
#include <jpeglib.h>
#include <png.h>
#include <torch/torch.h>

#include <cstring>

#include "train/test_task.h"

using namespace ember;
using test_util::error_of;

namespace {

/// A smooth RGB test picture, uint8 [h, w, 3]: a gradient with a red block.
torch::Tensor picture(int64_t h, int64_t w) {
  auto y = torch::arange(h, torch::kFloat).view({h, 1, 1}).expand({h, w, 1});
  auto x = torch::arange(w, torch::kFloat).view({1, w, 1}).expand({h, w, 1});
  torch::Tensor img = torch::cat({x * 255 / w, y * 255 / h, (x + y) * 127 / (h + w)}, 2);
  img.narrow(0, h / 3, h / 6).narrow(1, w / 4, w / 4).copy_(torch::tensor({250.f, 20.f, 20.f}));
  return img.round().clamp(0, 255).to(torch::kUInt8).contiguous();
}

std::string jpeg_of(const torch::Tensor& img, int quality = 95) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &out, &size);
  c.image_width = static_cast<JDIMENSION>(img.size(1));
  c.image_height = static_cast<JDIMENSION>(img.size(0));
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  const auto* data = img.data_ptr<uint8_t>();
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(data + c.next_scanline * img.size(1) * 3);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::string bytes(reinterpret_cast<char*>(out), size);
  std::free(out);
  return bytes;
}

std::string png_of(const torch::Tensor& img) {
  png_image p;
  std::memset(&p, 0, sizeof p);
  p.version = PNG_IMAGE_VERSION;
  p.width = static_cast<png_uint_32>(img.size(1));
  p.height = static_cast<png_uint_32>(img.size(0));
  p.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  png_image_write_to_memory(&p, nullptr, &size, 0, img.data_ptr<uint8_t>(), 0, nullptr);
  std::string bytes(size, '\0');
  EXPECT_TRUE(png_image_write_to_memory(&p, bytes.data(), &size, 0, img.data_ptr<uint8_t>(), 0, nullptr));
  bytes.resize(size);
  return bytes;
}

augment::AugmentOptions training(int64_t size) {
  return augment::AugmentOptions().crop(augment::CropMode::kRandomResized).size({size, size}).hflip(0.5);
}

}  // namespace

TEST(Decode, CropsAndFlipsAreSampleParamsForTheImagesSize) {
  const torch::Tensor img = picture(300, 400);
  const std::string png = png_of(img);
  EXPECT_EQ(augment::image_size(png), (std::vector<int64_t>{300, 400}));
  EXPECT_EQ(augment::image_size(jpeg_of(img)), (std::vector<int64_t>{300, 400}));
  const auto o = training(64);
  int flipped = 0;
  for (int64_t sample = 0; sample < 20; ++sample) {
    const torch::Tensor p = augment::sample_params(o, torch::tensor({sample}, torch::kInt64), 300, 400, 9, 3);
    const augment::DecodePlan plan = augment::decode_plan(300, 400, o, 9, sample, 3);
    EXPECT_EQ(plan.box.left, p[0][augment::kX0].item<float>());
    EXPECT_EQ(plan.box.top, p[0][augment::kY0].item<float>());
    EXPECT_EQ(plan.box.width, p[0][augment::kW].item<float>());
    EXPECT_EQ(plan.box.height, p[0][augment::kH].item<float>());
    EXPECT_EQ(plan.hflip, p[0][augment::kHFlip].item<float>() != 0);
    flipped += plan.hflip;
    // PNG is decoded whole: the crop, resized, is ATen's resize of the crop of the original.
    const torch::Tensor got = augment::decode_image(png, o, 9, sample, 3);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{64, 64, 3}));
    torch::Tensor crop =
        img.narrow(0, plan.box.top, plan.box.height).narrow(1, plan.box.left, plan.box.width);
    torch::Tensor want = torch::nn::functional::interpolate(
                             crop.permute({2, 0, 1}).unsqueeze(0).contiguous(at::MemoryFormat::ChannelsLast),
                             torch::nn::functional::InterpolateFuncOptions()
                                 .size(std::vector<int64_t>{64, 64})
                                 .mode(torch::kBilinear)
                                 .align_corners(false)
                                 .antialias(true))[0]
                             .permute({1, 2, 0});
    if (plan.hflip) want = want.flip({1});
    EXPECT_TRUE(torch::equal(got, want.contiguous())) << "sample " << sample;
  }
  EXPECT_GT(flipped, 3);
  EXPECT_LT(flipped, 17);
  // after_decode: the crop and flips are done; the rest is unchanged.
  const auto rest = augment::after_decode(augment::AugmentOptions(o).brightness(0.4));
  EXPECT_EQ(rest.crop(), augment::CropMode::kNone);
  EXPECT_EQ(rest.hflip(), 0);
  EXPECT_EQ(rest.brightness(), 0.4);
}

TEST(Decode, EvaluationIsResizeThenCenterCropAsACropOfTheOriginal) {
  // 300 x 400, output 224: Resize(256) scales by 256 / 300; the centre 224 x 224
  // of that is 262.5 -> 262 original pixels a side, centred.
  const augment::DecodePlan plan = augment::decode_plan(
      300, 400, augment::AugmentOptions().crop(augment::CropMode::kNone).size({224, 224}), 0, 5, 0);
  EXPECT_EQ(plan.box.height, 262);
  EXPECT_EQ(plan.box.width, 262);
  EXPECT_EQ(plan.box.top, 19);
  EXPECT_EQ(plan.box.left, 69);
  EXPECT_FALSE(plan.hflip);
  EXPECT_NE(error_of([] {
              augment::decode_plan(
                  10, 10, augment::AugmentOptions().crop(augment::CropMode::kPad).size({8, 8}), 0, 0, 0);
            }).find("needs images of one size"),
            std::string::npos);
}

TEST(Decode, DctScalingKeepsThePicture) {
  // A 1600 x 1200 JPEG cropped whole to 100 x 75: scale 1/8 in the DCT.
  const torch::Tensor img = picture(1200, 1600);
  const std::string jpeg = jpeg_of(img, 95);
  const augment::CropBox box{0, 0, 1200, 1600};
  const torch::Tensor full =
      augment::decode_crop(jpeg, box, {75, 100}, false, false, augment::DecodeOptions().dct_scaling(false));
  const torch::Tensor scaled = augment::decode_crop(jpeg, box, {75, 100}, false, false);
  const double mean = (full.to(torch::kFloat) - scaled.to(torch::kFloat)).abs().mean().item<double>();
  // A smooth picture: the 1/8 IDCT (the DC term) and a 16x antialiased resize agree closely.
  EXPECT_LT(mean, 3.0);
  // A crop of the red block lands red either way.
  const augment::CropBox red{420, 420, 160, 380};
  for (const bool dct : {false, true}) {
    const torch::Tensor r =
        augment::decode_crop(jpeg, red, {20, 40}, false, false, augment::DecodeOptions().dct_scaling(dct));
    EXPECT_GT(r.select(2, 0).to(torch::kFloat).mean().item<double>(), 230) << dct;
    EXPECT_LT(r.select(2, 1).to(torch::kFloat).mean().item<double>(), 50) << dct;
  }
}

TEST(Decode, DamagedOversizedAndForeignFilesAreRefused) {
  const torch::Tensor img = picture(200, 300);
  const std::string jpeg = jpeg_of(img), png = png_of(img);
  const auto o = augment::AugmentOptions().crop(augment::CropMode::kNone).size({32, 32});
  auto error = [&](const std::string& bytes, augment::DecodeOptions d = {}) {
    try {
      augment::decode_image(bytes, o, 0, 0, 0, d);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kData);
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(jpeg.substr(0, jpeg.size() / 2)).find("truncated"), std::string::npos);
  EXPECT_NE(error(png.substr(0, png.size() / 2)).find("libpng"), std::string::npos);
  EXPECT_NE(error(jpeg.substr(0, 100)).find("libjpeg"), std::string::npos);
  EXPECT_NE(error("GIF89a..........").find("not JPEG or PNG content"), std::string::npos);
  EXPECT_NE(
      error(jpeg, augment::DecodeOptions().max_pixels(200 * 300 - 1)).find("200x300 pixels, over max_pixels"),
      std::string::npos);
  EXPECT_NE(error(png, augment::DecodeOptions().max_pixels(100)).find("over max_pixels"), std::string::npos);
  EXPECT_EQ(error(jpeg), "");
  EXPECT_EQ(error(png), "");
}

// nvJPEG (augment/nvjpeg.h) decodes on a CUDA device only: without one (or
// without nvJPEG) the decoder refuses to be made, saying why. Its decoding is
// judged on a GPU by the device check's data rows (not yet run).
TEST(Decode, NvjpegRefusesWhereItCannotRun) {
  std::string why;
  EXPECT_FALSE(augment::nvjpeg_available(torch::kCPU, &why));
  EXPECT_FALSE(why.empty());
  if (torch::cuda::is_available() && augment::nvjpeg_available(torch::kCUDA))
    GTEST_SKIP() << "nvJPEG runs here";
  why.clear();
  EXPECT_FALSE(augment::nvjpeg_available(torch::kCUDA, &why));
  try {
    augment::NvjpegDecoder decoder(torch::kCUDA);
    ADD_FAILURE() << "an nvJPEG decoder was made where nvjpeg_available says: " << why;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}
