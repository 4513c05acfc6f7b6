// data::load_image_folder's scan: the options check and the walk that finds classes and images
// in torchvision ImageFolder's order.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "core/check.h"
#include "data/image_folder_internal.h"

namespace ember::data::detail {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// ".jpg"-style lower-case extensions.
std::vector<std::string> normalised_extensions(const std::vector<std::string>& extensions) {
  std::vector<std::string> out;
  for (const std::string& e : extensions) {
    if (e.empty()) continue;
    out.push_back(lower(e.front() == '.' ? e : "." + e));
  }
  return out;
}

}  // namespace

void check_options(const ImageFolderOptions& o) {
  const auto& s = o.size();
  EMBER_CHECK(s.size() == 2 && s[0] > 0 && s[1] > 0 && s[0] <= INT_MAX && s[1] <= INT_MAX,
              "{} size must be {{H, W}} with both > 0, got {{{}}}", kWhere, fmt::join(s, ", "));
  EMBER_CHECK(o.threads() >= 0, "{} threads must be >= 0 (0 = one per hardware thread), got {}", kWhere,
              o.threads());
  EMBER_CHECK(!normalised_extensions(o.extensions()).empty(),
              "{} extensions is empty: no file would count as an image (default: .jpg .jpeg .png .bmp)",
              kWhere);
}

Scan scan_folder(const std::string& root, const ImageFolderOptions& o) {
  std::error_code ec;
  EMBER_CHECK(
      fs::exists(root, ec),
      "{} {}: no such folder; pass the folder holding one sub-folder per class (root/<class>/<image>)",
      kWhere, root);
  EMBER_CHECK(fs::is_directory(root, ec),
              "{} {}: not a folder; pass the folder holding one sub-folder per class", kWhere, root);
  const std::vector<std::string> extensions = normalised_extensions(o.extensions());
  Scan scan;
  try {
    for (const auto& entry : fs::directory_iterator(root))
      if (entry.is_directory()) scan.classes.push_back(entry.path().filename().string());
    std::sort(scan.classes.begin(), scan.classes.end());
    EMBER_CHECK(!scan.classes.empty(),
                "{} {}: no class folders; expected root/<class>/<image>, one sub-folder per class "
                "(torchvision's ImageFolder layout)",
                kWhere, root);
    const fs::path base(root);
    for (size_t label = 0; label < scan.classes.size(); ++label) {
      const fs::path dir = base / scan.classes[label];
      std::vector<std::pair<std::string, std::string>> found;  // (folder inside root, file name)
      const auto walk_options =
          fs::directory_options::follow_directory_symlink | fs::directory_options::skip_permission_denied;
      for (auto it = fs::recursive_directory_iterator(dir, walk_options);
           it != fs::recursive_directory_iterator(); ++it) {
        if (!it->is_regular_file(ec)) continue;
        const fs::path& p = it->path();
        if (std::find(extensions.begin(), extensions.end(), lower(p.extension().string())) ==
            extensions.end())
          continue;
        found.emplace_back(p.parent_path().lexically_relative(base).generic_string(), p.filename().string());
      }
      EMBER_CHECK(
          !found.empty(),
          "{} {}: class folder '{}' has no images (extensions {}, searched recursively); add images or "
          "remove the folder",
          kWhere, dir.string(), scan.classes[label], fmt::join(extensions, " "));
      std::sort(found.begin(), found.end());
      for (const auto& [folder, name] : found) {
        const fs::path path = base / folder / name;
        const auto mtime = fs::last_write_time(path);
        scan.entries.push_back(
            {folder + "/" + name, static_cast<int64_t>(label), static_cast<int64_t>(fs::file_size(path)),
             std::chrono::duration_cast<std::chrono::nanoseconds>(mtime.time_since_epoch()).count()});
      }
    }
  } catch (const fs::filesystem_error& e) {
    ember::detail::fail("{} {}: cannot list the folder: {}", kWhere, root, e.what());
  }
  return scan;
}

}  // namespace ember::data::detail
