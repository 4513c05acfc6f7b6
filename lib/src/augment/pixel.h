#pragma once
// The per-pixel augmentation code shared by the CPU reference
// (augment.cpp) and the CUDA kernel (cuda/augment_kernel.cu): one source
// for both, so they agree bit for bit. Both translation units are compiled
// without floating-point contraction (-ffp-contract=off, nvcc --fmad=false)
// and the only transcendental functions (the hue rotation's sine and cosine)
// are polynomials here, so every operation is a correctly rounded IEEE
// float operation on both sides.
//
// No LibTorch types: nvcc compiles this without LibTorch headers.

#include <cstdint>

#include "ember/augment/param.h"
#include "ember/core/host_device.h"

namespace ember::augment::detail {

constexpr int kMaxChannels = 3;

/// What is the same for every sample of a batch.
struct BatchGeometry {
  int n, h, w, c;  // input: uint8 [n, h, w, c], c = 1 or 3
  int oh, ow;      // output size
  float mean[kMaxChannels];
  float inv_std[kMaxChannels];  // 1 / std (1 without normalisation; mean 0)
  float contrast_center;
  float erase_value;
};

/// One sample's parameters in the form the pixel loop uses.
struct SamplePlan {
  int x0, y0, bw, bh;  // crop box in source pixels
  float sx, sy;        // box / output size per axis (interpolate's scale)
  bool hflip, vflip;
  bool exact;              // box size == output size: each output pixel copies one source pixel
  bool color;              // apply m and clamp to [0, 1]
  float m[12];             // v' = M v + t: m[4 r + k] (k < 3) = M[r][k], m[4 r + 3] = t[r]
  int ex0, ey0, ex1, ey1;  // erase rectangle [ex0, ex1) x [ey0, ey1) of output pixels
};

/// Bilinear tap along one axis, as interpolate(align_corners=False) samples
/// a box of `box` pixels starting at `start` into `out_size` outputs.
struct Tap {
  int i0, i1;  // source indices (may be outside the image: reads as 0)
  float frac;  // weight of i1
};

// The functions have internal linkage: every translation unit (the CPU
// reference, the kernel, white-box tests) compiles its own copy with its own
// flags, and none can be interposed by another library's copy.
namespace {

/// Params hold whole numbers; round to be safe. NaN and values beyond +-2^24
/// (rejected by the op's checks) map to 0 the same way on the CPU and GPU.
EMBER_HOST_DEVICE int to_int(float v) {
  if (!(v > -16777216.0f && v < 16777216.0f)) return 0;
  const float r = v + (v >= 0.0f ? 0.5f : -0.5f);
  return static_cast<int>(r);
}

/// sin and cos of 2 pi t for |t| <= 0.5: Taylor polynomials at a quarter of
/// the angle (|q| <= pi / 4, truncation error < 2e-9), then two doublings.
EMBER_HOST_DEVICE void sincos_turns(float t, float* s_out, float* c_out) {
  const float q = t * 1.57079632679f;  // (2 pi t) / 4
  const float q2 = q * q;
  // Horner forms of the Taylor series, with reciprocals (multiplications only).
  float s =
      q *
      (1.0f - q2 * (1.0f / 6.0f) *
                  (1.0f - q2 * (1.0f / 20.0f) * (1.0f - q2 * (1.0f / 42.0f) * (1.0f - q2 * (1.0f / 72.0f)))));
  float c = 1.0f - q2 * 0.5f *
                       (1.0f - q2 * (1.0f / 12.0f) *
                                   (1.0f - q2 * (1.0f / 30.0f) *
                                               (1.0f - q2 * (1.0f / 56.0f) * (1.0f - q2 * (1.0f / 90.0f)))));
  for (int i = 0; i < 2; ++i) {
    const float s2 = 2.0f * s * c;
    const float c2 = c * c - s * s;
    s = s2;
    c = c2;
  }
  *s_out = s;
  *c_out = c;
}

/// m <- A m (the affine maps compose: first m, then A). A is 3x4 like m.
EMBER_HOST_DEVICE void compose(const float a[12], float m[12]) {
  float r[12];
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < 4; ++k) {
      float acc = k == 3 ? a[4 * i + 3] : 0.0f;
      for (int j = 0; j < 3; ++j) acc = acc + a[4 * i + j] * m[4 * j + k];
      r[4 * i + k] = acc;
    }
  }
  for (int i = 0; i < 12; ++i) m[i] = r[i];
}

/// Luma weights of gray(v) (torchvision's rgb_to_grayscale).
constexpr float kGrayR = 0.299f, kGrayG = 0.587f, kGrayB = 0.114f;

/// The colour matrix of one sample: brightness, contrast, saturation, hue,
/// grayscale, in that order (see ember/augment/augment.h for the formulas).
/// Channels c == 1: brightness and contrast only.
EMBER_HOST_DEVICE void color_matrix(const float* p, int channels, float center, float m[12]) {
  for (int i = 0; i < 12; ++i) m[i] = (i % 5 == 0) ? 1.0f : 0.0f;  // identity (0, 5, 10)
  const float b = p[kBrightness], c = p[kContrast], s = p[kSaturation], h = p[kHue];
  const bool gray = p[kGray] > 0.5f && channels == 3;
  float a[12];
  if (b != 1.0f) {
    for (int i = 0; i < 12; ++i) a[i] = (i % 5 == 0) ? b : 0.0f;
    compose(a, m);
  }
  if (c != 1.0f) {
    const float t = (1.0f - c) * center;
    for (int i = 0; i < 12; ++i) a[i] = (i % 5 == 0) ? c : 0.0f;
    a[3] = t, a[7] = t, a[11] = t;
    compose(a, m);
  }
  if (channels != 3) return;
  const float w[3] = {kGrayR, kGrayG, kGrayB};
  if (s != 1.0f) {  // s I + (1 - s) 1 w^T
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) a[4 * i + j] = (i == j ? s : 0.0f) + (1.0f - s) * w[j];
      a[4 * i + 3] = 0.0f;
    }
    compose(a, m);
  }
  if (h != 0.0f) {
    // Rotation by -2 pi h about the gray axis in YIQ space: T^-1 diag(1, R) T
    // = 1 w^T + cos (I - 1 w^T) - sin S, with S = T^-1[:, 1:] [[0, -1], [1, 0]] T[1:, :]
    // for the NTSC YIQ matrix T (rows I = 0.596 -0.274 -0.322, Q = 0.211 -0.523 0.312).
    // The minus sign makes h > 0 turn as torchvision's adjust_hue does (red
    // toward yellow, as H grows in HSV); a positive YIQ angle turns the other way.
    constexpr float kS[9] = {1.686217949e-01f,  3.298047453e-01f,  -4.984265402e-01f,
                             -3.279633942e-01f, 3.461068792e-02f,  2.933527062e-01f,
                             1.246461366e+00f,  -1.043228883e+00f, -2.032324828e-01f};
    float sn, cs;
    sincos_turns(h, &sn, &cs);
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j)
        a[4 * i + j] = w[j] + cs * ((i == j ? 1.0f : 0.0f) - w[j]) - sn * kS[3 * i + j];
      a[4 * i + 3] = 0.0f;
    }
    compose(a, m);
  }
  if (gray) {
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) a[4 * i + j] = w[j];
      a[4 * i + 3] = 0.0f;
    }
    compose(a, m);
  }
}

/// Builds the plan of the sample whose parameter row is `p`.
EMBER_HOST_DEVICE SamplePlan make_plan(const float* p, const BatchGeometry& g) {
  SamplePlan s;
  s.x0 = to_int(p[kX0]);
  s.y0 = to_int(p[kY0]);
  s.bw = to_int(p[kW]);
  s.bh = to_int(p[kH]);
  if (s.bw < 1) s.bw = 1;
  if (s.bh < 1) s.bh = 1;
  s.hflip = p[kHFlip] > 0.5f;
  s.vflip = p[kVFlip] > 0.5f;
  s.exact = s.bw == g.ow && s.bh == g.oh;
  s.sx = static_cast<float>(s.bw) / static_cast<float>(g.ow);
  s.sy = static_cast<float>(s.bh) / static_cast<float>(g.oh);
  const bool gray = p[kGray] > 0.5f && g.c == 3;
  s.color = p[kBrightness] != 1.0f || p[kContrast] != 1.0f ||
            (g.c == 3 && (p[kSaturation] != 1.0f || p[kHue] != 0.0f)) || gray;
  if (s.color) {
    color_matrix(p, g.c, g.contrast_center, s.m);
  } else {
    for (int i = 0; i < 12; ++i) s.m[i] = 0.0f;
  }
  s.ex0 = to_int(p[kEraseX0]);
  s.ey0 = to_int(p[kEraseY0]);
  const int ew = to_int(p[kEraseW]), eh = to_int(p[kEraseH]);
  s.ex1 = ew > 0 && eh > 0 ? s.ex0 + ew : s.ex0;  // empty when no erase
  s.ey1 = s.ey0 + (eh > 0 ? eh : 0);
  return s;
}

/// `scale` = box / out_size, computed once per sample as interpolate computes it.
EMBER_HOST_DEVICE Tap make_tap(int out_index, float scale, int start, int box) {
  float b = (static_cast<float>(out_index) + 0.5f) * scale - 0.5f;
  if (b < 0.0f) b = 0.0f;
  int b0 = static_cast<int>(b);
  if (b0 > box - 1) b0 = box - 1;
  const int b1 = b0 + 1 < box ? b0 + 1 : box - 1;
  return {start + b0, start + b1, b - static_cast<float>(b0)};
}

EMBER_HOST_DEVICE float texel(const uint8_t* img, const BatchGeometry& g, int y, int x, int ch) {
  return (y >= 0 && y < g.h && x >= 0 && x < g.w) ? static_cast<float>(img[(y * g.w + x) * g.c + ch]) : 0.0f;
}

/// The output values (fp32, all channels) of output pixel (oy, ox) of one
/// sample. `img` points at the sample's uint8 [h, w, c] image.
EMBER_HOST_DEVICE void augment_pixel(const uint8_t* img, const BatchGeometry& g, const SamplePlan& s, int oy,
                                     int ox, float out[kMaxChannels]) {
  if (ox >= s.ex0 && ox < s.ex1 && oy >= s.ey0 && oy < s.ey1) {
    for (int ch = 0; ch < g.c; ++ch) out[ch] = g.erase_value;
    return;
  }
  const int sy = s.vflip ? g.oh - 1 - oy : oy;
  const int sx = s.hflip ? g.ow - 1 - ox : ox;
  float v[kMaxChannels];
  if (s.exact) {  // equal to the bilinear formula with zero fractions
    for (int ch = 0; ch < g.c; ++ch) v[ch] = texel(img, g, s.y0 + sy, s.x0 + sx, ch) * (1.0f / 255.0f);
  } else {
    const Tap ty = make_tap(sy, s.sy, s.y0, s.bh);
    const Tap tx = make_tap(sx, s.sx, s.x0, s.bw);
    for (int ch = 0; ch < g.c; ++ch) {
      const float top =
          (1.0f - tx.frac) * texel(img, g, ty.i0, tx.i0, ch) + tx.frac * texel(img, g, ty.i0, tx.i1, ch);
      const float bot =
          (1.0f - tx.frac) * texel(img, g, ty.i1, tx.i0, ch) + tx.frac * texel(img, g, ty.i1, tx.i1, ch);
      v[ch] = ((1.0f - ty.frac) * top + ty.frac * bot) * (1.0f / 255.0f);
    }
  }
  if (s.color) {
    float r[kMaxChannels];
    if (g.c == 3) {
      for (int i = 0; i < 3; ++i)
        r[i] = s.m[4 * i] * v[0] + s.m[4 * i + 1] * v[1] + s.m[4 * i + 2] * v[2] + s.m[4 * i + 3];
    } else {
      r[0] = s.m[0] * v[0] + s.m[3];
    }
    for (int ch = 0; ch < g.c; ++ch) v[ch] = r[ch] < 0.0f ? 0.0f : (r[ch] > 1.0f ? 1.0f : r[ch]);
  }
  for (int ch = 0; ch < g.c; ++ch) out[ch] = (v[ch] - g.mean[ch]) * g.inv_std[ch];
}

}  // namespace

}  // namespace ember::augment::detail
