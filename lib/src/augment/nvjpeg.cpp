// augment::NvjpegDecoder: JPEG decoding on a CUDA GPU with nvJPEG (loaded
// with dlopen), and the sample's crop resized there. Compiled with the real
// decoder when EMBER_WITH_NVJPEG (CUDA and nvjpeg.h found at configure time).
#include "ember/augment/nvjpeg.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include <cstdlib>

#include "core/check.h"

#if EMBER_WITH_NVJPEG
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nvjpeg.h>
#endif

namespace ember::augment {

#if EMBER_WITH_NVJPEG
namespace {

/// The nvJPEG functions Ember calls, from libnvjpeg.so.13 (or $EMBER_NVJPEG).
struct Api {
  decltype(&nvjpegCreateSimple) create_simple = nullptr;
  decltype(&nvjpegDestroy) destroy = nullptr;
  decltype(&nvjpegJpegStateCreate) state_create = nullptr;
  decltype(&nvjpegJpegStateDestroy) state_destroy = nullptr;
  decltype(&nvjpegGetImageInfo) image_info = nullptr;
  decltype(&nvjpegDecode) decode = nullptr;
  std::string error;  // why it could not be loaded; empty when it was
};

const Api& api() {
  static const Api loaded = [] {
    Api a;
    const char* env = std::getenv("EMBER_NVJPEG");
    std::string name = env != nullptr && *env != '\0' ? env : "libnvjpeg.so.13";
    void* lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    Dl_info torch_lib{};
    if (lib == nullptr && env == nullptr &&
        ::dladdr(reinterpret_cast<void*>(&c10::cuda::device_count), &torch_lib) != 0 && torch_lib.dli_fname) {
      // The nvidia-nvjpeg wheel's, beside the torch wheel's CUDA libraries: site-packages/nvidia/cu13/lib.
      const std::string torch_dir = torch_lib.dli_fname;
      const std::string beside =
          torch_dir.substr(0, torch_dir.rfind('/')) + "/../../nvidia/cu13/lib/libnvjpeg.so.13";
      if ((lib = ::dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) name = beside;
    }
    if (lib == nullptr) {
      const char* why = ::dlerror();
      a.error = fmt::format(
          "cannot load {} ({}): install CUDA 13's nvJPEG (the nvidia-nvjpeg wheel, or the CUDA toolkit's), "
          "or "
          "set EMBER_NVJPEG to the library's path",
          name, why != nullptr ? why : "not found");
      return a;
    }
    const auto symbol = [&](auto& fn, const char* symbol_name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, symbol_name));
      if (fn == nullptr && a.error.empty()) a.error = fmt::format("{} has no {}", name, symbol_name);
    };
    symbol(a.create_simple, "nvjpegCreateSimple");
    symbol(a.destroy, "nvjpegDestroy");
    symbol(a.state_create, "nvjpegJpegStateCreate");
    symbol(a.state_destroy, "nvjpegJpegStateDestroy");
    symbol(a.image_info, "nvjpegGetImageInfo");
    symbol(a.decode, "nvjpegDecode");
    return a;
  }();
  return loaded;
}

const char* status_name(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_NOT_INITIALIZED:
      return "not initialised";
    case NVJPEG_STATUS_INVALID_PARAMETER:
      return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG:
      return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
      return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE:
      return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED:
      return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH:
      return "architecture mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR:
      return "internal error";
    default:
      return "another status";
  }
}

void check(nvjpegStatus_t status, const char* what) {
  if (status != NVJPEG_STATUS_SUCCESS)
    ember::detail::fail(ErrorKind::kData, "[augment::NvjpegDecoder] {}: nvJPEG status {} ({})", what,
                        static_cast<int>(status), status_name(status));
}

}  // namespace

struct NvjpegDecoder::State {
  explicit State(c10::cuda::CUDAStream s) : stream(s) {}
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t jpeg = nullptr;
  c10::cuda::CUDAStream stream;  // this decoder's own
};
#else
struct NvjpegDecoder::State {};
#endif

bool nvjpeg_available(torch::Device device, std::string* why) {
  const auto no = [&](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
#if !EMBER_WITH_NVJPEG
  (void)device;
  return no(
      "Ember was built without nvJPEG (it needs CUDA and nvJPEG's header, the nvidia-nvjpeg wheel's, "
      "when it is configured)");
#else
  if (!device.is_cuda()) return no(fmt::format("nvJPEG decodes on a CUDA device, not on {}", device.str()));
  if (!torch::cuda::is_available()) return no("no CUDA device is visible here");
  if (!api().error.empty()) return no(api().error);
  return true;
#endif
}

NvjpegDecoder::NvjpegDecoder(torch::Device device) : device_(device) {
  std::string why;
  EMBER_CHECK_KIND(kConfig, nvjpeg_available(device, &why), "[augment::NvjpegDecoder] {}", why);
#if EMBER_WITH_NVJPEG
  if (!device_.has_index()) device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(0));
  const c10::cuda::CUDAGuard guard(device_);
  state_ = std::make_unique<State>(c10::cuda::getStreamFromPool(false, device_.index()));
  check(api().create_simple(&state_->handle), "creating a handle");
  check(api().state_create(state_->handle, &state_->jpeg), "creating a decoding state");
#endif
}

NvjpegDecoder::~NvjpegDecoder() {
#if EMBER_WITH_NVJPEG
  if (state_) {
    if (state_->jpeg != nullptr) api().state_destroy(state_->jpeg);
    if (state_->handle != nullptr) api().destroy(state_->handle);
  }
#endif
}

torch::Tensor NvjpegDecoder::decode(std::string_view jpeg) {
#if EMBER_WITH_NVJPEG
  torch::Tensor out = decode_async(jpeg);
  state_->stream.synchronize();
  return out;
#else
  (void)jpeg;
  ember::detail::fail(ErrorKind::kConfig, "[augment::NvjpegDecoder] built without nvJPEG");
#endif
}

torch::Tensor NvjpegDecoder::decode_async(std::string_view jpeg) {
#if EMBER_WITH_NVJPEG
  const c10::cuda::CUDAGuard guard(device_);
  const auto* data = reinterpret_cast<const unsigned char*>(jpeg.data());
  int components = 0;
  nvjpegChromaSubsampling_t subsampling{};
  int widths[NVJPEG_MAX_COMPONENT] = {}, heights[NVJPEG_MAX_COMPONENT] = {};
  check(api().image_info(state_->handle, data, jpeg.size(), &components, &subsampling, widths, heights),
        "reading the JPEG's header");
  EMBER_CHECK_KIND(kData, widths[0] > 0 && heights[0] > 0, "[augment::NvjpegDecoder] a JPEG of {}x{} pixels",
                   widths[0], heights[0]);
  // Allocated on this decoder's stream (the caching allocator's stream of record), decoded there.
  const c10::cuda::CUDAStreamGuard on(state_->stream);
  torch::Tensor out = torch::empty({heights[0], widths[0], 3}, torch::dtype(torch::kUInt8).device(device_));
  nvjpegImage_t image{};
  image.channel[0] = out.data_ptr<uint8_t>();
  image.pitch[0] = static_cast<size_t>(widths[0]) * 3;
  check(api().decode(state_->handle, state_->jpeg, data, jpeg.size(), NVJPEG_OUTPUT_RGBI, &image,
                     state_->stream.stream()),
        "decoding");
  return out;
#else
  (void)jpeg;
  ember::detail::fail(ErrorKind::kConfig, "[augment::NvjpegDecoder] built without nvJPEG");
#endif
}

torch::Tensor NvjpegDecoder::decode_image(std::string_view jpeg, const AugmentOptions& options, uint64_t seed,
                                          int64_t sample, int64_t epoch,
                                          const DecodeOptions& decode_options) {
#if EMBER_WITH_NVJPEG
  const DecodePlan plan = decode_plan(jpeg, options, seed, sample, epoch, decode_options);
  const torch::Tensor whole = decode_async(jpeg);
  const c10::cuda::CUDAGuard guard(device_);
  const c10::cuda::CUDAStreamGuard on(state_->stream);
  namespace F = torch::nn::functional;
  const torch::Tensor crop = whole.narrow(0, plan.box.top, plan.box.height)
                                 .narrow(1, plan.box.left, plan.box.width)
                                 .permute({2, 0, 1})
                                 .unsqueeze(0)
                                 .to(torch::kFloat);
  torch::Tensor y = F::interpolate(crop, F::InterpolateFuncOptions()
                                             .size(options.size())
                                             .mode(torch::kBilinear)
                                             .align_corners(false)
                                             .antialias(true));
  y = y.round_().clamp_(0, 255).to(torch::kUInt8).squeeze(0).permute({1, 2, 0});
  if (plan.hflip) y = y.flip({1});
  if (plan.vflip) y = y.flip({0});
  y = y.contiguous();
  state_->stream.synchronize();
  // The loader stacks samples on the device's default stream: the memory must not be reused on this
  // decoder's stream before that stack has read it.
  y.record_stream(c10::cuda::getDefaultCUDAStream(device_.index()).unwrap());
  return y;
#else
  (void)jpeg, (void)options, (void)seed, (void)sample, (void)epoch, (void)decode_options;
  ember::detail::fail(ErrorKind::kConfig, "[augment::NvjpegDecoder] built without nvJPEG");
#endif
}

}  // namespace ember::augment
