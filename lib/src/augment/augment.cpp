#include "ember/augment/augment.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <array>
#include <cmath>

#include "core/check.h"
#include "ember/augment/philox.h"

namespace ember::augment {
namespace {

// Philox draw blocks of one sample (4 uniforms each).
constexpr uint32_t kCropAttempts = 10;       // blocks 0..9: random resized crop attempts
constexpr uint32_t kBlockFlipsAndPad = 10;   // flips (u0, u1), pad offsets (u2, u3)

struct Geometry {
  int64_t n, h, w, c;  // input
  int64_t oh, ow;      // output
};

Geometry check_inputs(const torch::Tensor& images, const AugmentOptions& o) {
  EMBER_CHECK(images.defined() && images.scalar_type() == torch::kUInt8,
              "[augment] images must be uint8, got {}", images.defined() ? c10::toString(images.scalar_type()) : "none");
  Geometry g{};
  if (images.dim() == 3) {
    g = {images.size(0), images.size(1), images.size(2), 1, 0, 0};
  } else if (images.dim() == 4 && images.size(1) == 1 && images.size(3) != 1 && images.size(3) != 3) {
    g = {images.size(0), images.size(2), images.size(3), 1, 0, 0};  // [N, 1, H, W]
  } else {
    EMBER_CHECK(images.dim() == 4 && (images.size(3) == 1 || images.size(3) == 3),
                "[augment] images must be [N, H, W, C] with C = 1 or 3 (NHWC), [N, H, W] or [N, 1, H, W]; got [{}]",
                fmt::join(images.sizes(), ", "));
    g = {images.size(0), images.size(1), images.size(2), images.size(3), 0, 0};
  }
  EMBER_CHECK(g.h > 0 && g.w > 0, "[augment] empty images [{}]", fmt::join(images.sizes(), ", "));
  const auto& size = o.size();
  EMBER_CHECK(size.empty() || (size.size() == 2 && size[0] > 0 && size[1] > 0),
              "[augment] size must be {{H, W}} with H, W > 0 (or empty for the input size), got [{}]",
              fmt::join(size, ", "));
  g.oh = size.empty() ? g.h : size[0];
  g.ow = size.empty() ? g.w : size[1];
  EMBER_CHECK(o.mean().size() == o.std().size() && (o.mean().empty() || static_cast<int64_t>(o.mean().size()) == g.c),
              "[augment] mean and std need one value per channel ({}), got {} and {}", g.c, o.mean().size(),
              o.std().size());
  for (double s : o.std()) EMBER_CHECK(s > 0, "[augment] std values must be > 0, got {}", s);
  EMBER_CHECK(o.dtype() == torch::kFloat32 || o.dtype() == torch::kFloat16 || o.dtype() == torch::kBFloat16,
              "[augment] output dtype must be float32, float16 or bfloat16, got {}", c10::toString(o.dtype()));
  return g;
}

void check_options(const AugmentOptions& o) {
  EMBER_CHECK(o.hflip() >= 0 && o.hflip() <= 1 && o.vflip() >= 0 && o.vflip() <= 1,
              "[augment] flip probabilities must be in [0, 1], got hflip {} vflip {}", o.hflip(), o.vflip());
  EMBER_CHECK(o.padding() >= 0, "[augment] padding must be >= 0, got {}", o.padding());
  EMBER_CHECK(o.scale().size() == 2 && o.scale()[0] > 0 && o.scale()[0] <= o.scale()[1] && o.scale()[1] <= 1,
              "[augment] scale must be {{min, max}} with 0 < min <= max <= 1, got [{}]", fmt::join(o.scale(), ", "));
  EMBER_CHECK(o.ratio().size() == 2 && o.ratio()[0] > 0 && o.ratio()[0] <= o.ratio()[1],
              "[augment] ratio must be {{min, max}} with 0 < min <= max, got [{}]", fmt::join(o.ratio(), ", "));
}

int64_t randint(float u, int64_t n) {  // uniform in [0, n)
  return std::min<int64_t>(static_cast<int64_t>(u * static_cast<float>(n)), n - 1);
}

// torchvision's RandomResizedCrop.get_params with Philox draws; returns {x0, y0, w, h}.
std::array<float, 4> resized_crop_box(const AugmentOptions& o, uint64_t seed, uint64_t sample, uint32_t epoch,
                                      int64_t H, int64_t W) {
  const double area = static_cast<double>(H * W);
  const double log_r0 = std::log(o.ratio()[0]), log_r1 = std::log(o.ratio()[1]);
  float u[4];
  for (uint32_t attempt = 0; attempt < kCropAttempts; ++attempt) {
    sample_uniforms(seed, sample, epoch, attempt, u);
    const double target = area * (o.scale()[0] + (o.scale()[1] - o.scale()[0]) * u[0]);
    const double aspect = std::exp(log_r0 + (log_r1 - log_r0) * u[1]);
    const auto w = static_cast<int64_t>(std::lround(std::sqrt(target * aspect)));
    const auto h = static_cast<int64_t>(std::lround(std::sqrt(target / aspect)));
    if (w > 0 && w <= W && h > 0 && h <= H) {
      const int64_t y0 = randint(u[2], H - h + 1), x0 = randint(u[3], W - w + 1);
      return {static_cast<float>(x0), static_cast<float>(y0), static_cast<float>(w), static_cast<float>(h)};
    }
  }
  // Fallback, as torchvision: the central crop with the ratio clamped into range.
  const double in_ratio = static_cast<double>(W) / static_cast<double>(H);
  int64_t w = W, h = H;
  if (in_ratio < o.ratio()[0]) h = std::lround(static_cast<double>(W) / o.ratio()[0]);
  else if (in_ratio > o.ratio()[1]) w = std::lround(static_cast<double>(H) * o.ratio()[1]);
  return {static_cast<float>((W - w) / 2), static_cast<float>((H - h) / 2), static_cast<float>(w),
          static_cast<float>(h)};
}

// Bilinear sampling of the crop box as torch.nn.functional.interpolate
// (align_corners=False, antialias=False) samples the cropped image: box
// coordinates are clamped at 0 and the upper neighbour at the box's last
// pixel. Box pixels outside the image are 0 (padding).
struct Tap {
  int64_t i0, i1;  // source pixel indices (may be outside the image)
  float frac;      // weight of i1
};

inline Tap tap(int64_t out_index, int64_t out_size, float box_start, float box_size) {
  const auto n = std::max<int64_t>(1, static_cast<int64_t>(std::lround(box_size)));
  float b = (static_cast<float>(out_index) + 0.5f) * box_size / static_cast<float>(out_size) - 0.5f;
  b = std::max(b, 0.0f);
  const int64_t b0 = std::min<int64_t>(static_cast<int64_t>(b), n - 1);
  const int64_t b1 = std::min<int64_t>(b0 + 1, n - 1);
  const auto start = static_cast<int64_t>(std::lround(box_start));
  return {start + b0, start + b1, b - static_cast<float>(b0)};
}

inline float sample_bilinear(const uint8_t* img, int64_t H, int64_t W, int64_t C, int64_t c, const Tap& ty,
                             const Tap& tx) {
  const auto at = [&](int64_t y, int64_t x) {
    return (y >= 0 && y < H && x >= 0 && x < W) ? static_cast<float>(img[(y * W + x) * C + c]) : 0.0f;
  };
  return (1.0f - ty.frac) * ((1.0f - tx.frac) * at(ty.i0, tx.i0) + tx.frac * at(ty.i0, tx.i1)) +
         ty.frac * ((1.0f - tx.frac) * at(ty.i1, tx.i0) + tx.frac * at(ty.i1, tx.i1));
}

}  // namespace

torch::Tensor sample_params(const AugmentOptions& options, const torch::Tensor& sample_indices, int64_t height,
                            int64_t width, uint64_t seed, int64_t epoch) {
  check_options(options);
  EMBER_CHECK(sample_indices.dim() == 1 && sample_indices.scalar_type() == torch::kInt64,
              "[augment::sample_params] sample_indices must be int64 [N], got {} [{}]",
              c10::toString(sample_indices.scalar_type()), fmt::join(sample_indices.sizes(), ", "));
  EMBER_CHECK(epoch >= 0 && epoch <= UINT32_MAX, "[augment::sample_params] epoch out of range: {}", epoch);
  const int64_t oh = options.size().empty() ? height : options.size()[0];
  const int64_t ow = options.size().empty() ? width : options.size()[1];
  const torch::Tensor idx = sample_indices.cpu().contiguous();
  const int64_t n = idx.size(0);
  torch::Tensor params = torch::empty({n, kNumParams}, torch::kFloat32);
  const int64_t* ip = idx.data_ptr<int64_t>();
  float* pp = params.data_ptr<float>();
  const auto ep = static_cast<uint32_t>(epoch);
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto sample = static_cast<uint64_t>(ip[i]);
      float* p = pp + i * kNumParams;
      float u[4];
      sample_uniforms(seed, sample, ep, kBlockFlipsAndPad, u);
      switch (options.crop()) {
        case CropMode::kNone:
          p[kX0] = 0, p[kY0] = 0, p[kW] = static_cast<float>(width), p[kH] = static_cast<float>(height);
          break;
        case CropMode::kPad: {
          const int64_t pad = options.padding();
          p[kX0] = static_cast<float>(randint(u[3], width + 2 * pad - ow + 1) - pad);
          p[kY0] = static_cast<float>(randint(u[2], height + 2 * pad - oh + 1) - pad);
          p[kW] = static_cast<float>(ow), p[kH] = static_cast<float>(oh);
          break;
        }
        case CropMode::kRandomResized: {
          const auto box = resized_crop_box(options, seed, sample, ep, height, width);
          p[kX0] = box[0], p[kY0] = box[1], p[kW] = box[2], p[kH] = box[3];
          break;
        }
      }
      p[kHFlip] = u[0] < options.hflip() ? 1.0f : 0.0f;
      p[kVFlip] = u[1] < options.vflip() ? 1.0f : 0.0f;
    }
  });
  if (options.crop() == CropMode::kPad)
    EMBER_CHECK(height + 2 * options.padding() >= oh && width + 2 * options.padding() >= ow,
                "[augment] a {}x{} crop does not fit a {}x{} image padded by {}", oh, ow, height, width,
                options.padding());
  return params;
}

torch::Tensor apply(const torch::Tensor& images, const torch::Tensor& params, const AugmentOptions& options) {
  check_options(options);
  const Geometry g = check_inputs(images, options);
  EMBER_CHECK(params.dim() == 2 && params.size(0) == g.n && params.size(1) == kNumParams &&
                  params.scalar_type() == torch::kFloat32,
              "[augment::apply] params must be float32 [{}, {}] (from sample_params), got {} [{}]", g.n,
              static_cast<int64_t>(kNumParams), c10::toString(params.scalar_type()), fmt::join(params.sizes(), ", "));
  EMBER_CHECK(images.device().is_cpu(),
              "[augment::apply] images on {}: the CUDA kernel is not built yet; move them to the CPU",
              images.device().str());
  const torch::Tensor src = images.contiguous();
  const torch::Tensor par = params.cpu().contiguous();
  torch::Tensor out = torch::empty({g.n, g.oh, g.ow, g.c}, torch::kFloat32);  // NHWC while computing
  const uint8_t* sp = src.data_ptr<uint8_t>();
  const float* pp = par.data_ptr<float>();
  float* op = out.data_ptr<float>();
  float scale[3], shift[3];  // v = pixel * scale + shift
  for (int64_t c = 0; c < g.c; ++c) {
    const bool norm = !options.mean().empty();
    const double s = norm ? options.std()[c] : 1.0;
    scale[c] = static_cast<float>(1.0 / (255.0 * s));
    shift[c] = norm ? static_cast<float>(-options.mean()[c] / s) : 0.0f;
  }
  at::parallel_for(0, g.n * g.oh, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t i = row / g.oh, oy = row % g.oh;
      const float* p = pp + i * kNumParams;
      const uint8_t* img = sp + i * g.h * g.w * g.c;
      const Tap ty = tap(p[kVFlip] > 0.5f ? g.oh - 1 - oy : oy, g.oh, p[kY0], p[kH]);
      float* dst = op + row * g.ow * g.c;
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        const Tap tx = tap(p[kHFlip] > 0.5f ? g.ow - 1 - ox : ox, g.ow, p[kX0], p[kW]);
        for (int64_t c = 0; c < g.c; ++c)
          dst[ox * g.c + c] = sample_bilinear(img, g.h, g.w, g.c, c, ty, tx) * scale[c] + shift[c];
      }
    }
  });
  torch::Tensor result = options.layout() == Layout::kNCHW ? out.permute({0, 3, 1, 2}).contiguous() : out;
  return result.to(options.dtype());
}

AugmentResult augment(const torch::Tensor& images, const torch::Tensor& sample_indices,
                      const AugmentOptions& options, uint64_t seed, int64_t epoch) {
  const Geometry g = check_inputs(images, options);
  EMBER_CHECK(sample_indices.dim() == 1 && sample_indices.size(0) == g.n,
              "[augment] sample_indices must be [N] with N = {} images, got [{}]", g.n,
              fmt::join(sample_indices.sizes(), ", "));
  torch::Tensor params = sample_params(options, sample_indices, g.h, g.w, seed, epoch);
  return {apply(images, params, options), params};
}

}  // namespace ember::augment
