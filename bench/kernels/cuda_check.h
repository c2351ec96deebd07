// CHECK(call): a CUDA runtime call that must succeed, else the kernel
// benchmarks in this folder exit with the file, line and CUDA's message;
// and the small helpers they share (device buffers, event timing).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <vector>

#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__,                  \
                   cudaGetErrorString(e_));                                    \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

/// n elements of device memory (not cleared).
template <class T> T *device_alloc(size_t n) {
  T *p = nullptr;
  CHECK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

/// A device copy of v.
template <class T> T *upload(const std::vector<T> &v) {
  T *p = device_alloc<T>(v.size());
  CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

/// Milliseconds per call of fn() on the default stream, by CUDA events over
/// reps calls, after one untimed call when warm.
template <class Fn> float time_ms(Fn &&fn, int reps = 10, bool warm = true) {
  if (warm) {
    fn();
    CHECK(cudaDeviceSynchronize());
  }
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventRecord(e0));
  for (int r = 0; r < reps; ++r)
    fn();
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return ms / reps;
}

/// Device-to-device copy bandwidth, GB/s of bytes read + written: ten
/// copies of 1 GiB after one untimed (the ceiling the sweeps compare with).
inline float copy_bandwidth_gbs() {
  const size_t bytes = 1ull << 30;
  char *src = device_alloc<char>(bytes), *dst = device_alloc<char>(bytes);
  CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
  const float ms = time_ms(
      [&] { CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, 10,
      false);
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
  return 2.0f * bytes / (ms * 1e-3f) / 1e9f;
}
