// A CUPTI injection library that writes every kernel's start and end (ns,
// GPU clock) as CSV, for a timeline of a decode step's CUDA graph with its
// programmatic launches (Nsight Systems' importer does not run on the
// device machine; docs/cuda.md, Performance). Build and use on the GPU
// machine:
//
//   g++ -O2 -shared -fPIC -I$CUDA/include bench/tools/cupti_trace.cpp \
//     -L$CUDA/lib64 -lcupti -o cupti_trace.so \
//     -DKERNEL_RECORD=CUpti_ActivityKernel10
//   CUDA_INJECTION64_PATH=$PWD/cupti_trace.so NF_TRACE_CSV=trace.csv \
//     nfrun bench ...
//
// KERNEL_RECORD: a CUPTI kernel record version the toolkit declares
// (CUDA 13.0: up to 10; the fields read here are in every version since 4).
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#ifndef KERNEL_RECORD
#define KERNEL_RECORD CUpti_ActivityKernel9
#endif

namespace {
std::FILE *out = nullptr;
std::mutex mu;

void CUPTIAPI bufferRequested(uint8_t **buffer, size_t *size,
                              size_t *maxRecords) {
  constexpr size_t kBytes = 8 << 20;
  *buffer = static_cast<uint8_t *>(std::aligned_alloc(8, kBytes));
  *size = kBytes;
  *maxRecords = 0;
}

void CUPTIAPI bufferCompleted(CUcontext, uint32_t, uint8_t *buffer, size_t,
                              size_t validSize) {
  CUpti_Activity *record = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, validSize, &record) ==
         CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    auto *k = reinterpret_cast<const KERNEL_RECORD *>(record);
    if (out)
      std::fprintf(out, "%s,%llu,%llu,%u,%d,%d\n", k->name,
                   static_cast<unsigned long long>(k->start),
                   static_cast<unsigned long long>(k->end), k->correlationId,
                   k->gridX, k->blockX);
  }
  std::free(buffer);
}

void finish() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(mu);
  if (out)
    std::fclose(out);
  out = nullptr;
}
} // namespace

extern "C" int InitializeInjection(void) {
  const char *path = std::getenv("NF_TRACE_CSV");
  out = std::fopen(path ? path : "trace.csv", "w");
  if (!out)
    return 0;
  std::fprintf(out, "name,start,end,correlation,grid,block\n");
  if (cuptiActivityRegisterCallbacks(bufferRequested, bufferCompleted) !=
          CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) !=
          CUPTI_SUCCESS)
    return 0;
  std::atexit(finish);
  return 1;
}
