// Batch augmentation throughput: ember::augment::augment against the same
// pipeline composed from LibTorch ops and against a per-image OpenCV loop,
// side by side in one run. Prints a markdown table (images/s, Ember / peer).
//
//   ember_bench_augment [--pipelines 32,224] [--batch N] [--threads 1,2] [--device cpu|cuda]
//                       [--seconds S] [--repeats R] [--json FILE]
//
// Pipelines (every peer does the same work: all of them draw the per-sample
// parameters with ember::augment::sample_params, then apply them):
//   32px   CIFAR-like uint8 [N, 32, 32, 3] -> random crop 32 with padding 4,
//          hflip 0.5, normalise -> float32 [N, 3, 32, 32]. Batch 256 (CPU), 4096 (GPU).
//   224px  uint8 [N, 256, 256, 3] -> random resized crop 224 (scale 0.08-1,
//          ratio 3/4-4/3, bilinear), hflip 0.5, colour jitter brightness,
//          contrast, saturation 0.4, normalise -> float32 [N, 3, 224, 224]
//          (and bfloat16, Ember only). Batch 64 (CPU), 256 (GPU).
// Peers:
//   Ember         augment() on CPU tensors: the reference, at::parallel_for over output rows.
//   LibTorch ops  the batch as float NCHW, one affine_grid per sample from the drawn box and
//                 flip (clamped to the box, as interpolate of the crop clamps at its edges),
//                 grid_sample (bilinear, zeros, align_corners=False), then brightness x
//                 contrast, saturation (lerp with gray), clamp and normalise as broadcast ops.
//   OpenCV loop   per image, at::parallel_for over images (cv::setNumThreads(0): no second
//                 pool): ROI + copyMakeBorder, resize INTER_LINEAR, flip, transform (3x4
//                 colour matrix from the drawn factors; uint8, saturating = the clamp), split,
//                 then convertTo(1 / (255 std), -mean / std) straight into the output planes.
// Each cell: one warm-up call, then R repeats (default 5) of k calls, k such
// that a repeat lasts >= S / R seconds (default S = 1); median of the repeats.
// The peers' repeats are interleaved, so drift in the machine's load hits all
// of them alike.
// At start-up each peer's output is compared with Ember's (max abs difference
// on normalised values, printed above the table).
//
// --device cuda (Ember built with CUDA): per pipeline, (i) the fused kernel's
// achieved bandwidth, minimum bytes per image / kernel time (CUDA events
// around back-to-back apply() calls on device-resident params), against the
// device-to-device copy bandwidth of a >= 1 GiB uint8 tensor (2 x bytes / time),
// goal >= 0.7. So that both measure DRAM, not the L2 cache: the timed apply()
// calls rotate through K sets of distinct images, params and outputs (all held
// alive), K such that one rotation's bytes exceed 4 x L2, and every timed region
// is queued behind 1 GiB copies. Minimum bytes per image = output bytes + the
// input bytes the kernel must read at least once (see min_read_bytes); (ii) the host time of one augment()
// call (sample on the host, pin, async copy, launch; no synchronisation), mean of 200 calls, goal < 50 us;
// (iii) augment() against the LibTorch-ops pipeline on the GPU, per batch,
// synchronised: the speed-up.
#include <ember/ember.h>

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#if EMBER_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#endif

#if EMBER_WITH_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {
namespace aug = ember::augment;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSeed = 0;
constexpr int64_t kEpochs = 8;  // timed calls cycle through epochs 0..7 (different boxes, same for all peers)

struct Args {
  std::vector<int64_t> pipelines = {32, 224};
  int64_t batch = 0;             // 0: the pipeline's default for the device
  std::vector<int64_t> threads;  // empty: 1 and all of at::get_num_threads()
  std::string device = "cpu";
  double seconds = 1.0;  // per cell, all repeats together
  int64_t repeats = 5;
  std::string json;
};

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::stoll(item));
  return v;
}

double elapsed_s(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// ---- pipelines ----------------------------------------------------------------

struct Pipeline {
  std::string name;
  int64_t height = 0, width = 0;          // input images, 3 channels
  int64_t cpu_batch = 0, cuda_batch = 0;  // default batch sizes
  bool color = false;                     // brightness/contrast/saturation jitter
  aug::AugmentOptions options;            // float32 NCHW output
  std::string description;
};

Pipeline make_pipeline(int64_t which) {
  Pipeline p;
  if (which == 32) {
    p.name = "32px", p.height = 32, p.width = 32, p.cpu_batch = 256, p.cuda_batch = 4096;
    p.options = aug::AugmentOptions()
                    .size({32, 32})
                    .crop(aug::CropMode::kPad)
                    .padding(4)
                    .hflip(0.5)
                    .mean({0.4914, 0.4822, 0.4465})
                    .std({0.2470, 0.2435, 0.2616});
    p.description = "uint8 32x32x3 -> crop 32 pad 4, hflip 0.5, normalise -> NCHW 32x32";
  } else if (which == 224) {
    p.name = "224px", p.height = 256, p.width = 256, p.cpu_batch = 64, p.cuda_batch = 256, p.color = true;
    p.options = aug::AugmentOptions()
                    .size({224, 224})
                    .crop(aug::CropMode::kRandomResized)
                    .scale({0.08, 1.0})
                    .ratio({3.0 / 4.0, 4.0 / 3.0})
                    .hflip(0.5)
                    .brightness(0.4)
                    .contrast(0.4)
                    .saturation(0.4)
                    .mean({0.485, 0.456, 0.406})
                    .std({0.229, 0.224, 0.225});
    p.description =
        "uint8 256x256x3 -> random resized crop 224 (scale 0.08-1, ratio 3/4-4/3, bilinear), hflip 0.5, "
        "brightness/contrast/saturation 0.4, normalise -> NCHW 224x224";
  } else {
    throw ember::Error(
        fmt::format("[bench augment] --pipelines: unknown pipeline {} (choose from 32, 224)", which));
  }
  return p;
}

aug::AugmentOptions with_dtype(aug::AugmentOptions o, c10::ScalarType dtype) {
  return o.dtype(dtype);
}

const char* dtype_name(c10::ScalarType t) {
  return t == torch::kBFloat16 ? "bf16" : "fp32";
}

// ---- peer: LibTorch ops -------------------------------------------------------

/// How the LibTorch peer samples at the crop box's edges.
enum class BoxEdge {
  kClamp,  ///< clamp the grid to the box: interpolate of the cropped image (Ember's semantics)
  kOpen    ///< plain grid_sample: blends in the pixels just outside the box when upscaling
};

/// The pipeline from LibTorch ops, batched, for one pipeline on one device
/// (the normalisation constants are made once, on that device).
class LibTorchOps {
 public:
  LibTorchOps(const Pipeline& p, torch::Device device, BoxEdge edge) : p_(p), edge_(edge) {
    const auto fopts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    const torch::Tensor mean = torch::tensor(p.options.mean(), fopts).view({1, -1, 1, 1});
    const torch::Tensor inv_std = 1.0 / torch::tensor(p.options.std(), fopts).view({1, -1, 1, 1});
    // out = v * scale + shift = (v - mean) / std, v in [0, 1]; without colour v is pixel / 255 here.
    scale_ = p.color ? inv_std : inv_std / 255.0;
    shift_ = -mean * inv_std;
  }
  /// `images`: uint8 [N, H, W, 3]; `params`: float32 [N, kNumParams]
  /// (sample_params) on the images' device. Returns float32 [N, 3, OH, OW].
  torch::Tensor operator()(const torch::Tensor& images, const torch::Tensor& params) const;

 private:
  Pipeline p_;
  BoxEdge edge_;
  torch::Tensor scale_, shift_;  // [1, 3, 1, 1]
};

torch::Tensor LibTorchOps::operator()(const torch::Tensor& images, const torch::Tensor& params) const {
  namespace F = torch::nn::functional;
  const Pipeline& p = p_;
  const int64_t n = images.size(0), h = images.size(1), w = images.size(2), c = images.size(3);
  const int64_t oh = p.options.size()[0], ow = p.options.size()[1];
  const auto fopts = images.options().dtype(torch::kFloat32);
  torch::Tensor x = torch::empty({n, c, h, w}, fopts);
  x.copy_(images.permute({0, 3, 1, 2}));  // uint8 NHWC -> float NCHW, 0..255, one pass

  // Per-sample affine map from output to input, in grid_sample's normalised
  // coordinates (align_corners=False: pixel q <-> (2 q + 1) / W - 1). Output
  // pixel ox samples x0 + (ox + 0.5) w / OW - 0.5, mirrored in the box when flipped.
  const auto col = [&](int64_t k) { return params.select(1, k); };
  const torch::Tensor x0 = col(aug::kX0), y0 = col(aug::kY0), bw = col(aug::kW), bh = col(aug::kH);
  const double fw = static_cast<double>(w), fh = static_cast<double>(h);
  torch::Tensor theta = torch::zeros({n, 2, 3}, fopts);
  theta.select(1, 0).select(1, 0).copy_((1 - 2 * col(aug::kHFlip)) * bw / fw);
  theta.select(1, 0).select(1, 2).copy_((2 * x0 + bw) / fw - 1);
  theta.select(1, 1).select(1, 1).copy_(bh / fh);
  theta.select(1, 1).select(1, 2).copy_((2 * y0 + bh) / fh - 1);
  torch::Tensor grid = F::affine_grid(theta, {n, c, oh, ow}, /*align_corners=*/false);  // [N, OH, OW, 2]
  if (edge_ == BoxEdge::kClamp) {
    // The box spans pixels [x0, x0 + w - 1]: interpolate's edge clamp.
    grid.select(3, 0).clamp_(((2 * x0 + 1) / fw - 1).view({n, 1, 1}),
                             ((2 * (x0 + bw) - 1) / fw - 1).view({n, 1, 1}));
    grid.select(3, 1).clamp_(((2 * y0 + 1) / fh - 1).view({n, 1, 1}),
                             ((2 * (y0 + bh) - 1) / fh - 1).view({n, 1, 1}));
  }
  torch::Tensor v = F::grid_sample(
      x, grid,
      F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kZeros).align_corners(false));

  if (!p.color) return torch::addcmul(shift_, v, scale_);  // (pixel / 255 - mean) / std
  const auto factor = [&](int64_t k) { return col(k).view({n, 1, 1, 1}); };
  const torch::Tensor b = factor(aug::kBrightness), ct = factor(aug::kContrast), s = factor(aug::kSaturation);
  // brightness b v, then contrast c v + (1 - c) 0.5, with v = pixel / 255: one pass.
  v = torch::addcmul(0.5 * (1 - ct), v, b * ct / 255.0);
  // saturation s v + (1 - s) gray(v), gray = 0.299 r + 0.587 g + 0.114 b.
  torch::Tensor gray = v.select(1, 0) * 0.299f;
  gray.add_(v.select(1, 1), 0.587f).add_(v.select(1, 2), 0.114f);
  v = torch::lerp(gray.unsqueeze(1), v, s);
  v.clamp_(0, 1);
  return torch::addcmul(shift_, v, scale_);
}

// ---- peer: OpenCV loop --------------------------------------------------------

#if EMBER_WITH_OPENCV
/// The 3x4 matrix on 0..255 pixels of brightness b, contrast c (centre 0.5)
/// and saturation s, in Ember's order: v' = b c S v + 127.5 (1 - c), with
/// S = s I + (1 - s) 1 w^T (S maps a gray constant to itself: w sums to 1).
cv::Matx34f color_matrix(const float* q) {
  const float b = q[aug::kBrightness], c = q[aug::kContrast], s = q[aug::kSaturation];
  const float wt[3] = {0.299f, 0.587f, 0.114f};
  cv::Matx34f m;
  for (int r = 0; r < 3; ++r) {
    for (int k = 0; k < 3; ++k) m(r, k) = b * c * ((r == k ? s : 0.0f) + (1.0f - s) * wt[k]);
    m(r, 3) = 127.5f * (1.0f - c);
  }
  return m;
}

/// The pipeline as a per-image OpenCV loop. `images`: uint8 [N, H, W, 3] on
/// the CPU; `params` as for LibTorchOps, on the CPU. Returns float32 [N, 3, OH, OW].
torch::Tensor opencv_loop(const torch::Tensor& images, const torch::Tensor& params, const Pipeline& p) {
  const int64_t n = images.size(0);
  const int h = static_cast<int>(images.size(1)), w = static_cast<int>(images.size(2));
  const int oh = static_cast<int>(p.options.size()[0]), ow = static_cast<int>(p.options.size()[1]);
  torch::Tensor out = torch::empty({n, 3, oh, ow}, torch::kFloat32);
  const uint8_t* src = images.data_ptr<uint8_t>();
  const float* pp = params.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  double alpha[3], beta[3];  // v = pixel / 255 -> (v - mean) / std
  for (int ch = 0; ch < 3; ++ch) {
    alpha[ch] = 1.0 / (255.0 * p.options.std()[ch]);
    beta[ch] = -p.options.mean()[ch] / p.options.std()[ch];
  }
  const int64_t image_bytes = static_cast<int64_t>(h) * w * 3, plane = static_cast<int64_t>(oh) * ow;
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    thread_local cv::Mat box, resized, flipped, colored, planes[3];  // reused across calls
    for (int64_t i = begin; i < end; ++i) {
      const float* q = pp + i * aug::kNumParams;
      const int x0 = static_cast<int>(std::lround(q[aug::kX0])),
                y0 = static_cast<int>(std::lround(q[aug::kY0]));
      const int bw = static_cast<int>(std::lround(q[aug::kW])),
                bh = static_cast<int>(std::lround(q[aug::kH]));
      const cv::Mat img(h, w, CV_8UC3, const_cast<uint8_t*>(src + i * image_bytes));
      // The box, zero outside the image: a view when inside, else the inside part padded.
      const int ix0 = std::max(x0, 0), iy0 = std::max(y0, 0);
      const int ix1 = std::min(x0 + bw, w), iy1 = std::min(y0 + bh, h);
      cv::Mat cur;
      if (ix0 == x0 && iy0 == y0 && ix1 == x0 + bw && iy1 == y0 + bh) {
        cur = img(cv::Rect(x0, y0, bw, bh));
      } else if (ix1 <= ix0 || iy1 <= iy0) {
        box.create(bh, bw, CV_8UC3);
        box.setTo(cv::Scalar::all(0));
        cur = box;
      } else {
        cv::copyMakeBorder(img(cv::Rect(ix0, iy0, ix1 - ix0, iy1 - iy0)), box, iy0 - y0, y0 + bh - iy1,
                           ix0 - x0, x0 + bw - ix1, cv::BORDER_CONSTANT, cv::Scalar::all(0));
        cur = box;
      }
      if (bw != ow || bh != oh) {
        cv::resize(cur, resized, cv::Size(ow, oh), 0, 0, cv::INTER_LINEAR);
        cur = resized;
      }
      if (q[aug::kHFlip] > 0.5f) {
        cv::flip(cur, flipped, 1);
        cur = flipped;
      }
      if (p.color) {
        cv::transform(cur, colored, color_matrix(q));  // uint8 out: rounds and clamps to [0, 255]
        cur = colored;
      }
      cv::split(cur, planes);
      for (int ch = 0; ch < 3; ++ch) {
        cv::Mat target(oh, ow, CV_32F, dst + (i * 3 + ch) * plane);  // convertTo writes in place
        planes[ch].convertTo(target, CV_32F, alpha[ch], beta[ch]);
      }
    }
  });
  return out;
}
#endif

// ---- timing -------------------------------------------------------------------

/// Median seconds per call of each of `fs`, measured interleaved (repeat r of
/// every callable, then repeat r + 1, ...) so that drift in the machine's load
/// hits all peers alike. Per callable: one warm-up call, calibration calls
/// (until >= seconds / (4 repeats)), then `repeats` repeats of k calls, k such
/// that a repeat lasts >= seconds / repeats. `sync` runs before and after each
/// timed region (a GPU synchronise, or nothing).
std::vector<double> seconds_per_call(const std::vector<std::function<void()>>& fs, const Args& a,
                                     const std::function<void()>& sync) {
  const double target = a.seconds / static_cast<double>(a.repeats);
  std::vector<int64_t> k(fs.size());
  for (size_t j = 0; j < fs.size(); ++j) {
    fs[j]();
    sync();
    const auto t0 = Clock::now();
    int64_t calls = 0;
    do {
      fs[j]();
      sync();
      ++calls;
    } while (elapsed_s(t0) < target / 4);
    const double once = elapsed_s(t0) / static_cast<double>(calls);
    k[j] = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(target / once)));
  }
  std::vector<std::vector<double>> per_call(fs.size());
  for (int64_t r = 0; r < a.repeats; ++r) {
    for (size_t j = 0; j < fs.size(); ++j) {
      sync();
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < k[j]; ++i) fs[j]();
      sync();
      per_call[j].push_back(elapsed_s(t0) / static_cast<double>(k[j]));
    }
  }
  std::vector<double> medians;
  for (const auto& v : per_call) medians.push_back(median(v));
  return medians;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kCPU, torch::kFloat64) - b.to(torch::kCPU, torch::kFloat64)).abs().max().item<double>();
}

std::string rate(std::optional<double> v) {
  if (!v) return "–";
  return fmt::format("{:.0f}", *v);
}

std::string ratio(std::optional<double> num, std::optional<double> den) {
  if (!num || !den || *den <= 0) return "–";
  return fmt::format("{:.2f}x", *num / *den);
}

std::string json_number(std::optional<double> v) {
  return v ? fmt::format("{:.6g}", *v) : "null";
}

void write_json(const std::string& path, const std::string& body) {
  if (path.empty()) return;
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw ember::Error(fmt::format("[bench augment] --json {}: cannot open for writing", path));
  std::fputs(body.c_str(), f);
  std::fclose(f);
  std::fprintf(stderr, "[bench augment] wrote %s\n", path.c_str());
}

// ---- CPU ----------------------------------------------------------------------

struct CpuRow {
  std::string pipeline, output;
  int64_t threads = 0, batch = 0;
  std::optional<double> ember, libtorch, opencv;  // images/s
};

int run_cpu(const Args& a) {
  const int all_threads = at::get_num_threads();
  std::vector<int64_t> threads = a.threads;
  if (threads.empty())
    threads = all_threads > 1 ? std::vector<int64_t>{1, all_threads} : std::vector<int64_t>{1};
#if EMBER_WITH_OPENCV
  cv::setNumThreads(0);  // OpenCV runs sequentially inside each at::parallel_for chunk
  const std::string opencv_version = CV_VERSION;
#else
  const std::string opencv_version = "not built (Ember configured without OpenCV)";
#endif
  std::vector<std::string> notes;
  std::vector<CpuRow> rows;
  std::string json_diffs;
  for (int64_t which : a.pipelines) {
    const Pipeline p = make_pipeline(which);
    const int64_t n = a.batch > 0 ? a.batch : p.cpu_batch;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
    const torch::Tensor images = torch::randint(0, 256, {n, p.height, p.width, 3}, gen, torch::kUInt8);
    const torch::Tensor indices = torch::arange(n, torch::kInt64);

    // Same parameters, same pipeline: how far apart are the peers?
    const torch::Tensor params = aug::sample_params(p.options, indices, p.height, p.width, kSeed, 0);
    const torch::Tensor ember = aug::apply(images, params, p.options);
    const LibTorchOps libtorch_ops(p, torch::kCPU, BoxEdge::kClamp);
    const double d_libtorch = max_abs_diff(libtorch_ops(images, params), ember);
    const double d_open = max_abs_diff(LibTorchOps(p, torch::kCPU, BoxEdge::kOpen)(images, params), ember);
    const double d_bf16 =
        max_abs_diff(aug::apply(images, params, with_dtype(p.options, torch::kBFloat16)), ember);
    std::string note = fmt::format(
        "- **{}**: {}, batch {}. max |peer - Ember fp32| (normalised units): LibTorch ops {:.3g} "
        "(plain grid_sample without the box clamp: {:.3g})",
        p.name, p.description, n, d_libtorch, d_open);
    json_diffs += fmt::format("{}\"{}\": {{\"libtorch\": {:.6g}, \"libtorch_no_box_clamp\": {:.6g}",
                              json_diffs.empty() ? "" : ", ", p.name, d_libtorch, d_open);
#if EMBER_WITH_OPENCV
    const double d_cv = max_abs_diff(opencv_loop(images, params, p), ember);
    note += fmt::format(", OpenCV loop {:.3g}", d_cv);
    json_diffs += fmt::format(", \"opencv\": {:.6g}", d_cv);
#endif
    note += fmt::format("; Ember bf16 vs fp32 {:.3g}", d_bf16);
    json_diffs += fmt::format(", \"ember_bf16\": {:.6g}}}", d_bf16);
    notes.push_back(note);

    for (int64_t t : threads) {
      at::set_num_threads(static_cast<int>(t));
      std::fprintf(stderr, "[bench augment] %s, %lld thread(s)...\n", p.name.c_str(),
                   static_cast<long long>(t));
      // Each callable does a whole batch, parameters included, cycling through the epochs.
      const aug::AugmentOptions bf16 = with_dtype(p.options, torch::kBFloat16);
      const auto draw = [&p, &indices](int64_t& epoch) {
        return aug::sample_params(p.options, indices, p.height, p.width, kSeed, epoch++ % kEpochs);
      };
      std::vector<std::function<void()>> peers = {
        [&, e = int64_t{0}]() mutable { aug::augment(images, indices, p.options, kSeed, e++ % kEpochs); },
        [&, e = int64_t{0}]() mutable { libtorch_ops(images, draw(e)); },
#if EMBER_WITH_OPENCV
        [&, e = int64_t{0}]() mutable { opencv_loop(images, draw(e), p); },
#endif
      };
      if (p.color)
        peers.push_back(
            [&, e = int64_t{0}]() mutable { aug::augment(images, indices, bf16, kSeed, e++ % kEpochs); });
      const std::vector<double> s = seconds_per_call(peers, a, [] {});
      const auto ips = [&](size_t j) { return static_cast<double>(n) / s[j]; };
      rows.push_back({p.name, "fp32", t, n, ips(0), ips(1), std::nullopt});
#if EMBER_WITH_OPENCV
      rows.back().opencv = ips(2);
#endif
      if (p.color) rows.push_back({p.name, "bf16", t, n, ips(peers.size() - 1), std::nullopt, std::nullopt});
    }
  }
  at::set_num_threads(all_threads);

  std::printf("## Batch augmentation on the CPU: Ember vs LibTorch ops vs OpenCV loop\n\n");
  std::printf(
      "%s; LibTorch %s (at::set_num_threads per row), OpenCV %s (cv::setNumThreads(0), parallel over "
      "images with at::parallel_for). Images/s: median of %lld repeats, >= %.2g s per cell; every peer "
      "draws its parameters with sample_params inside the timed call.\n\n",
      ember::core::describe_device(torch::kCPU).c_str(), TORCH_VERSION, opencv_version.c_str(),
      static_cast<long long>(a.repeats), a.seconds);
  for (const auto& note : notes) std::printf("%s\n", note.c_str());
  std::printf(
      "\n| pipeline | output | threads | Ember (img/s) | LibTorch ops (img/s) | OpenCV loop (img/s) | "
      "Ember / LibTorch | Ember / OpenCV |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
  std::string json_rows;
  for (const CpuRow& r : rows) {
    std::printf("| %s | %s | %lld | %s | %s | %s | %s | %s |\n", r.pipeline.c_str(), r.output.c_str(),
                static_cast<long long>(r.threads), rate(r.ember).c_str(), rate(r.libtorch).c_str(),
                rate(r.opencv).c_str(), ratio(r.ember, r.libtorch).c_str(), ratio(r.ember, r.opencv).c_str());
    json_rows += fmt::format(
        "{}\n    {{\"pipeline\": \"{}\", \"output\": \"{}\", \"threads\": {}, \"batch\": {}, "
        "\"ember_img_s\": {}, \"libtorch_img_s\": {}, \"opencv_img_s\": {}}}",
        json_rows.empty() ? "" : ",", r.pipeline, r.output, r.threads, r.batch, json_number(r.ember),
        json_number(r.libtorch), json_number(r.opencv));
  }
  std::printf("\nRatios > 1: Ember is faster. bf16: Ember only (the peers produce fp32).\n");
  write_json(
      a.json,
      fmt::format("{{\n  \"device\": \"cpu\",\n  \"max_abs_diff\": {{{}}},\n  \"rows\": [{}\n  ]\n}}\n",
                  json_diffs, json_rows));
  return 0;
}

// ---- CUDA ---------------------------------------------------------------------

struct GpuRow {
  std::string pipeline, output;
  int64_t batch = 0;
  int64_t sets = 0;           // distinct image/params/output sets the kernel timing rotates through
  double rotation_bytes = 0;  // bytes of one rotation (all sets: images + params + outputs)
  double read_bytes = 0, write_bytes = 0;  // minimum bytes per image: read + write
  double bytes_per_image = 0, kernel_us = 0, achieved_gbs = 0, host_us = 0;
  double ember_ips = 0, libtorch_ips = 0;
  bool launch_bound = false;  // the host queued the timed launches slower than the blocker kept the GPU busy
};

/// A CUDA event pair on the current stream.
struct EventTimer {
  c10::Stream stream;
  c10::Event start{c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT};
  c10::Event stop{c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT};
  explicit EventTimer(c10::Stream s) : stream(s) {}
  void begin() { start.record(stream); }
  double end_ms() {
    stop.record(stream);
    stop.synchronize();
    return start.elapsedTime(stop);
  }
};

/// L2 cache size in bytes of the current CUDA device; 64 MiB when it cannot be queried.
int64_t l2_cache_bytes() {
#if EMBER_WITH_CUDA_KERNELS
  const int l2 = at::cuda::getCurrentDeviceProperties()->l2CacheSize;
  if (l2 > 0) return l2;
#endif
  return int64_t{64} << 20;
}

/// Input bytes per image that the kernel must read at least once, mean over
/// the rows of `params` (float32 [N, kNumParams], CPU): channels x 1 B x the
/// pixels of the crop box that lie inside the image (the zero padding outside
/// it is never read), where along each axis at most 2 bilinear taps per output
/// column (row) are touched: min(box columns inside, 2 OW) x min(box rows
/// inside, 2 OH). For a box of the output size (random crop with padding) that
/// is the box's pixels inside the image; for a resized crop, the box's pixels
/// unless it is over 2x the output along an axis.
double min_read_bytes(const torch::Tensor& params, int64_t height, int64_t width, int64_t out_h,
                      int64_t out_w, int64_t channels) {
  const auto col = [&](int64_t k) { return params.select(1, k).to(torch::kFloat64); };
  const torch::Tensor x0 = col(aug::kX0), y0 = col(aug::kY0), bw = col(aug::kW), bh = col(aug::kH);
  const torch::Tensor cols =
      (torch::clamp_max(x0 + bw, static_cast<double>(width)) - torch::clamp_min(x0, 0.0))
          .clamp(0.0, 2.0 * static_cast<double>(out_w));
  const torch::Tensor rows =
      (torch::clamp_max(y0 + bh, static_cast<double>(height)) - torch::clamp_min(y0, 0.0))
          .clamp(0.0, 2.0 * static_cast<double>(out_h));
  return (cols * rows).mean().item<double>() * static_cast<double>(channels);
}

int run_cuda(const Args& a) {
  if (!EMBER_WITH_CUDA_KERNELS)
    throw ember::Error(
        "[bench augment] --device cuda: Ember was built without its CUDA kernels (EMBER_CUDA=OFF or no "
        "nvcc); rebuild on a machine with the CUDA toolkit");
  const torch::Device device = ember::core::resolve_device(a.device);
  const c10::DeviceGuard device_guard(device);
  const c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
  EventTimer timer(guard.getStream(device));
  const auto sync = [] { torch::cuda::synchronize(); };
  const auto u8 = torch::TensorOptions().dtype(torch::kUInt8).device(device);
  const int64_t l2_bytes = l2_cache_bytes();  // after the device guard: the current device's

  // Device-to-device copy bandwidth: 2 x bytes / time of dst.copy_(src), 1 GiB (more if the L2 is over
  // 1/8 of that): source and destination together are >= 16 x L2, so the copy streams from and to DRAM.
  const int64_t copy_bytes = std::max(int64_t{1} << 30, ((8 * l2_bytes + (1 << 20) - 1) >> 20) << 20);
  constexpr int kCopies = 5;
  const torch::Tensor copy_src = torch::full({copy_bytes}, 7, u8), copy_dst = torch::empty({copy_bytes}, u8);
  copy_dst.copy_(copy_src);
  sync();
  std::vector<double> copy_ms;
  for (int64_t r = 0; r < a.repeats; ++r) {
    timer.begin();
    for (int i = 0; i < kCopies; ++i) copy_dst.copy_(copy_src);
    copy_ms.push_back(timer.end_ms() / kCopies);
  }
  const double copy_gbs = 2.0 * static_cast<double>(copy_bytes) / (median(copy_ms) * 1e-3) / 1e9;
  timer.begin();
  copy_dst.copy_(copy_src);
  const double blocker_ms = timer.end_ms();

  struct Case {
    int64_t which;
    c10::ScalarType dtype;
  };
  std::vector<Case> cases;
  for (int64_t which : a.pipelines) {
    if (which == 224) cases.push_back({224, torch::kBFloat16});
    cases.push_back({which, torch::kFloat32});
  }
  std::vector<GpuRow> rows;
  std::vector<std::string> notes;
  std::string json_diffs;
  constexpr int kLaunches = 20;    // apply() calls per timed kernel region
  constexpr int kBlockers = 4;     // big copies queued first: the GPU stays busy while the host launches
  constexpr int kHostCalls = 200;  // augment() calls for the host time
  constexpr int64_t kChannels = 3;
  for (const Case& cs : cases) {
    const Pipeline p = make_pipeline(cs.which);
    const aug::AugmentOptions o = with_dtype(p.options, cs.dtype);
    const int64_t n = a.batch > 0 ? a.batch : p.cuda_batch;
    std::fprintf(stderr, "[bench augment] cuda %s %s, batch %lld...\n", p.name.c_str(), dtype_name(cs.dtype),
                 static_cast<long long>(n));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
    const torch::Tensor images_cpu =
        torch::randint(0, 256, {n, p.height, p.width, kChannels}, gen, torch::kUInt8);
    const torch::Tensor images = images_cpu.to(device);
    const torch::Tensor indices = torch::arange(n, torch::kInt64);  // on the CPU: augment() reads it there
    const torch::Tensor params = aug::sample_params(o, indices, p.height, p.width, kSeed, 0);
    const torch::Tensor params_dev = params.to(device);

    GpuRow row;
    row.pipeline = p.name, row.output = dtype_name(cs.dtype), row.batch = n;
    const int64_t out_h = o.size()[0], out_w = o.size()[1], out_pixels = out_h * out_w;

    // Same results as the CPU reference and the LibTorch pipeline?
    const torch::Tensor ember_gpu = aug::apply(images, params_dev, o);
    const double d_cpu = max_abs_diff(ember_gpu, aug::apply(images_cpu, params, o));
    const LibTorchOps libtorch_ops(p, device, BoxEdge::kClamp);
    torch::Tensor lt = libtorch_ops(images, params_dev);
    if (cs.dtype != torch::kFloat32) lt = lt.to(cs.dtype);
    const double d_lt = max_abs_diff(lt, ember_gpu);
    json_diffs += fmt::format("{}\"{} {}\": {{\"ember_cuda_vs_cpu\": {:.6g}, \"libtorch_vs_ember\": {:.6g}}}",
                              json_diffs.empty() ? "" : ", ", p.name, row.output, d_cpu, d_lt);

    // (i) Kernel time: events around kLaunches back-to-back apply() calls (device-resident params),
    // queued behind kBlockers copies so that the host's launch rate does not show. The launches rotate
    // through `sets` sets of distinct images, params and outputs (set k: samples k n .. (k + 1) n - 1),
    // one rotation > 4 x L2, so that the kernel reads and writes DRAM, not data left in L2 by the
    // previous launches. The outputs of the last `sets` launches are held (a ring), so the caching
    // allocator cycles through sets + 1 output blocks instead of handing back the one just freed.
    {
      const int64_t in_bytes = n * p.height * p.width * kChannels;
      const int64_t param_bytes = n * aug::kNumParams * static_cast<int64_t>(sizeof(float));
      const int64_t out_bytes = n * kChannels * out_pixels * static_cast<int64_t>(c10::elementSize(cs.dtype));
      const int64_t set_bytes = in_bytes + param_bytes + out_bytes;
      const int64_t sets = std::max<int64_t>(2, (4 * l2_bytes + set_bytes - 1) / set_bytes);
      row.sets = sets;
      row.rotation_bytes = static_cast<double>(sets * set_bytes);
      const torch::Tensor rot_images = torch::randint(0, 256, {sets * n, p.height, p.width, kChannels}, u8);
      const torch::Tensor rot_params_cpu =
          aug::sample_params(o, torch::arange(sets * n, torch::kInt64), p.height, p.width, kSeed, 0);
      const torch::Tensor rot_params = rot_params_cpu.to(device);
      std::vector<torch::Tensor> set_images, set_params;  // views, made once: no slicing in the timed loop
      for (int64_t k = 0; k < sets; ++k) {
        set_images.push_back(rot_images.slice(0, k * n, (k + 1) * n));
        set_params.push_back(rot_params.slice(0, k * n, (k + 1) * n));
      }

      // Minimum bytes per image, from the parameters of the timed batches (all sets): read (see
      // min_read_bytes) + write (output pixels x 3 x sizeof(out)).
      row.read_bytes = min_read_bytes(rot_params_cpu, p.height, p.width, out_h, out_w, kChannels);
      row.write_bytes = static_cast<double>(kChannels * out_pixels * c10::elementSize(cs.dtype));
      row.bytes_per_image = row.read_bytes + row.write_bytes;

      std::vector<torch::Tensor> outs(static_cast<size_t>(sets));  // the ring of live outputs
      int64_t next = 0;
      const auto launch = [&] {
        const auto k = static_cast<size_t>(next++ % sets);
        outs[k] = aug::apply(set_images[k], set_params[k], o);  // the old block is freed after the launch
      };
      // Warm-up: two rotations, so that all sets + 1 output blocks are allocated before timing.
      for (int64_t i = 0; i < 2 * sets + 1; ++i) launch();
      sync();
      std::vector<double> kernel_ms;
      for (int64_t r = 0; r < a.repeats; ++r) {
        for (int i = 0; i < kBlockers; ++i) copy_dst.copy_(copy_src);  // also flushes L2
        timer.begin();
        const auto t0 = Clock::now();
        for (int i = 0; i < kLaunches; ++i) launch();
        if (elapsed_s(t0) * 1e3 > kBlockers * blocker_ms) row.launch_bound = true;
        kernel_ms.push_back(timer.end_ms() / kLaunches);
      }
      outs.clear();  // released only now: every timed launch wrote a block not written just before
      row.kernel_us = median(kernel_ms) * 1e3;
      row.achieved_gbs = row.bytes_per_image * static_cast<double>(n) / (row.kernel_us * 1e-6) / 1e9;
    }
    notes.push_back(fmt::format(
        "- **{} {}**, batch {}: max |Ember CUDA - Ember CPU| {:.3g}, max |LibTorch ops CUDA - Ember CUDA| "
        "{:.3g}; kernel timing rotates through {} sets ({:.0f} MB per rotation = {:.1f} x L2); min bytes/img "
        "{:.0f} read + {:.0f} write",
        p.name, row.output, n, d_cpu, d_lt, row.sets, row.rotation_bytes / 1e6,
        row.rotation_bytes / static_cast<double>(l2_bytes), row.read_bytes, row.write_bytes));

    // (ii) Host time of augment(): sample on the host, pin, async copy, launch; no synchronisation.
    for (int i = 0; i < 20; ++i) aug::augment(images, indices, o, kSeed, i % kEpochs);
    sync();
    const auto t0 = Clock::now();
    for (int i = 0; i < kHostCalls; ++i) aug::augment(images, indices, o, kSeed, i % kEpochs);
    row.host_us = elapsed_s(t0) / kHostCalls * 1e6;
    sync();

    // (iii) Per batch, synchronised: Ember augment() vs the LibTorch-ops pipeline on the GPU.
    int64_t epoch = 0;
    const auto ember_batch = [&] { aug::augment(images, indices, o, kSeed, epoch++ % kEpochs); };
    const auto libtorch_batch = [&] {
      const torch::Tensor q = aug::sample_params(o, indices, p.height, p.width, kSeed, epoch++ % kEpochs);
      torch::Tensor out = libtorch_ops(images, q.pin_memory().to(device, /*non_blocking=*/true));
      if (cs.dtype != torch::kFloat32) out = out.to(cs.dtype);
    };
    const std::vector<double> s = seconds_per_call({ember_batch, libtorch_batch}, a, sync);
    row.ember_ips = static_cast<double>(n) / s[0];
    row.libtorch_ips = static_cast<double>(n) / s[1];
    rows.push_back(row);
  }

  const double copy_gib = static_cast<double>(copy_bytes) / static_cast<double>(int64_t{1} << 30);
  std::printf("## Batch augmentation on the GPU: Ember's fused kernel\n\n");
  std::printf(
      "%s; LibTorch %s; L2 %.1f MB. D2D copy bandwidth (2 x %.3g GiB / time of dst.copy_(src), source + "
      "destination %.0f x L2, median of %lld): %.1f GB/s.\n\n",
      ember::core::describe_device(device).c_str(), TORCH_VERSION, static_cast<double>(l2_bytes) / 1e6,
      copy_gib, 2.0 * static_cast<double>(copy_bytes) / static_cast<double>(l2_bytes),
      static_cast<long long>(a.repeats), copy_gbs);
  for (const auto& note : notes) std::printf("%s\n", note.c_str());
  std::printf(
      "\nMinimum bytes per image = write (output pixels x 3 x sizeof(out)) + read: the input bytes the "
      "kernel "
      "must read at least once, 3 B x the crop box's pixels that lie inside the image (32px: the "
      "zero-padding "
      "border is never read, so fewer than 32 x 32 when the box overhangs), capped along each axis at 2 "
      "bilinear taps per output column/row (min(box columns, 2 OW) x min(box rows, 2 OH); binds only for "
      "boxes over 2x the output), mean over the drawn params of the timed batches; the params themselves "
      "(%lld B/img) are left out. Kernel: CUDA events around %d back-to-back apply() calls on "
      "device-resident params, rotating through sets of distinct images, params and outputs that exceed 4 x "
      "L2 per rotation, behind %d copies of %.3g GiB (L2 flushed), median of %lld. Host: wall time of one "
      "augment() call without synchronising, mean of %d. Ember / LibTorch: per batch, synchronised, "
      "parameters sampled on the host for both.\n\n",
      static_cast<long long>(aug::kNumParams * sizeof(float)), kLaunches, kBlockers, copy_gib,
      static_cast<long long>(a.repeats), kHostCalls);
  std::printf(
      "| pipeline | output | batch | min bytes/img (read + write) | kernel (us/batch) | achieved (GB/s) | "
      "achieved / copy (goal >= 0.7) | host us per augment() (goal < 50) | Ember (img/s) | LibTorch ops "
      "(img/s) | Ember / LibTorch |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::string json_rows;
  for (const GpuRow& r : rows) {
    std::printf(
        "| %s | %s | %lld | %.0f (%.0f + %.0f) | %.1f%s | %.1f | %.2f | %.1f | %.0f | %.0f | %.2fx |\n",
        r.pipeline.c_str(), r.output.c_str(), static_cast<long long>(r.batch), r.bytes_per_image,
        r.read_bytes, r.write_bytes, r.kernel_us, r.launch_bound ? " (*)" : "", r.achieved_gbs,
        r.achieved_gbs / copy_gbs, r.host_us, r.ember_ips, r.libtorch_ips, r.ember_ips / r.libtorch_ips);
    json_rows += fmt::format(
        "{}\n    {{\"pipeline\": \"{}\", \"output\": \"{}\", \"batch\": {}, \"bytes_per_image\": {:.6g}, "
        "\"read_bytes_per_image\": {:.6g}, \"write_bytes_per_image\": {:.6g}, \"rotation_sets\": {}, "
        "\"rotation_bytes\": {:.6g}, \"kernel_us\": {:.6g}, \"achieved_gbs\": {:.6g}, \"copy_gbs\": {:.6g}, "
        "\"host_us\": {:.6g}, \"ember_img_s\": {:.6g}, \"libtorch_img_s\": {:.6g}, \"launch_bound\": {}}}",
        json_rows.empty() ? "" : ",", r.pipeline, r.output, r.batch, r.bytes_per_image, r.read_bytes,
        r.write_bytes, r.sets, r.rotation_bytes, r.kernel_us, r.achieved_gbs, copy_gbs, r.host_us,
        r.ember_ips, r.libtorch_ips, r.launch_bound ? "true" : "false");
  }
  bool any_launch_bound = false;
  for (const GpuRow& r : rows) any_launch_bound = any_launch_bound || r.launch_bound;
  if (any_launch_bound)
    std::printf(
        "\n(*) the host took longer to queue the %d launches than the %d blocking copies (%.2f ms) kept the "
        "GPU busy: the kernel time may include idle gaps.\n",
        kLaunches, kBlockers, kBlockers * blocker_ms);
  write_json(a.json,
             fmt::format("{{\n  \"device\": \"cuda\",\n  \"l2_bytes\": {},\n  \"copy_bytes\": {},\n"
                         "  \"copy_gbs\": {:.6g},\n  \"max_abs_diff\": {{{}}},\n  \"rows\": [{}\n  ]\n}}\n",
                         l2_bytes, copy_bytes, copy_gbs, json_diffs, json_rows));
  return 0;
}

constexpr const char* kUsage =
    "usage: ember_bench_augment [--pipelines 32,224] [--batch N] [--threads 1,2] [--device cpu|cuda]\n"
    "                           [--seconds S] [--repeats R] [--json FILE]\n";

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "[bench augment] %s needs a value\n%s", k.c_str(), kUsage);
      return 2;
    }
    const std::string v = argv[i + 1];
    try {
      if (k == "--pipelines")
        a.pipelines = parse_list(v);
      else if (k == "--batch")
        a.batch = std::stoll(v);
      else if (k == "--threads")
        a.threads = parse_list(v);
      else if (k == "--device")
        a.device = v;
      else if (k == "--seconds")
        a.seconds = std::stod(v);
      else if (k == "--repeats")
        a.repeats = std::stoll(v);
      else if (k == "--json")
        a.json = v;
      else {
        std::fprintf(stderr, "[bench augment] unknown argument %s\n%s", k.c_str(), kUsage);
        return 2;
      }
    } catch (const std::logic_error&) {
      std::fprintf(stderr, "[bench augment] %s %s: not a number (or list of numbers)\n", k.c_str(),
                   v.c_str());
      return 2;
    }
  }
  if (a.repeats < 1 || a.seconds <= 0 || a.batch < 0 || a.pipelines.empty()) {
    std::fprintf(
        stderr, "[bench augment] --repeats, --seconds and --batch must be positive, --pipelines non-empty\n");
    return 2;
  }
  for (int64_t t : a.threads) {
    if (t < 1) {
      std::fprintf(stderr, "[bench augment] --threads: thread counts must be >= 1, got %lld\n",
                   static_cast<long long>(t));
      return 2;
    }
  }
  try {
    ember::recipe::tune_host_malloc();  // as run_recipe does for every recipe
    if (a.device == "cpu") return run_cpu(a);
    if (a.device == "cuda" || a.device.rfind("cuda:", 0) == 0) return run_cuda(a);
    std::fprintf(stderr, "[bench augment] --device must be cpu or cuda, got %s\n", a.device.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
