// The image-folder config keys (data.size, data.threads, data.on_error, data.cache_dir).
#include <fmt/format.h>

#include <cmath>

#include "core/check.h"
#include "ember/core/enum_names.h"
#include "ember/data/image_folder.h"

namespace ember::data {

void declare_image_folder_keys(core::Config& c, const ImageFolderOptions& d) {
  c.declare("data.size", std::vector<double>(d.size().begin(), d.size().end()),
            "[H, W] images are decoded and stored at (shorter side + centre crop)",
            core::Bounds::between(1, 1 << 14));
  c.declare("data.threads", d.threads(), "decoding threads (0 = all cores)", core::Bounds::between(0, 1024),
            core::OnResume::kMayChange);
  c.declare("data.on_error", d.on_error() == OnError::kSkip ? "skip" : "fail",
            "an unreadable image: fail (name it) or skip (list it and go on)");
  c.declare("data.cache_dir", "", "folder for the decoded-dataset cache files (\"\" = no cache)",
            core::OnResume::kMayChange);
  c.declare("data.max_pixels", d.max_pixels(), "images declaring more pixels are refused before decoding",
            core::Bounds::between(1, int64_t{1} << 32));
  c.add_check([](const core::Config& config) { image_folder_options_from_config(config, "train"); });
}

ImageFolderOptions image_folder_options_from_config(const core::Config& c, const std::string& split) {
  const auto size = c.get_float_list("data.size");
  EMBER_CHECK_KIND(kConfig,
                   size.size() == 2 && size[0] >= 1 && size[1] >= 1 && size[0] == std::floor(size[0]) &&
                       size[1] == std::floor(size[1]),
                   "[image_folder] data.size must be [H, W] in whole pixels, got {} values", size.size());
  constexpr core::EnumNames<OnError, 2> kOnErrorNames{"data.on_error",
                                                      {{{OnError::kFail, "fail"}, {OnError::kSkip, "skip"}}}};
  auto o = ImageFolderOptions({static_cast<int64_t>(size[0]), static_cast<int64_t>(size[1])})
               .threads(c.get_int("data.threads"))
               .on_error(kOnErrorNames.parse(c.get_string("data.on_error"), "image_folder"))
               .max_pixels(c.get_int("data.max_pixels"));
  const std::string cache_dir = c.get_string("data.cache_dir");
  if (!cache_dir.empty())
    o.cache(fmt::format("{}/{}-{}x{}.cache", cache_dir, split, o.size()[0], o.size()[1]));
  return o;
}

}  // namespace ember::data
