// CIFAR binary batches (data::read_cifar_bin). The first byte picks the
// variant and label kind; the rest is the file.
#include "ember/data/cifar.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using namespace ember::data;
  return ember::fuzz::run([&] {
    CifarOptions options;
    options.variant((data[0] & 1) ? CifarVariant::kCifar100 : CifarVariant::kCifar10);
    options.label((data[0] & 2) ? CifarLabel::kCoarse : CifarLabel::kFine);
    const std::string path =
        ember::fuzz::write_scratch("data_batch.bin", ember::fuzz::bytes_of(data + 1, size - 1));
    const TensorDataset ds = read_cifar_bin(path, options);
    const int64_t classes = options.variant() == CifarVariant::kCifar10 ? 10
                            : options.label() == CifarLabel::kCoarse    ? 20
                                                                        : 100;
    // Accepted: whole records, labels in range.
    EMBER_FUZZ_ASSERT(ds.size() >= 1);
    EMBER_FUZZ_ASSERT(ds.targets.min().item<int64_t>() >= 0 && ds.targets.max().item<int64_t>() < classes);
  });
}
