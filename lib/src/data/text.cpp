// Text corpora as bytes, and byte windows for language models.
#include "ember/data/text.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/check.h"

namespace ember::data {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> corpus_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const fs::path& p = entry.path();
    if (entry.is_symlink() || !entry.is_regular_file()) continue;
    if (p.has_extension() || p.filename().string().rfind('.', 0) == 0) continue;
    files.push_back(p);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

torch::Tensor read_text_corpus(const std::string& path, int64_t max_bytes) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  EMBER_CHECK_KIND(kData, !ec && fs::exists(status),
                   "[data::read_text_corpus] data.path={}: no such file or folder; install Debian's fortunes "
                   "package (apt install fortunes) or pass data.path=<a text file or a folder of text files>",
                   path);
  std::vector<fs::path> files;
  if (fs::is_directory(status)) {
    files = corpus_files(path);
    EMBER_CHECK_KIND(
        kData, !files.empty(),
        "[data::read_text_corpus] data.path={}: the folder has no regular files without an extension "
        "(the corpus rule: *.dat, *.u8, other extensions and symlinks are skipped); pass a text file "
        "instead",
        path);
  } else {
    // A FIFO or a device (/dev/zero, /dev/stdin) may never end.
    EMBER_CHECK_KIND(kData, fs::is_regular_file(status),
                     "[data::read_text_corpus] data.path={} is not a regular file nor a folder", path);
    files.push_back(path);
  }
  // Sizes first, so that an oversized corpus fails before it is read; the
  // reads are bounded too (a file may grow meanwhile).
  uintmax_t total = 0;
  for (const auto& f : files) {
    const uintmax_t n = fs::file_size(f, ec);
    if (!ec) total += n;
  }
  const auto too_big = [&](uintmax_t n) {
    ember::detail::fail(
        ErrorKind::kData,
        "[data::read_text_corpus] data.path={} holds {} bytes, more than the limit of {} bytes "
        "(read_text_corpus's max_bytes)",
        path, n, max_bytes);
  };
  if (total > static_cast<uintmax_t>(max_bytes)) too_big(total);
  std::string text;
  text.reserve(static_cast<size_t>(total));
  std::vector<char> chunk(1 << 20);
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    EMBER_CHECK_KIND(kData, in.good(), "[data::read_text_corpus] cannot read {} (permissions?)", f.string());
    while (in) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      text.append(chunk.data(), static_cast<size_t>(in.gcount()));
      if (text.size() > static_cast<size_t>(max_bytes)) too_big(text.size());
    }
  }
  return torch::from_blob(text.data(), {static_cast<int64_t>(text.size())}, torch::kUInt8).clone();
}

TensorDataset text_windows(const torch::Tensor& bytes, int64_t offset, int64_t block, int64_t stride) {
  EMBER_CHECK(
      bytes.dim() == 1 && bytes.scalar_type() == torch::kUInt8 && block >= 1 && stride >= 1 &&
          bytes.size(0) >= block + 1,
      "[data::text_windows] need uint8 [n] bytes with n >= block + 1, block >= 1, stride >= 1; got {} "
      "bytes, block {}, stride {}",
      bytes.numel(), block, stride);
  const torch::Tensor w = bytes.unfold(0, block + 1, stride);
  return {w, torch::arange(w.size(0), torch::kLong).mul_(stride).add_(offset)};
}

}  // namespace ember::data
