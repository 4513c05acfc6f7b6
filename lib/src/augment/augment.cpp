#include "ember/augment/augment.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <array>
#include <cmath>

#include "augment/apply_impl.h"
#include "augment/pixel.h"
#include "core/check.h"
#include "core/staging.h"
#include "ember/augment/philox.h"
#include "ember/core/enum_names.h"
#include "ember/core/error.h"

namespace ember::augment {

namespace {
constexpr core::EnumNames<CropMode, 3> kCropModeNames{
    "crop mode",
    {{{CropMode::kNone, "none"}, {CropMode::kPad, "pad"}, {CropMode::kRandomResized, "resized"}}}};
}  // namespace

CropMode parse_crop_mode(const std::string& name, const std::string& what) {
  return kCropModeNames.parse(name, what);
}

const char* to_string(CropMode mode) {
  return kCropModeNames.name(mode);
}

namespace {

// Philox draw blocks of one sample (4 uniforms each).
constexpr uint32_t kCropAttempts = 10;      // blocks 0..9: random resized crop attempts
constexpr uint32_t kBlockFlipsAndPad = 10;  // flips (u0, u1), pad offsets (u2 y, u3 x)
constexpr uint32_t kBlockColor = 11;        // brightness, contrast, saturation, hue
constexpr uint32_t kBlockGates = 12;        // colour applied (u0), grayscale (u1), erase (u2)
constexpr uint32_t kBlockErase = 13;        // blocks 13..22: erase attempts
constexpr uint32_t kEraseAttempts = 10;

struct Geometry {
  int64_t n, h, w, c;  // input
  int64_t oh, ow;      // output
};

Geometry check_inputs(const torch::Tensor& images, const AugmentOptions& o) {
  EMBER_CHECK(images.defined() && images.scalar_type() == torch::kUInt8,
              "[augment] images must be uint8, got {}",
              images.defined() ? c10::toString(images.scalar_type()) : "none");
  Geometry g{};
  if (images.dim() == 3) {
    g = {images.size(0), images.size(1), images.size(2), 1, 0, 0};
  } else if (images.dim() == 4 && images.size(1) == 1 && images.size(3) != 1 && images.size(3) != 3) {
    g = {images.size(0), images.size(2), images.size(3), 1, 0, 0};  // [N, 1, H, W]
  } else {
    EMBER_CHECK(
        images.dim() == 4 && (images.size(3) == 1 || images.size(3) == 3),
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
  EMBER_CHECK(
      o.mean().size() == o.std().size() && (o.mean().empty() || static_cast<int64_t>(o.mean().size()) == g.c),
      "[augment] mean and std need one value per channel ({}), got {} and {}", g.c, o.mean().size(),
      o.std().size());
  for (double s : o.std()) EMBER_CHECK(s > 0, "[augment] std values must be > 0, got {}", s);
  EMBER_CHECK(o.dtype() == torch::kFloat32 || o.dtype() == torch::kFloat16 || o.dtype() == torch::kBFloat16,
              "[augment] output dtype must be float32, float16 or bfloat16, got {}",
              c10::toString(o.dtype()));
  return g;
}

void check_options(const AugmentOptions& o) {
  EMBER_CHECK(o.hflip() >= 0 && o.hflip() <= 1 && o.vflip() >= 0 && o.vflip() <= 1,
              "[augment] flip probabilities must be in [0, 1], got hflip {} vflip {}", o.hflip(), o.vflip());
  EMBER_CHECK(o.padding() >= 0, "[augment] padding must be >= 0, got {}", o.padding());
  EMBER_CHECK(o.scale().size() == 2 && o.scale()[0] > 0 && o.scale()[0] <= o.scale()[1] && o.scale()[1] <= 1,
              "[augment] scale must be {{min, max}} with 0 < min <= max <= 1, got [{}]",
              fmt::join(o.scale(), ", "));
  EMBER_CHECK(o.ratio().size() == 2 && o.ratio()[0] > 0 && o.ratio()[0] <= o.ratio()[1],
              "[augment] ratio must be {{min, max}} with 0 < min <= max, got [{}]",
              fmt::join(o.ratio(), ", "));
  EMBER_CHECK(o.brightness() >= 0 && o.contrast() >= 0 && o.saturation() >= 0,
              "[augment] brightness, contrast and saturation must be >= 0 (0 = off), got {} {} {}",
              o.brightness(), o.contrast(), o.saturation());
  EMBER_CHECK(o.hue() >= 0 && o.hue() <= 0.5, "[augment] hue must be in [0, 0.5] turns, got {}", o.hue());
  for (double prob : {o.color_p(), o.grayscale(), o.erase()})
    EMBER_CHECK(prob >= 0 && prob <= 1,
                "[augment] color_p, grayscale and erase are probabilities in [0, 1], got {}", prob);
  EMBER_CHECK(o.contrast_center() >= 0 && o.contrast_center() <= 1,
              "[augment] contrast_center must be in [0, 1], got {}", o.contrast_center());
  EMBER_CHECK(o.erase_scale().size() == 2 && o.erase_scale()[0] > 0 &&
                  o.erase_scale()[0] <= o.erase_scale()[1] && o.erase_scale()[1] < 1,
              "[augment] erase_scale must be {{min, max}} with 0 < min <= max < 1, got [{}]",
              fmt::join(o.erase_scale(), ", "));
  EMBER_CHECK(
      o.erase_ratio().size() == 2 && o.erase_ratio()[0] > 0 && o.erase_ratio()[0] <= o.erase_ratio()[1],
      "[augment] erase_ratio must be {{min, max}} with 0 < min <= max, got [{}]",
      fmt::join(o.erase_ratio(), ", "));
  EMBER_CHECK(std::isfinite(o.erase_value()), "[augment] erase_value must be finite, got {}",
              o.erase_value());
}

void check_params(const torch::Tensor& params, int64_t n) {
  EMBER_CHECK(params.defined() && params.dim() == 2 && params.size(0) == n && params.size(1) == kNumParams &&
                  params.scalar_type() == torch::kFloat32,
              "[augment::apply] params must be float32 [{}, {}] (from sample_params), got {} [{}]", n,
              static_cast<int64_t>(kNumParams),
              params.defined() ? c10::toString(params.scalar_type()) : "none",
              params.defined() ? fmt::format("{}", fmt::join(params.sizes(), ", ")) : "");
  if (params.is_cpu() && n > 0) {  // (on a GPU this check would cost a host sync)
    EMBER_CHECK(
        params.isfinite().all().item<bool>() && params.abs().lt(16777216.0f).all().item<bool>(),
        "[augment::apply] params must be finite and within +-2^24 (whole pixels, factors); got {} / {}",
        params.min().item<float>(), params.max().item<float>());
  }
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
  if (in_ratio < o.ratio()[0])
    h = std::lround(static_cast<double>(W) / o.ratio()[0]);
  else if (in_ratio > o.ratio()[1])
    w = std::lround(static_cast<double>(H) * o.ratio()[1]);
  return {static_cast<float>((W - w) / 2), static_cast<float>((H - h) / 2), static_cast<float>(w),
          static_cast<float>(h)};
}

// torchvision's RandomErasing.get_params on an oh x ow output with Philox
// draws; returns {x0, y0, w, h}, w = h = 0 when no attempt fits.
std::array<float, 4> erase_box(const AugmentOptions& o, uint64_t seed, uint64_t sample, uint32_t epoch,
                               int64_t oh, int64_t ow) {
  const double area = static_cast<double>(oh * ow);
  const double log_r0 = std::log(o.erase_ratio()[0]), log_r1 = std::log(o.erase_ratio()[1]);
  float u[4];
  for (uint32_t attempt = 0; attempt < kEraseAttempts; ++attempt) {
    sample_uniforms(seed, sample, epoch, kBlockErase + attempt, u);
    const double target = area * (o.erase_scale()[0] + (o.erase_scale()[1] - o.erase_scale()[0]) * u[0]);
    const double aspect = std::exp(log_r0 + (log_r1 - log_r0) * u[1]);  // h / w
    const auto h = static_cast<int64_t>(std::lround(std::sqrt(target * aspect)));
    const auto w = static_cast<int64_t>(std::lround(std::sqrt(target / aspect)));
    if (h < oh && w < ow && h > 0 && w > 0) {
      const int64_t y0 = randint(u[2], oh - h + 1), x0 = randint(u[3], ow - w + 1);
      return {static_cast<float>(x0), static_cast<float>(y0), static_cast<float>(w), static_cast<float>(h)};
    }
  }
  return {0, 0, 0, 0};
}

// A factor uniform in [max(0, 1 - x), 1 + x] (torchvision's ColorJitter); 1 when x = 0.
float jitter_factor(double x, float u) {
  if (x == 0) return 1.0f;
  const double lo = std::max(0.0, 1.0 - x), hi = 1.0 + x;
  return static_cast<float>(lo + (hi - lo) * u);
}

detail::BatchGeometry batch_geometry(const Geometry& g, const std::vector<double>& mean,
                                     const std::vector<double>& stdv, double contrast_center,
                                     double erase_value) {
  detail::BatchGeometry b{};
  b.n = static_cast<int>(g.n), b.h = static_cast<int>(g.h), b.w = static_cast<int>(g.w),
  b.c = static_cast<int>(g.c);
  b.oh = static_cast<int>(g.oh), b.ow = static_cast<int>(g.ow);
  for (int64_t c = 0; c < g.c; ++c) {
    b.mean[c] = mean.empty() ? 0.0f : static_cast<float>(mean[c]);
    b.inv_std[c] = stdv.empty() ? 1.0f : static_cast<float>(1.0 / stdv[c]);
  }
  b.contrast_center = static_cast<float>(contrast_center);
  b.erase_value = static_cast<float>(erase_value);
  return b;
}

// One output row of one sample, computed as detail::augment_pixel computes
// each pixel (the same operations in the same order, so the same bits), but
// with the horizontal taps computed once per sample and the loops split by
// stage so that the compiler vectorises the arithmetic.
struct RowScratch {
  std::vector<detail::Tap> tx;  // [ow] horizontal taps of the current sample
  std::vector<float> v;         // [ow * c] the row's values
};

void compute_row(const uint8_t* img, const detail::BatchGeometry& g, const detail::SamplePlan& s, int oy,
                 RowScratch& scratch) {
  const int c = g.c, ow = g.ow;
  float* v = scratch.v.data();
  const int sy = s.vflip ? g.oh - 1 - oy : oy;
  const auto row_ptr = [&](int y) {
    return (y >= 0 && y < g.h) ? img + static_cast<int64_t>(y) * g.w * c : nullptr;
  };
  const auto texel = [&](const uint8_t* r, int x, int ch) {
    return (r != nullptr && x >= 0 && x < g.w) ? static_cast<float>(r[x * c + ch]) : 0.0f;
  };
  if (s.exact) {
    const uint8_t* r = row_ptr(s.y0 + sy);
    for (int ox = 0; ox < ow; ++ox) {
      const int x = s.x0 + (s.hflip ? ow - 1 - ox : ox);
      for (int ch = 0; ch < c; ++ch) v[ox * c + ch] = texel(r, x, ch) * (1.0f / 255.0f);
    }
  } else {
    const detail::Tap ty = detail::make_tap(sy, s.sy, s.y0, s.bh);
    const uint8_t* r0 = row_ptr(ty.i0);
    const uint8_t* r1 = row_ptr(ty.i1);
    if (r0 != nullptr && r1 != nullptr && s.x0 >= 0 && s.x0 + s.bw <= g.w) {
      // The box row lies inside the image (always for random resized crops):
      // no bounds checks, the same arithmetic.
      for (int ox = 0; ox < ow; ++ox) {
        const detail::Tap& tx = scratch.tx[ox];
        const uint8_t* a0 = r0 + tx.i0 * c;
        const uint8_t* a1 = r0 + tx.i1 * c;
        const uint8_t* b0 = r1 + tx.i0 * c;
        const uint8_t* b1 = r1 + tx.i1 * c;
        for (int ch = 0; ch < c; ++ch) {
          const float top =
              (1.0f - tx.frac) * static_cast<float>(a0[ch]) + tx.frac * static_cast<float>(a1[ch]);
          const float bot =
              (1.0f - tx.frac) * static_cast<float>(b0[ch]) + tx.frac * static_cast<float>(b1[ch]);
          v[ox * c + ch] = ((1.0f - ty.frac) * top + ty.frac * bot) * (1.0f / 255.0f);
        }
      }
    } else {
      for (int ox = 0; ox < ow; ++ox) {
        const detail::Tap& tx = scratch.tx[ox];
        for (int ch = 0; ch < c; ++ch) {
          const float top = (1.0f - tx.frac) * texel(r0, tx.i0, ch) + tx.frac * texel(r0, tx.i1, ch);
          const float bot = (1.0f - tx.frac) * texel(r1, tx.i0, ch) + tx.frac * texel(r1, tx.i1, ch);
          v[ox * c + ch] = ((1.0f - ty.frac) * top + ty.frac * bot) * (1.0f / 255.0f);
        }
      }
    }
  }
  if (s.color) {
    const float* m = s.m;
    if (c == 3) {
      for (int ox = 0; ox < ow; ++ox) {
        float* p = v + ox * 3;
        const float r = m[0] * p[0] + m[1] * p[1] + m[2] * p[2] + m[3];
        const float gg = m[4] * p[0] + m[5] * p[1] + m[6] * p[2] + m[7];
        const float b = m[8] * p[0] + m[9] * p[1] + m[10] * p[2] + m[11];
        p[0] = r < 0.0f ? 0.0f : (r > 1.0f ? 1.0f : r);
        p[1] = gg < 0.0f ? 0.0f : (gg > 1.0f ? 1.0f : gg);
        p[2] = b < 0.0f ? 0.0f : (b > 1.0f ? 1.0f : b);
      }
    } else {
      for (int ox = 0; ox < ow; ++ox) {
        const float r = m[0] * v[ox] + m[3];
        v[ox] = r < 0.0f ? 0.0f : (r > 1.0f ? 1.0f : r);
      }
    }
  }
  for (int ox = 0; ox < ow; ++ox)
    for (int ch = 0; ch < c; ++ch) v[ox * c + ch] = (v[ox * c + ch] - g.mean[ch]) * g.inv_std[ch];
  if (oy >= s.ey0 && oy < s.ey1) {
    for (int ox = std::max(s.ex0, 0); ox < std::min(s.ex1, ow); ++ox)
      for (int ch = 0; ch < c; ++ch) v[ox * c + ch] = g.erase_value;
  }
}

// Each channel's output for each byte value, computed as compute_row computes
// a pixel that is copied, not interpolated, and not colour-transformed (the
// same operations in the same order, so the same bits).
template <typename T>
struct ByteTables {
  T value[detail::kMaxChannels][256];
};
template <typename T>
ByteTables<T> byte_tables(const detail::BatchGeometry& g) {
  ByteTables<T> t;
  for (int ch = 0; ch < g.c; ++ch)
    for (int u = 0; u < 256; ++u) {
      const float v = static_cast<float>(u) * (1.0f / 255.0f);
      t.value[ch][u] = static_cast<T>((v - g.mean[ch]) * g.inv_std[ch]);
    }
  return t;
}

// A row that copies source pixels (the box is the output size: images that
// were cropped and resized while decoding, or that already have the output
// size), without colour or erasing, and lies inside the image: a table
// lookup per value instead of compute_row's arithmetic. Returns false for
// any other row (compute_row takes it).
template <typename T>
bool copy_row(const uint8_t* img, const detail::BatchGeometry& g, const detail::SamplePlan& s, int oy,
              const ByteTables<T>& tables, bool nhwc, T* dst, int64_t plane) {
  const bool erased = oy >= s.ey0 && oy < s.ey1 && std::max(s.ex0, 0) < std::min(s.ex1, g.ow);
  if (!s.exact || s.color || erased) return false;
  const int y = s.y0 + (s.vflip ? g.oh - 1 - oy : oy);
  if (y < 0 || y >= g.h || s.x0 < 0 || s.x0 + g.ow > g.w) return false;
  const int c = g.c, ow = g.ow;
  const uint8_t* r = img + (static_cast<int64_t>(y) * g.w + s.x0) * c;
  if (nhwc) {
    for (int ox = 0; ox < ow; ++ox) {
      const uint8_t* p = r + (s.hflip ? ow - 1 - ox : ox) * c;
      for (int ch = 0; ch < c; ++ch) dst[ox * c + ch] = tables.value[ch][p[ch]];
    }
    return true;
  }
  for (int ch = 0; ch < c; ++ch) {
    const T* t = tables.value[ch];
    T* d = dst + ch * plane;
    if (s.hflip)
      for (int ox = 0; ox < ow; ++ox) d[ox] = t[r[(ow - 1 - ox) * c + ch]];
    else
      for (int ox = 0; ox < ow; ++ox) d[ox] = t[r[ox * c + ch]];
  }
  return true;
}

template <typename T>
void apply_cpu_typed(const uint8_t* src, const float* params, const detail::BatchGeometry& g, bool nhwc,
                     T* dst) {
  const int64_t plane = static_cast<int64_t>(g.oh) * g.ow;
  const ByteTables<T> tables = byte_tables<T>(g);
  at::parallel_for(0, static_cast<int64_t>(g.n) * g.oh, 16, [&](int64_t begin, int64_t end) {
    int64_t planned = -1;
    detail::SamplePlan plan{};
    RowScratch scratch{std::vector<detail::Tap>(g.ow), std::vector<float>(static_cast<size_t>(g.ow) * g.c)};
    for (int64_t row = begin; row < end; ++row) {
      const int64_t i = row / g.oh;
      const int oy = static_cast<int>(row % g.oh);
      if (i != planned) {
        plan = detail::make_plan(params + i * kNumParams, g);
        planned = i;
        if (!plan.exact)
          for (int ox = 0; ox < g.ow; ++ox)
            scratch.tx[ox] = detail::make_tap(plan.hflip ? g.ow - 1 - ox : ox, plan.sx, plan.x0, plan.bw);
      }
      const uint8_t* img = src + i * static_cast<int64_t>(g.h) * g.w * g.c;
      T* row_out = nhwc ? dst + (i * g.oh + oy) * static_cast<int64_t>(g.ow) * g.c
                        : dst + i * g.c * plane + static_cast<int64_t>(oy) * g.ow;
      if (copy_row(img, g, plan, oy, tables, nhwc, row_out, plane)) continue;
      compute_row(img, g, plan, oy, scratch);
      const float* v = scratch.v.data();
      if (nhwc) {
        for (int64_t k = 0; k < static_cast<int64_t>(g.ow) * g.c; ++k) row_out[k] = static_cast<T>(v[k]);
      } else {
        for (int ch = 0; ch < g.c; ++ch) {
          T* d = row_out + ch * plane;
          for (int ox = 0; ox < g.ow; ++ox) d[ox] = static_cast<T>(v[ox * g.c + ch]);
        }
      }
    }
  });
}

}  // namespace

AugmentOptions eval_options(const AugmentOptions& train) {
  AugmentOptions o = train;
  o.crop(CropMode::kNone)
      .hflip(0)
      .vflip(0)
      .brightness(0)
      .contrast(0)
      .saturation(0)
      .hue(0)
      .grayscale(0)
      .erase(0);
  return o;
}

torch::Tensor sample_params(const AugmentOptions& options, const torch::Tensor& sample_indices,
                            int64_t height, int64_t width, uint64_t seed, int64_t epoch) {
  check_options(options);
  EMBER_CHECK(sample_indices.dim() == 1 && sample_indices.scalar_type() == torch::kInt64,
              "[augment::sample_params] sample_indices must be int64 [N], got {} [{}]",
              c10::toString(sample_indices.scalar_type()), fmt::join(sample_indices.sizes(), ", "));
  EMBER_CHECK(epoch >= 0 && epoch <= UINT32_MAX, "[augment::sample_params] epoch out of range: {}", epoch);
  EMBER_CHECK(height > 0 && width > 0, "[augment::sample_params] image size {}x{} must be positive", height,
              width);
  const int64_t oh = options.size().empty() ? height : options.size()[0];
  const int64_t ow = options.size().empty() ? width : options.size()[1];
  if (options.crop() == CropMode::kPad)
    EMBER_CHECK(height + 2 * options.padding() >= oh && width + 2 * options.padding() >= ow,
                "[augment] a {}x{} crop does not fit a {}x{} image padded by {}", oh, ow, height, width,
                options.padding());
  const torch::Tensor idx = sample_indices.cpu().contiguous();
  const int64_t n = idx.size(0);
  torch::Tensor params = torch::empty({n, kNumParams}, torch::kFloat32);
  const int64_t* ip = idx.data_ptr<int64_t>();
  float* pp = params.data_ptr<float>();
  const auto ep = static_cast<uint32_t>(epoch);
  const bool jitter =
      options.brightness() > 0 || options.contrast() > 0 || options.saturation() > 0 || options.hue() > 0;
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
      float gate[4];
      sample_uniforms(seed, sample, ep, kBlockGates, gate);
      p[kBrightness] = 1.0f, p[kContrast] = 1.0f, p[kSaturation] = 1.0f, p[kHue] = 0.0f;
      if (jitter && gate[0] < options.color_p()) {
        sample_uniforms(seed, sample, ep, kBlockColor, u);
        p[kBrightness] = jitter_factor(options.brightness(), u[0]);
        p[kContrast] = jitter_factor(options.contrast(), u[1]);
        p[kSaturation] = jitter_factor(options.saturation(), u[2]);
        p[kHue] = options.hue() == 0 ? 0.0f : static_cast<float>(options.hue() * (2.0 * u[3] - 1.0));
      }
      p[kGray] = gate[1] < options.grayscale() ? 1.0f : 0.0f;
      std::array<float, 4> erase = {0, 0, 0, 0};
      if (gate[2] < options.erase()) erase = erase_box(options, seed, sample, ep, oh, ow);
      p[kEraseX0] = erase[0], p[kEraseY0] = erase[1], p[kEraseW] = erase[2], p[kEraseH] = erase[3];
    }
  });
  return params;
}

namespace detail {

ApplySetup setup_apply(const torch::Tensor& images, const torch::Tensor& params, c10::IntArrayRef size,
                       c10::ArrayRef<double> mean, c10::ArrayRef<double> stdv, double contrast_center,
                       double erase_value, c10::ScalarType dtype, bool channels_last,
                       const torch::Tensor& out) {
  const AugmentOptions o = AugmentOptions()
                               .size(size.vec())
                               .mean(std::vector<double>(mean.begin(), mean.end()))
                               .std(std::vector<double>(stdv.begin(), stdv.end()))
                               .dtype(dtype);
  const Geometry g = check_inputs(images, o);
  check_params(params, g.n);
  EMBER_CHECK(contrast_center >= 0 && contrast_center <= 1,
              "[augment] contrast_center must be in [0, 1], got {}", contrast_center);
  EMBER_CHECK(std::isfinite(erase_value), "[augment] erase_value must be finite, got {}", erase_value);
  EMBER_CHECK(g.n <= INT32_MAX && g.h * g.w * g.c <= INT32_MAX && g.oh * g.ow * g.c <= INT32_MAX &&
                  g.oh <= 65535 * 32,
              "[augment] the images are too large for 32-bit pixel indices; split or shrink them");
  const std::vector<int64_t> shape =
      channels_last ? std::vector<int64_t>{g.n, g.oh, g.ow, g.c} : std::vector<int64_t>{g.n, g.c, g.oh, g.ow};
  const BatchGeometry bg = batch_geometry(g, o.mean(), o.std(), contrast_center, erase_value);
  if (!out.defined()) return {bg, torch::empty(shape, images.options().dtype(dtype))};
  EMBER_CHECK(out.sizes() == c10::IntArrayRef(shape) && out.scalar_type() == dtype &&
                  out.device() == images.device() && out.is_contiguous(),
              "[augment] the output tensor must be a contiguous {} [{}] on {}, got {} [{}] on {}{}",
              c10::toString(dtype), fmt::join(shape, ", "), images.device().str(),
              c10::toString(out.scalar_type()), fmt::join(out.sizes(), ", "), out.device().str(),
              out.is_contiguous() ? "" : " (not contiguous)");
  return {bg, out};
}

void apply_cpu(const torch::Tensor& images, const torch::Tensor& params, const ApplySetup& setup,
               bool channels_last) {
  const BatchGeometry& bg = setup.geometry;
  const torch::Tensor& out = setup.out;
  const torch::Tensor src = images.contiguous();
  const torch::Tensor par = params.to(torch::kCPU).contiguous();
  const uint8_t* sp = src.data_ptr<uint8_t>();
  const float* pp = par.data_ptr<float>();
  switch (out.scalar_type()) {
    case torch::kFloat32:
      apply_cpu_typed(sp, pp, bg, channels_last, out.data_ptr<float>());
      break;
    case torch::kFloat16:
      apply_cpu_typed(sp, pp, bg, channels_last, out.data_ptr<c10::Half>());
      break;
    default:
      apply_cpu_typed(sp, pp, bg, channels_last, out.data_ptr<c10::BFloat16>());
      break;
  }
}

// The CPU implementation of ember::augment_apply (the reference).
torch::Tensor augment_apply_cpu(const torch::Tensor& images, const torch::Tensor& params,
                                c10::IntArrayRef size, c10::ArrayRef<double> mean, c10::ArrayRef<double> stdv,
                                double contrast_center, double erase_value, c10::ScalarType dtype,
                                bool channels_last) {
  ApplySetup setup =
      setup_apply(images, params, size, mean, stdv, contrast_center, erase_value, dtype, channels_last);
  apply_cpu(images, params, setup, channels_last);
  return setup.out;
}

}  // namespace detail

void apply_into(const torch::Tensor& images, const torch::Tensor& params, const AugmentOptions& options,
                const torch::Tensor& out) {
  EMBER_CHECK(images.is_cpu(), "[augment::apply_into] the images must be on the CPU, got {} (use apply)",
              images.device().str());
  EMBER_CHECK(!out.requires_grad(),
              "[augment::apply_into] the output tensor requires grad; give a plain tensor");
  const Geometry g = check_inputs(images, options);
  const std::vector<int64_t> size = {g.oh, g.ow};
  const bool nhwc = options.layout() == Layout::kNHWC;
  const detail::ApplySetup setup =
      detail::setup_apply(images, params, size, options.mean(), options.std(), options.contrast_center(),
                          options.erase_value(), options.dtype(), nhwc, out);
  detail::apply_cpu(images, params, setup, nhwc);
  out.unsafeGetTensorImpl()->bump_version();  // written in place: autograd's saved copies see it
}

torch::Tensor apply(const torch::Tensor& images, const torch::Tensor& params, const AugmentOptions& options) {
  const Geometry g = check_inputs(images, options);  // for the output size; the op checks the rest
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("ember::augment_apply", "")
          .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&, c10::IntArrayRef,
                               c10::ArrayRef<double>, c10::ArrayRef<double>, double, double, c10::ScalarType,
                               bool)>();
  const std::vector<int64_t> size = {g.oh, g.ow};
  return op.call(images, params, size, options.mean(), options.std(), options.contrast_center(),
                 options.erase_value(), options.dtype(), options.layout() == Layout::kNHWC);
}

std::vector<int64_t> output_shape(const torch::Tensor& images, const AugmentOptions& options) {
  const Geometry g = check_inputs(images, options);
  return options.layout() == Layout::kNHWC ? std::vector<int64_t>{g.n, g.oh, g.ow, g.c}
                                           : std::vector<int64_t>{g.n, g.c, g.oh, g.ow};
}

AugmentResult augment(const torch::Tensor& images, const torch::Tensor& sample_indices,
                      const AugmentOptions& options, uint64_t seed, int64_t epoch, const torch::Tensor& out) {
  const Geometry g = check_inputs(images, options);
  EMBER_CHECK(sample_indices.dim() == 1 && sample_indices.size(0) == g.n,
              "[augment] sample_indices must be [N] with N = {} images, got [{}]", g.n,
              fmt::join(sample_indices.sizes(), ", "));
  torch::Tensor params = sample_params(options, sample_indices, g.h, g.w, seed, epoch);
  if (out.defined()) {
    apply_into(images, params, options, out);
    return {out, params};
  }
  // On a GPU the params go over before the op (no host sync), so it does not
  // re-check the values sample_params just drew.
  return {apply(images, ember::detail::to_device_async(params, images.device()), options), params};
}

}  // namespace ember::augment

// ---- dispatcher operators ---------------------------------------------------

namespace {

torch::Tensor sample_params_op(const torch::Tensor& sample_indices, int64_t height, int64_t width,
                               c10::IntArrayRef size, c10::string_view crop, int64_t padding,
                               c10::ArrayRef<double> scale, c10::ArrayRef<double> ratio, double hflip,
                               double vflip, c10::ArrayRef<double> color, double color_p, double grayscale,
                               double erase, c10::ArrayRef<double> erase_scale,
                               c10::ArrayRef<double> erase_ratio, int64_t seed, int64_t epoch) {
  using namespace ember::augment;
  AugmentOptions o;
  o.size(size.vec()).padding(padding).scale(scale.vec()).ratio(ratio.vec()).hflip(hflip).vflip(vflip);
  o.crop(parse_crop_mode(std::string(crop), "ember::augment_sample_params crop"));
  EMBER_CHECK(color.size() == 4,
              "[ember::augment_sample_params] color must be [brightness, contrast, saturation, hue]");
  o.brightness(color[0]).contrast(color[1]).saturation(color[2]).hue(color[3]).color_p(color_p).grayscale(
      grayscale);
  o.erase(erase).erase_scale(erase_scale.vec()).erase_ratio(erase_ratio.vec());
  return sample_params(o, sample_indices, height, width, static_cast<uint64_t>(seed), epoch);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def(
      "augment_apply(Tensor images, Tensor params, int[] size, float[] mean, float[] std, float "
      "contrast_center, "
      "float erase_value, ScalarType dtype, bool channels_last) -> Tensor");
  m.def(
      "augment_sample_params(Tensor sample_indices, int height, int width, int[] size, str crop, int "
      "padding, "
      "float[] scale, float[] ratio, float hflip, float vflip, float[] color, float color_p, float "
      "grayscale, "
      "float erase, float[] erase_scale, float[] erase_ratio, int seed, int epoch) -> Tensor");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) {
  m.impl("augment_apply", &ember::augment::detail::augment_apply_cpu);
}

TORCH_LIBRARY_IMPL(ember, CompositeExplicitAutograd, m) {
  m.impl("augment_sample_params", &sample_params_op);
}
