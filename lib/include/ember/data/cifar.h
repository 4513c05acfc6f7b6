#pragma once
// CIFAR-10 / CIFAR-100 in the "binary version" distributed by the authors
// (https://www.cs.toronto.edu/~kriz/cifar.html; see data/README.md).
//
// Record layout (no header, records back to back):
//   CIFAR-10:  <1 byte label 0..9> <3072 bytes image>            3073 bytes
//   CIFAR-100: <1 byte coarse 0..19> <1 byte fine 0..99> <3072>  3074 bytes
// The image is three 32x32 planes (red, green, blue), each row-major.
// Files: cifar-10-batches-bin/data_batch_{1..5}.bin and test_batch.bin
// (10000 records each); cifar-100-binary/train.bin (50000) and test.bin (10000).

#include <torch/arg.h>

#include <cstdint>
#include <string>

#include "ember/core/config.h"
#include "ember/data/dataset.h"
#include "ember/data/idx.h"  // Split

namespace ember::data {

enum class CifarVariant { kCifar10, kCifar100 };
/// "cifar10", "cifar100" -> CifarVariant; anything else is a config error listing them.
CifarVariant parse_cifar_variant(const std::string& name);
/// "cifar10" or "cifar100".
const char* to_string(CifarVariant variant);

/// Which CIFAR-100 label to use as the target.
enum class CifarLabel { kFine, kCoarse };

struct CifarOptions {
  TORCH_ARG(CifarVariant, variant) = CifarVariant::kCifar10;
  /// CIFAR-100 only: fine (100 classes, default) or coarse (20 superclasses).
  TORCH_ARG(CifarLabel, label) = CifarLabel::kFine;
};

/// Classes of the targets `options` reads: 10 (CIFAR-10), 100 (CIFAR-100
/// fine) or 20 (CIFAR-100 coarse).
int64_t cifar_num_classes(const CifarOptions& options);

/// data.variant (cifar10 | cifar100, fine labels), with its default from
/// `defaults`; registers cifar_options_from_config with the config's checks.
/// The folder key (data.root) is the recipe's.
void declare_cifar_keys(core::Config& config, const CifarOptions& defaults = {});
/// CifarOptions from data.variant (a name outside the choices is a config error).
CifarOptions cifar_options_from_config(const core::Config& config);

/// Reads one binary file. Images uint8 [N, 32, 32, 3] (NHWC, the layout the
/// augmentation ops take), targets int64 [N]. Errors name the file and say
/// what is wrong (missing, not a whole number of records, a label out of range).
TensorDataset read_cifar_bin(const std::string& path, const CifarOptions& options = {});

/// Loads a split from `root`: the folder holding the .bin files, or its parent
/// (which holds cifar-10-batches-bin/ or cifar-100-binary/). CIFAR-10 train is
/// the five data_batch files in order.
TensorDataset load_cifar(const std::string& root, Split split, const CifarOptions& options = {});

/// Writes `dataset` (uint8 images [N, 32, 32, 3], int64 targets [N]) as one
/// binary file in the variant's format. For CIFAR-100, targets are the fine
/// labels and the coarse byte is written as fine / 5 (for tests and tools;
/// the real coarse mapping is not arithmetic).
void write_cifar_bin(const std::string& path, const TensorDataset& dataset, const CifarOptions& options = {});

}  // namespace ember::data
