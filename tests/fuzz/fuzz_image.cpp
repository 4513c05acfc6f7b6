// Image folders (data::load_image_folder): format sniffing, the size read
// from the header before decoding (bounded by max_pixels; other content is
// refused), truncation checks and the decoders. The first byte picks the file's extension, the
// resize mode and what to do with a bad file; the rest is the file.
#include "data/image_folder_internal.h"
#include "ember/core/file.h"
#include "ember/data/image_folder.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using namespace ember::data;
  const uint8_t pick = data[0];
  const auto* p = data + 1;
  const size_t n = size - 1;
  // The header readers alone, on every input.
  const std::string format = ember::data::detail::content_format(p, n);
  int64_t width = 0, height = 0;
  const bool sized = ember::data::detail::image_size_of(p, n, &width, &height).empty();
  if (sized) EMBER_FUZZ_ASSERT(format == "JPEG" || format == "PNG" || format == "BMP");
  (void)ember::data::detail::truncation_of(p, n);
  constexpr int64_t kMaxPixels = int64_t{1}
                                 << 16;  // 64 Ki pixels: fast enough to fuzz; the bound is what is tested
  return ember::fuzz::run([&] {
    static const char* const kExtensions[] = {".png", ".jpg", ".bmp", ".jpeg"};
    const std::string root = ember::fuzz::scratch_dir() + "/images";
    for (const char* ext : kExtensions) ember::core::remove_file(root + "/a/x" + ext);  // the last input's
    ember::fuzz::write_scratch(std::string("images/a/x") + kExtensions[pick & 3],
                               ember::fuzz::bytes_of(p, n));
    ImageFolderOptions options({6, 6});
    options.resize((pick & 4) ? ResizeMode::kStretch : ResizeMode::kShorterSideCenterCrop);
    options.on_error((pick & 8) ? OnError::kSkip : OnError::kFail);
    options.threads(1);
    options.max_pixels(kMaxPixels);
    const ImageFolder folder = load_image_folder(root, options);
    EMBER_FUZZ_ASSERT(folder.data.size() == 1);
    // Only content whose size was read, and within the bound, reached a decoder.
    EMBER_FUZZ_ASSERT(sized && width >= 1 && height >= 1 && width * height <= kMaxPixels);
    EMBER_FUZZ_ASSERT((folder.data.inputs.sizes() == std::vector<int64_t>{1, 6, 6, 3}));
  });
}
