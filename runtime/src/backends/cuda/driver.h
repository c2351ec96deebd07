// The CUDA driver API, loaded at run time, and RAII handles over it.
//
// nf has no link-time dependency on CUDA: loadDriver() dlopens the driver
// library ("libcuda.so.1"), resolves the entry points nf uses by name and
// calls cuInit. On a machine without the driver (or without a GPU) loading
// fails with a one-line Status and the CPU backend runs instead (see
// EngineOptions::backend). The types and constants below are the driver
// API's own (cuda.h of CUDA 12/13; their values are part of the driver's
// ABI), declared here so that the runtime builds without the CUDA toolkit.
//
// Entry points are resolved by their current versioned names (cuMemAlloc_v2,
// cuStreamBeginCapture_v2, ...): the unversioned symbols of those are older
// ABIs (32-bit sizes, other signatures) and are never used. Where the newer
// version has the same signature (cuStreamDestroy_v2, cuCtxPushCurrent_v2,
// cuDevicePrimaryCtxRelease_v2) the unversioned name is a fallback for old
// drivers.
//
// Every call that can fail is checked: Driver::check turns a CUresult into a
// Status naming the call, the error and its description, e.g.
// "cuMemAlloc: out of memory (CUDA_ERROR_OUT_OF_MEMORY)". Internal.
#pragma once

#include "nf/status.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace nf::cuda {

// ---------------------------------------------------------------------------
// Driver API types (cuda.h)

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUgraph_st;
struct CUgraphExec_st;
struct CUevent_st;
using CUcontext = CUctx_st *;
using CUmodule = CUmod_st *;
using CUfunction = CUfunc_st *;
using CUstream = CUstream_st *;
using CUgraph = CUgraph_st *;
using CUgraphExec = CUgraphExec_st *;
using CUevent = CUevent_st *;
using CUjit_option = int;
using CUdevice_attribute = int;
using CUfunction_attribute = int;
using CUstreamCaptureMode = int;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;

constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95;
constexpr CUdevice_attribute
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;

constexpr CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES =
    8;

constexpr CUjit_option CU_JIT_INFO_LOG_BUFFER = 3;
constexpr CUjit_option CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4;
constexpr CUjit_option CU_JIT_ERROR_LOG_BUFFER = 5;
constexpr CUjit_option CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6;

// cuTensorMapEncodeTiled's enums (CUtensorMapDataType, ...Swizzle, ...).
constexpr int CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9;
constexpr int CU_TENSOR_MAP_INTERLEAVE_NONE = 0;
constexpr int CU_TENSOR_MAP_SWIZZLE_128B = 3;
constexpr int CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3;
constexpr int CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0;
/// CUtensorMap: 128 opaque bytes, 64-byte aligned.
struct alignas(64) CUtensorMap {
  unsigned long long opaque[16];
};

constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
constexpr CUstreamCaptureMode CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;

constexpr int CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2;
constexpr int CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;

/// CUlaunchAttribute: an 8-byte id slot and a 64-byte value union.
struct CUlaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  union {
    char pad[64];
    int cooperative;
    int programmaticStreamSerializationAllowed;
  } value;
};
static_assert(sizeof(CUlaunchAttribute) == 72);

struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute *attrs;
  unsigned numAttrs;
};
static_assert(sizeof(void *) != 8 || sizeof(CUlaunchConfig) == 56);

// ---------------------------------------------------------------------------
// The loaded driver

struct Driver {
  std::string library; // what was dlopened
  void *handle = nullptr;
  int version = 0; // cuDriverGetVersion, e.g. 13000

  CUresult (*cuGetErrorName)(CUresult, const char **) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char **) = nullptr;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int *) = nullptr;
  CUresult (*cuDeviceGetCount)(int *) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice *, int) = nullptr;
  CUresult (*cuDeviceGetName)(char *, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int *, CUdevice_attribute,
                                   CUdevice) = nullptr;
  CUresult (*cuDeviceTotalMem)(size_t *, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*cuCtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxPopCurrent)(CUcontext *) = nullptr;
  CUresult (*cuMemGetInfo)(size_t *, size_t *) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemAllocHost)(void **, size_t) = nullptr;
  CUresult (*cuMemFreeHost)(void *) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t,
                                CUstream) = nullptr;
  CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t,
                                CUstream) = nullptr;
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t,
                                CUstream) = nullptr;
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t,
                              CUstream) = nullptr;
  CUresult (*cuModuleLoadDataEx)(CUmodule *, const void *, unsigned,
                                 CUjit_option *, void **) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule,
                                  const char *) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, CUfunction_attribute,
                                 int) = nullptr;
  /// Optional: modules that declare TMA tensor maps (nf_abi.h) need both.
  CUresult (*cuModuleGetGlobal)(CUdeviceptr *, size_t *, CUmodule,
                                const char *) = nullptr;
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap *, int, unsigned, void *,
                                     const unsigned long long *,
                                     const unsigned long long *,
                                     const unsigned *, const unsigned *, int,
                                     int, int, int) = nullptr;
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int *, CUfunction,
                                                          int,
                                                          size_t) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, unsigned, CUstream, void **,
                             void **) = nullptr;
  CUresult (*cuLaunchCooperativeKernel)(CUfunction, unsigned, unsigned,
                                        unsigned, unsigned, unsigned, unsigned,
                                        unsigned, CUstream, void **) = nullptr;
  /// Optional (CUDA 12+): cooperative launches through it can be captured.
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **,
                               void **) = nullptr;
  CUresult (*cuStreamCreate)(CUstream *, unsigned) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuStreamBeginCapture)(CUstream, CUstreamCaptureMode) = nullptr;
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph *) = nullptr;
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec *, CUgraph,
                                          unsigned long long) = nullptr;
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*cuGraphDestroy)(CUgraph) = nullptr;
  CUresult (*cuGraphExecDestroy)(CUgraphExec) = nullptr;
  /// Optional: events time kernels for NF_CUDA_PROFILE.
  CUresult (*cuEventCreate)(CUevent *, unsigned) = nullptr;
  CUresult (*cuEventDestroy)(CUevent) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent) = nullptr;

  /// "out of memory (CUDA_ERROR_OUT_OF_MEMORY)"; "CUDA error 999" for codes
  /// the driver does not name.
  std::string describe(CUresult r) const;
  /// Success, or "<call>: <describe(r)>".
  Status check(CUresult r, const char *call) const {
    if (r == CUDA_SUCCESS)
      return Status::success();
    return Status::error(std::string(call) + ": " + describe(r));
  }
};

/// The driver library nf loads: `path` when not empty, else $NF_LIBCUDA when
/// set, else "libcuda.so.1".
std::string driverLibrary(const std::string &path = "");

/// Loads the driver library (see driverLibrary), resolves its entry points
/// and initialises it (cuInit). The result, success or failure, is kept for
/// the life of the process per library path (the library is never
/// unloaded). Thread-safe. Errors: "cannot load libcuda.so.1: <dlerror>",
/// "<library>: no entry point cuXxx (driver too old?)", "cuInit: ...".
StatusOr<const Driver *> loadDriver(const std::string &path = "");

// ---------------------------------------------------------------------------
// Devices

struct DeviceInfo {
  int ordinal = 0;
  CUdevice device = 0;
  std::string name; // "NVIDIA H200"
  int major = 0, minor = 0;
  int multiprocessors = 0;
  bool cooperativeLaunch = false;
  int maxSharedPerBlockOptin = 0;
  int maxThreadsPerBlock = 0;
  size_t totalMemory = 0;
  /// "sm_90"
  std::string arch() const {
    return "sm_" + std::to_string(major) + std::to_string(minor);
  }
};

/// Device `ordinal` (checked against cuDeviceGetCount: "no CUDA device" when
/// there is none) and its attributes.
StatusOr<DeviceInfo> queryDevice(const Driver &d, int ordinal);

// ---------------------------------------------------------------------------
// RAII handles. Each owns one driver object and releases it on destruction
// (errors at release are ignored: nothing can be done about them then).
// Move-only. The device objects must be released while their context is
// current (see ContextScope). `Release` is the Driver entry point that frees
// a T (&Driver::cuMemFree), so that one template serves every kind of handle.

template <typename T, auto Release> class Owned {
public:
  Owned() = default;
  Owned(const Driver &d, T h) : d_(&d), h_(h) {}
  Owned(Owned &&o) noexcept : d_(o.d_), h_(std::exchange(o.h_, T{})) {}
  Owned &operator=(Owned &&o) noexcept {
    if (this != &o) {
      reset();
      d_ = o.d_;
      h_ = std::exchange(o.h_, T{});
    }
    return *this;
  }
  Owned(const Owned &) = delete;
  Owned &operator=(const Owned &) = delete;
  ~Owned() { reset(); }

  void reset() noexcept {
    if (h_ != T{})
      (void)(d_->*Release)(h_);
    h_ = T{};
  }
  T get() const { return h_; }
  explicit operator bool() const { return h_ != T{}; }

private:
  const Driver *d_ = nullptr;
  T h_{};
};

using DeviceMemory = Owned<CUdeviceptr, &Driver::cuMemFree>;
using HostMemory = Owned<void *, &Driver::cuMemFreeHost>;
using Module = Owned<CUmodule, &Driver::cuModuleUnload>;
using Event = Owned<CUevent, &Driver::cuEventDestroy>;
using Stream = Owned<CUstream, &Driver::cuStreamDestroy>;
using Graph = Owned<CUgraph, &Driver::cuGraphDestroy>;
using GraphExec = Owned<CUgraphExec, &Driver::cuGraphExecDestroy>;

/// Device memory (cuMemAlloc).
struct DeviceBuffer {
  DeviceMemory mem;
  size_t bytes = 0;
  CUdeviceptr ptr() const { return mem.get(); }
};

/// Page-locked host memory (cuMemAllocHost), for asynchronous copies.
struct PinnedBuffer {
  HostMemory mem;
  size_t bytes = 0;
  uint8_t *data() const { return static_cast<uint8_t *>(mem.get()); }
};

/// The retained primary context of a device; released on destruction.
class Context {
public:
  static StatusOr<Context> retain(const Driver &d, CUdevice device);
  Context() = default;
  Context(Context &&o) noexcept
      : d_(o.d_), device_(o.device_), ctx_(std::exchange(o.ctx_, nullptr)) {}
  Context &operator=(Context &&o) noexcept;
  Context(const Context &) = delete;
  Context &operator=(const Context &) = delete;
  ~Context() { reset(); }
  void reset() noexcept;
  CUcontext get() const { return ctx_; }

private:
  const Driver *d_ = nullptr;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
};

/// Makes `ctx` current on this thread for the scope (push/pop, so that a
/// caller's own current context is restored).
class ContextScope {
public:
  ContextScope(const Driver &d, CUcontext ctx);
  ~ContextScope();
  ContextScope(const ContextScope &) = delete;
  ContextScope &operator=(const ContextScope &) = delete;
  /// The push's result.
  const Status &status() const { return status_; }

private:
  const Driver *d_;
  bool pushed_ = false;
  Status status_;
};

StatusOr<DeviceBuffer> allocDevice(const Driver &d, size_t bytes);
StatusOr<PinnedBuffer> allocPinned(const Driver &d, size_t bytes);
StatusOr<Stream> createStream(const Driver &d);

/// Loads a module from a cubin (any alignment; copied) or from
/// NUL-terminated PTX (JIT-compiled for the current device). Errors carry
/// the JIT's error log.
StatusOr<Module> loadModule(const Driver &d, const void *image, size_t size,
                            bool ptx);

/// Launches `f` with the kernel parameters of nf_abi.h, `args` and `arena`
/// (device pointers; a function that declares only the first, a decode
/// function or one from a plan before 1.3, reads only that):
/// cuLaunchKernel, or cuLaunchKernelEx with the cooperative attribute
/// (capturable into graphs; else cuLaunchCooperativeKernel) or the
/// programmatic-stream-serialization attribute (the kernel may start before
/// the previous one in the stream ends; it must wait with
/// griddepcontrol.wait).
Status launch(const Driver &d, CUfunction f, unsigned grid, unsigned block,
              unsigned sharedBytes, bool cooperative, bool programmatic,
              CUstream stream, CUdeviceptr args, CUdeviceptr arena);

} // namespace nf::cuda
