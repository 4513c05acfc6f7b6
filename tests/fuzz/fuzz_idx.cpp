// IDX files (data::read_idx), plain or gzip-compressed: the header's type and
// shape, the data's length, the gzip stream.
#include "ember/data/idx.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ember::fuzz::run([&] {
    const std::string path = ember::fuzz::write_scratch("input.idx", ember::fuzz::bytes_of(data, size));
    const torch::Tensor t = ember::data::read_idx(path);  // the default ceiling, as users get it
    // Accepted: the header's shape, and every byte of the file accounted for.
    EMBER_FUZZ_ASSERT(t.dim() >= 1 && t.is_contiguous());
    EMBER_FUZZ_ASSERT(t.numel() * static_cast<int64_t>(t.element_size()) <= int64_t{1032} * int64_t(size));
  });
}
