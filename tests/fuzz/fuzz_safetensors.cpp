// safetensors files (train::load_safetensors): the header length, the JSON
// header, dtypes, shapes and byte ranges. Accepted files must round-trip:
// written again by save_safetensors and read back, the same names, dtypes,
// shapes, bytes and metadata. The header alone (read_safetensors_header)
// accepts every file load_safetensors accepts and describes the same tensors
// (it reads no data, so it does not see BOOL bytes other than 0 and 1); and
// train::load_pretrained of the file into a small model either loads or
// refuses, never more bytes than the file holds.
#include <cstring>

#include "ember/train/pretrained.h"
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
    // The model a pretrained file would go into: a name the fuzzer can hit.
    torch::nn::Linear model(3, 2);
    bool header_ok = true;
    std::vector<TensorInfo> infos;
    try {
      infos = read_safetensors_header(path);
    } catch (const ember::Error&) {
      header_ok = false;
    }
    try {
      load_pretrained(*model, path, PretrainedOptions().strict(false));
    } catch (const ember::Error&) {
    }
    const NamedTensors tensors = load_safetensors(path, &meta);  // throws where the header did
    EMBER_FUZZ_ASSERT(header_ok && infos.size() == tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i)
      EMBER_FUZZ_ASSERT(infos[i].name == tensors[i].first &&
                        infos[i].dtype == tensors[i].second.scalar_type() &&
                        infos[i].shape == tensors[i].second.sizes().vec());
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
