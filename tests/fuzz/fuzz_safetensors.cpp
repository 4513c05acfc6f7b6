// safetensors files (train::load_safetensors): the header length, the JSON
// header, dtypes, shapes and byte ranges. Accepted files must round-trip:
// written again by save_safetensors and read back, the same names, dtypes,
// shapes, bytes and metadata.
#include <cstring>

#include "ember/train/safetensors.h"
#include "fuzz/fuzz_common.h"

namespace {
bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         (a.numel() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember::train;
  return ember::fuzz::run([&] {
    const std::string path = ember::fuzz::write_scratch("in.safetensors", ember::fuzz::bytes_of(data, size));
    std::map<std::string, std::string> meta;
    const NamedTensors tensors = load_safetensors(path, &meta);
    const std::string again_path = ember::fuzz::scratch_dir() + "/again.safetensors";
    save_safetensors(again_path, tensors, meta);
    std::map<std::string, std::string> meta2;
    const NamedTensors again = load_safetensors(again_path, &meta2);
    EMBER_FUZZ_ASSERT(meta2 == meta);
    EMBER_FUZZ_ASSERT(again.size() == tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      EMBER_FUZZ_ASSERT(again[i].first == tensors[i].first);
      EMBER_FUZZ_ASSERT(same_bytes(again[i].second, tensors[i].second));
    }
  });
}
