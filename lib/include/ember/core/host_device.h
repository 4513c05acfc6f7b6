#pragma once
// EMBER_HOST_DEVICE marks a function that runs both in CUDA kernels and on the
// host: `__host__ __device__` under nvcc, plain `inline` elsewhere. Ember's
// kernels keep their per-thread work and index arithmetic in such functions,
// so the CPU references and the emulated-launch tests run the same code.

#if defined(__CUDACC__)
#define EMBER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define EMBER_HOST_DEVICE inline
#endif
