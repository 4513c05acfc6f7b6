#include "ember/data/cifar.h"

#include <torch/torch.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "core/check.h"
#include "ember/core/enum_names.h"

namespace ember::data {
namespace {

constexpr int64_t kSide = 32;
constexpr int64_t kImageBytes = 3 * kSide * kSide;

struct Format {
  int64_t label_bytes;  // 1 (CIFAR-10) or 2 (CIFAR-100: coarse, fine)
  int64_t classes;      // of the chosen label
  const char* name;
};

Format format_of(const CifarOptions& o) {
  if (o.variant() == CifarVariant::kCifar10) return {1, 10, "CIFAR-10"};
  return {2, o.label() == CifarLabel::kFine ? 100 : 20, "CIFAR-100"};
}

bool is_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return f.good();
}

std::vector<std::string> split_files(const CifarOptions& o, Split split) {
  if (o.variant() == CifarVariant::kCifar100) return {split == Split::kTrain ? "train.bin" : "test.bin"};
  if (split == Split::kTest) return {"test_batch.bin"};
  std::vector<std::string> files;
  for (int i = 1; i <= 5; ++i) files.push_back("data_batch_" + std::to_string(i) + ".bin");
  return files;
}

}  // namespace

namespace {
constexpr core::EnumNames<CifarVariant, 2> kCifarNames{
    "CIFAR variant", {{{CifarVariant::kCifar10, "cifar10"}, {CifarVariant::kCifar100, "cifar100"}}}};
}  // namespace

CifarVariant parse_cifar_variant(const std::string& name) {
  return kCifarNames.parse(name, "data::CifarVariant");
}

const char* to_string(CifarVariant variant) {
  return kCifarNames.name(variant);
}

int64_t cifar_num_classes(const CifarOptions& options) {
  return format_of(options).classes;
}

TensorDataset read_cifar_bin(const std::string& path, const CifarOptions& options) {
  const Format layout = format_of(options);
  const int64_t record = layout.label_bytes + kImageBytes;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  EMBER_CHECK(in.good(), "[data::read_cifar_bin] {}: cannot open ({})", path, std::strerror(errno));
  const auto size = static_cast<int64_t>(in.tellg());
  EMBER_CHECK(size > 0 && size % record == 0,
              "[data::read_cifar_bin] {}: {} bytes is not a whole number of {}-byte {} records; the file is "
              "truncated or in another format ({} binary version expected, not the python/matlab one)",
              path, size, record, layout.name, layout.name);
  const int64_t n = size / record;
  torch::Tensor raw = torch::empty({n, record}, torch::kUInt8);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(raw.data_ptr<uint8_t>()), static_cast<std::streamsize>(size));
  EMBER_CHECK(in.good(), "[data::read_cifar_bin] {}: read error after {} of {} bytes", path,
              static_cast<int64_t>(in.gcount()), size);

  // CIFAR-100 stores <coarse, fine>: the fine label is byte 1.
  const int64_t label_col =
      options.variant() == CifarVariant::kCifar100 && options.label() == CifarLabel::kFine ? 1 : 0;
  torch::Tensor labels = raw.select(1, label_col).to(torch::kInt64);
  const int64_t max_label = labels.max().item<int64_t>();
  if (max_label >= layout.classes) {
    const int64_t at = (labels >= layout.classes).nonzero().flatten()[0].item<int64_t>();
    ember::detail::fail(
        "[data::read_cifar_bin] {}: record {} has label {}, but {} has {} classes; is this a {} file?", path,
        at, labels[at].item<int64_t>(), layout.name, layout.classes,
        options.variant() == CifarVariant::kCifar10 ? "CIFAR-100" : "CIFAR-10");
  }
  // [N, 3, 32, 32] planes -> [N, 32, 32, 3] (one copy).
  torch::Tensor images = raw.narrow(1, layout.label_bytes, kImageBytes)
                             .view({n, 3, kSide, kSide})
                             .permute({0, 2, 3, 1})
                             .contiguous();
  return {images, labels};
}

TensorDataset load_cifar(const std::string& root, Split split, const CifarOptions& options) {
  const std::vector<std::string> names = split_files(options, split);
  const char* sub = options.variant() == CifarVariant::kCifar10 ? "cifar-10-batches-bin" : "cifar-100-binary";
  std::string dir = root;
  if (!is_file(dir + "/" + names.front()) && is_file(dir + "/" + sub + "/" + names.front()))
    dir += std::string("/") + sub;
  std::vector<std::string> missing;
  for (const auto& name : names)
    if (!is_file(dir + "/" + name)) missing.push_back(name);
  EMBER_CHECK(
      missing.empty(),
      "[data::load_cifar] {}: missing {} (looked in {} and {}/{}); set data.root to the folder of the "
      "{} binary version (data/README.md says how to obtain it)",
      root, fmt::join(missing, ", "), root, root, sub, format_of(options).name);
  std::vector<torch::Tensor> images, labels;
  for (const auto& name : names) {
    TensorDataset part = read_cifar_bin(dir + "/" + name, options);
    images.push_back(part.inputs);
    labels.push_back(part.targets);
  }
  if (images.size() == 1) return {images.front(), labels.front()};
  return {torch::cat(images), torch::cat(labels)};
}

void write_cifar_bin(const std::string& path, const TensorDataset& dataset, const CifarOptions& options) {
  const Format layout = format_of(options);
  const torch::Tensor& images = dataset.inputs;
  EMBER_CHECK(images.defined() && images.dim() == 4 && images.size(1) == kSide && images.size(2) == kSide &&
                  images.size(3) == 3 && images.scalar_type() == torch::kUInt8,
              "[data::write_cifar_bin] images must be uint8 [N, 32, 32, 3], got {} [{}]",
              images.defined() ? c10::toString(images.scalar_type()) : "undefined",
              images.defined() ? fmt::format("{}", fmt::join(images.sizes(), ", ")) : "");
  const int64_t n = images.size(0);
  torch::Tensor labels = dataset.targets.to(torch::kInt64).cpu();
  EMBER_CHECK(labels.dim() == 1 && labels.size(0) == n, "[data::write_cifar_bin] targets must be [{}]", n);
  const int64_t classes = options.variant() == CifarVariant::kCifar10 ? 10 : 100;
  EMBER_CHECK(n == 0 || (labels.min().item<int64_t>() >= 0 && labels.max().item<int64_t>() < classes),
              "[data::write_cifar_bin] targets must be in [0, {})", classes);
  torch::Tensor raw = torch::empty({n, layout.label_bytes + kImageBytes}, torch::kUInt8);
  if (options.variant() == CifarVariant::kCifar10) {
    raw.select(1, 0).copy_(labels);
  } else {
    raw.select(1, 0).copy_(labels.div(5, "floor"));
    raw.select(1, 1).copy_(labels);
  }
  raw.narrow(1, layout.label_bytes, kImageBytes)
      .view({n, 3, kSide, kSide})
      .copy_(images.cpu().permute({0, 3, 1, 2}));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  EMBER_CHECK(out.good(), "[data::write_cifar_bin] {}: cannot create ({})", path, std::strerror(errno));
  out.write(reinterpret_cast<const char*>(raw.data_ptr<uint8_t>()),
            static_cast<std::streamsize>(raw.numel()));
  EMBER_CHECK(out.good(), "[data::write_cifar_bin] {}: write failed (disk full?)", path);
}

}  // namespace ember::data
