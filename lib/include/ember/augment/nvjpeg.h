#pragma once
// JPEG decoding on a CUDA GPU with nvJPEG, for streamed shards
// (data.stream.nvjpeg): each decoder thread of the loader owns a decoder; a
// JPEG's entropy (Huffman) decoding runs on that CPU thread and its inverse
// DCT and colour conversion on the GPU (nvJPEG's hybrid backend), on a CUDA
// stream of the thread's own; the sample's crop and flips (decode_plan's) are
// then cut from the whole image and resized on the GPU.
//
// libnvjpeg.so.13 is loaded when the first decoder is made (dlopen): the one
// the library path finds (the CUDA toolkit's, the nvidia-nvjpeg wheel's in
// the project's venv, the device pack's), or $EMBER_NVJPEG naming the file.
// Ember compiles this only when built with CUDA and nvJPEG's header (the
// nvidia-nvjpeg wheel's, in the venv); elsewhere the decoder refuses to be
// made, saying why.
//
// Not yet run on a GPU (no GPU has been lent to this project's sessions):
// the device check's data rows judge it.

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ember/augment/decode.h"

namespace ember::augment {

/// Whether nvJPEG decoding can run on `device`: Ember built with it,
/// libnvjpeg.so.13 loadable, a CUDA device. Otherwise `why` (when given) says
/// what is missing.
bool nvjpeg_available(torch::Device device, std::string* why = nullptr);

/// One thread's nvJPEG decoder. Not thread-safe: make one per thread.
class NvjpegDecoder {
 public:
  /// Throws Error(kConfig) when nvjpeg_available(device) is false.
  explicit NvjpegDecoder(torch::Device device);
  ~NvjpegDecoder();
  NvjpegDecoder(const NvjpegDecoder&) = delete;
  NvjpegDecoder& operator=(const NvjpegDecoder&) = delete;

  /// The whole image: uint8 [H, W, 3] RGB on the device, complete (the
  /// decoder's stream synchronised). A JPEG nvJPEG refuses is an Error (kData).
  torch::Tensor decode(std::string_view jpeg);

  /// decode_image on the GPU: the crop box and flips decode_plan gives for
  /// (seed, sample, epoch), cut from decode(jpeg) and resized to
  /// options.size() with antialiased bilinear (in float, rounded to uint8;
  /// the CPU path resizes in uint8: not bitwise alike):
  /// uint8 [H, W, 3] on the device. `decode.max_pixels` applies before decoding.
  torch::Tensor decode_image(std::string_view jpeg, const AugmentOptions& options, uint64_t seed,
                             int64_t sample, int64_t epoch, const DecodeOptions& decode = {});

  torch::Device device() const { return device_; }

 private:
  // decode() without the synchronisation: the image is complete once this decoder's stream has run.
  torch::Tensor decode_async(std::string_view jpeg);
  struct State;
  torch::Device device_;
  std::unique_ptr<State> state_;
};

}  // namespace ember::augment
