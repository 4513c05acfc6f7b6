#pragma once
// Launcher of the count_correct kernel. Plain C++ types only, so that the
// .cu file needs no LibTorch headers and compiles in seconds.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace ember::train::cuda {

enum class DType { kFloat32, kFloat64, kFloat16, kBFloat16 };

/// Adds to *count the number of rows r of logits [rows, cols] (row-major,
/// contiguous) whose first arg-max equals targets[r]. Asynchronous on `stream`.
void launch_count_correct(const void* logits, DType dtype, const int64_t* targets, int64_t rows, int64_t cols,
                          unsigned long long* count, cudaStream_t stream);

}  // namespace ember::train::cuda
