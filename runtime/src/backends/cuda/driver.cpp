#include "backends/cuda/driver.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <dlfcn.h>

namespace nf::cuda {

std::string Driver::describe(CUresult r) const {
  const char *name = nullptr, *text = nullptr;
  if (cuGetErrorName && cuGetErrorName(r, &name) != CUDA_SUCCESS)
    name = nullptr;
  if (cuGetErrorString && cuGetErrorString(r, &text) != CUDA_SUCCESS)
    text = nullptr;
  if (!name) {
    // A stub or broken driver may not name its own errors.
    switch (r) {
    case CUDA_ERROR_NOT_INITIALIZED:
      name = "CUDA_ERROR_NOT_INITIALIZED";
      break;
    case CUDA_ERROR_STUB_LIBRARY:
      name = "CUDA_ERROR_STUB_LIBRARY";
      text = "CUDA driver is a stub library";
      break;
    case CUDA_ERROR_NO_DEVICE:
      name = "CUDA_ERROR_NO_DEVICE";
      text = "no CUDA-capable device is detected";
      break;
    default:
      break;
    }
  }
  const std::string code =
      name ? std::string(name) : "CUDA error " + std::to_string(r);
  if (!text)
    return code;
  return std::string(text) + " (" + code + ")";
}

std::string driverLibrary(const std::string &path) {
  if (!path.empty())
    return path;
  if (const char *env = std::getenv("NF_LIBCUDA"); env && *env)
    return env;
  return "libcuda.so.1";
}

namespace {

/// One entry point: where it goes and the names to try, in order.
struct Symbol {
  void **slot;
  const char *names[2];
  bool required;
};

template <typename F> void **slotOf(F *&fn) {
  return reinterpret_cast<void **>(&fn);
}

StatusOr<std::unique_ptr<Driver>> openDriver(const std::string &library) {
  auto d = std::make_unique<Driver>();
  d->library = library;
  // RTLD_LOCAL: libcuda's symbols stay out of the global namespace.
  d->handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!d->handle) {
    const char *err = dlerror();
    return Status::error("cannot load " + library + ": " +
                         (err ? err : "unknown error"));
  }
  const Symbol symbols[] = {
      {slotOf(d->cuGetErrorName), {"cuGetErrorName"}, true},
      {slotOf(d->cuGetErrorString), {"cuGetErrorString"}, true},
      {slotOf(d->cuInit), {"cuInit"}, true},
      {slotOf(d->cuDriverGetVersion), {"cuDriverGetVersion"}, true},
      {slotOf(d->cuDeviceGetCount), {"cuDeviceGetCount"}, true},
      {slotOf(d->cuDeviceGet), {"cuDeviceGet"}, true},
      {slotOf(d->cuDeviceGetName), {"cuDeviceGetName"}, true},
      {slotOf(d->cuDeviceGetAttribute), {"cuDeviceGetAttribute"}, true},
      {slotOf(d->cuDeviceTotalMem), {"cuDeviceTotalMem_v2"}, true},
      {slotOf(d->cuDevicePrimaryCtxRetain), {"cuDevicePrimaryCtxRetain"}, true},
      {slotOf(d->cuDevicePrimaryCtxRelease),
       {"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"},
       true},
      {slotOf(d->cuCtxPushCurrent),
       {"cuCtxPushCurrent_v2", "cuCtxPushCurrent"},
       true},
      {slotOf(d->cuCtxPopCurrent),
       {"cuCtxPopCurrent_v2", "cuCtxPopCurrent"},
       true},
      {slotOf(d->cuMemGetInfo), {"cuMemGetInfo_v2"}, true},
      {slotOf(d->cuMemAlloc), {"cuMemAlloc_v2"}, true},
      {slotOf(d->cuMemFree), {"cuMemFree_v2"}, true},
      {slotOf(d->cuMemAllocHost), {"cuMemAllocHost_v2"}, true},
      {slotOf(d->cuMemFreeHost), {"cuMemFreeHost"}, true},
      {slotOf(d->cuMemcpyHtoDAsync), {"cuMemcpyHtoDAsync_v2"}, true},
      {slotOf(d->cuMemcpyDtoHAsync), {"cuMemcpyDtoHAsync_v2"}, true},
      {slotOf(d->cuMemcpyDtoDAsync), {"cuMemcpyDtoDAsync_v2"}, true},
      {slotOf(d->cuMemsetD8Async), {"cuMemsetD8Async"}, true},
      {slotOf(d->cuModuleLoadDataEx), {"cuModuleLoadDataEx"}, true},
      {slotOf(d->cuModuleUnload), {"cuModuleUnload"}, true},
      {slotOf(d->cuModuleGetFunction), {"cuModuleGetFunction"}, true},
      {slotOf(d->cuFuncSetAttribute), {"cuFuncSetAttribute"}, true},
      {slotOf(d->cuModuleGetGlobal), {"cuModuleGetGlobal_v2"}, true},
      {slotOf(d->cuTensorMapEncodeTiled), {"cuTensorMapEncodeTiled"}, false},
      {slotOf(d->cuOccupancyMaxActiveBlocksPerMultiprocessor),
       {"cuOccupancyMaxActiveBlocksPerMultiprocessor"},
       true},
      {slotOf(d->cuLaunchKernel), {"cuLaunchKernel"}, true},
      {slotOf(d->cuLaunchCooperativeKernel),
       {"cuLaunchCooperativeKernel"},
       true},
      {slotOf(d->cuLaunchKernelEx), {"cuLaunchKernelEx"}, false},
      {slotOf(d->cuStreamCreate), {"cuStreamCreate"}, true},
      {slotOf(d->cuStreamDestroy),
       {"cuStreamDestroy_v2", "cuStreamDestroy"},
       true},
      {slotOf(d->cuStreamSynchronize), {"cuStreamSynchronize"}, true},
      // Not the unversioned cuStreamBeginCapture: that one has no mode.
      {slotOf(d->cuStreamBeginCapture), {"cuStreamBeginCapture_v2"}, true},
      {slotOf(d->cuStreamEndCapture), {"cuStreamEndCapture"}, true},
      {slotOf(d->cuGraphInstantiateWithFlags),
       {"cuGraphInstantiateWithFlags"},
       true},
      {slotOf(d->cuGraphLaunch), {"cuGraphLaunch"}, true},
      {slotOf(d->cuGraphDestroy), {"cuGraphDestroy"}, true},
      {slotOf(d->cuGraphExecDestroy), {"cuGraphExecDestroy"}, true},
      {slotOf(d->cuEventCreate), {"cuEventCreate"}, false},
      {slotOf(d->cuEventDestroy),
       {"cuEventDestroy_v2", "cuEventDestroy"},
       false},
      {slotOf(d->cuEventRecord), {"cuEventRecord"}, false},
      {slotOf(d->cuEventSynchronize), {"cuEventSynchronize"}, false},
      {slotOf(d->cuEventElapsedTime),
       {"cuEventElapsedTime_v2", "cuEventElapsedTime"},
       false},
  };
  for (const Symbol &s : symbols) {
    for (const char *name : s.names) {
      if (!name)
        continue;
      if (void *p = dlsym(d->handle, name)) {
        *s.slot = p;
        break;
      }
    }
    if (!*s.slot && s.required)
      // The library stays loaded (as on success): unloading a half-used
      // driver is not worth the risk.
      return Status::error(library + ": no entry point " + s.names[0] +
                           " (not a CUDA driver, or one too old: CUDA 11.4 "
                           "or newer is needed)");
  }
  if (Status s = d->check(d->cuInit(0), "cuInit"); !s)
    return s;
  if (Status s =
          d->check(d->cuDriverGetVersion(&d->version), "cuDriverGetVersion");
      !s)
    return s;
  return d;
}

struct Loaded {
  std::unique_ptr<Driver> driver;
  Status status;
};

} // namespace

StatusOr<const Driver *> loadDriver(const std::string &path) {
  const std::string library = driverLibrary(path);
  // Never destroyed: engines may outlive static destructors.
  static std::mutex *mutex = new std::mutex;
  static auto *loaded = new std::map<std::string, Loaded>;
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = loaded->find(library);
  if (it == loaded->end()) {
    Loaded l;
    StatusOr<std::unique_ptr<Driver>> d = openDriver(library);
    if (d)
      l.driver = std::move(*d);
    else
      l.status = d.status();
    it = loaded->emplace(library, std::move(l)).first;
  }
  if (!it->second.driver)
    return it->second.status;
  return static_cast<const Driver *>(it->second.driver.get());
}

// ---------------------------------------------------------------------------
// Devices

StatusOr<DeviceInfo> queryDevice(const Driver &d, int ordinal) {
  int count = 0;
  if (Status s = d.check(d.cuDeviceGetCount(&count), "cuDeviceGetCount"); !s)
    return s;
  if (count == 0)
    return Status::error("no CUDA device");
  if (ordinal < 0 || ordinal >= count)
    return Status::error("no CUDA device " + std::to_string(ordinal) + " (" +
                         std::to_string(count) + " present)");
  DeviceInfo info;
  info.ordinal = ordinal;
  if (Status s = d.check(d.cuDeviceGet(&info.device, ordinal), "cuDeviceGet");
      !s)
    return s;
  char name[256] = {};
  if (Status s = d.check(d.cuDeviceGetName(name, sizeof name - 1, info.device),
                         "cuDeviceGetName");
      !s)
    return s;
  info.name = name;
  auto attr = [&](CUdevice_attribute a, int &out) {
    return d.check(d.cuDeviceGetAttribute(&out, a, info.device),
                   "cuDeviceGetAttribute");
  };
  int coop = 0;
  for (auto [a, out] : {
           std::pair{CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &info.major},
           std::pair{CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &info.minor},
           std::pair{CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                     &info.multiprocessors},
           std::pair{CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, &coop},
           std::pair{CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                     &info.maxSharedPerBlockOptin},
           std::pair{CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                     &info.maxThreadsPerBlock},
       })
    if (Status s = attr(a, *out); !s)
      return s;
  info.cooperativeLaunch = coop != 0;
  if (Status s = d.check(d.cuDeviceTotalMem(&info.totalMemory, info.device),
                         "cuDeviceTotalMem");
      !s)
    return s;
  return info;
}

// ---------------------------------------------------------------------------
// Handles

StatusOr<Context> Context::retain(const Driver &d, CUdevice device) {
  Context c;
  if (Status s = d.check(d.cuDevicePrimaryCtxRetain(&c.ctx_, device),
                         "cuDevicePrimaryCtxRetain");
      !s)
    return s;
  c.d_ = &d;
  c.device_ = device;
  return c;
}

Context &Context::operator=(Context &&o) noexcept {
  if (this != &o) {
    reset();
    d_ = o.d_;
    device_ = o.device_;
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

void Context::reset() noexcept {
  if (ctx_)
    (void)d_->cuDevicePrimaryCtxRelease(device_);
  ctx_ = nullptr;
}

ContextScope::ContextScope(const Driver &d, CUcontext ctx) : d_(&d) {
  status_ = d.check(d.cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
  pushed_ = status_.ok();
}

ContextScope::~ContextScope() {
  if (pushed_) {
    CUcontext popped = nullptr;
    (void)d_->cuCtxPopCurrent(&popped);
  }
}

StatusOr<DeviceBuffer> allocDevice(const Driver &d, size_t bytes) {
  CUdeviceptr p = 0;
  const size_t n = bytes == 0 ? 1 : bytes;
  if (Status s = d.check(d.cuMemAlloc(&p, n), "cuMemAlloc"); !s)
    return Status::error(s.message() + " (allocating " + std::to_string(n) +
                         " bytes)");
  DeviceBuffer b;
  b.mem = DeviceMemory(d, p);
  b.bytes = bytes;
  return b;
}

StatusOr<PinnedBuffer> allocPinned(const Driver &d, size_t bytes) {
  void *p = nullptr;
  const size_t n = bytes == 0 ? 1 : bytes;
  if (Status s = d.check(d.cuMemAllocHost(&p, n), "cuMemAllocHost"); !s)
    return Status::error(s.message() + " (allocating " + std::to_string(n) +
                         " bytes of pinned host memory)");
  PinnedBuffer b;
  b.mem = HostMemory(d, p);
  b.bytes = bytes;
  return b;
}

StatusOr<Stream> createStream(const Driver &d) {
  CUstream s = nullptr;
  if (Status st = d.check(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING),
                          "cuStreamCreate");
      !st)
    return st;
  return Stream(d, s);
}

StatusOr<Module> loadModule(const Driver &d, const void *image, size_t size,
                            bool ptx) {
  // A cubin is an ELF image: copied so that it is 8-byte aligned whatever
  // its place in the plan.
  std::vector<uint64_t> aligned;
  const void *data = image;
  if (!ptx) {
    aligned.resize((size + 7) / 8 + 1, 0);
    std::memcpy(aligned.data(), image, size);
    data = aligned.data();
  }
  constexpr size_t kLog = 16384;
  std::vector<char> errorLog(kLog, '\0');
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER,
                            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *values[] = {errorLog.data(),
                    reinterpret_cast<void *>(static_cast<uintptr_t>(kLog))};
  CUmodule m = nullptr;
  const CUresult r = d.cuModuleLoadDataEx(&m, data, 2, options, values);
  if (r != CUDA_SUCCESS) {
    errorLog.back() = '\0';
    std::string log(errorLog.data());
    for (char &c : log)
      if (c == '\n' || c == '\r')
        c = ' ';
    while (!log.empty() && log.back() == ' ')
      log.pop_back();
    return Status::error(d.check(r, "cuModuleLoadDataEx").message() +
                         (ptx ? " [PTX JIT]" : " [cubin]") +
                         (log.empty() ? "" : ": " + log));
  }
  return Module(d, m);
}

Status launch(const Driver &d, CUfunction f, unsigned grid, unsigned block,
              unsigned sharedBytes, bool cooperative, bool programmatic,
              CUstream stream, CUdeviceptr args, CUdeviceptr arena) {
  void *params[] = {&args, &arena};
  if ((cooperative || programmatic) && d.cuLaunchKernelEx) {
    CUlaunchAttribute attr;
    std::memset(&attr, 0, sizeof attr);
    if (cooperative) {
      attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attr.value.cooperative = 1;
    } else {
      attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attr.value.programmaticStreamSerializationAllowed = 1;
    }
    CUlaunchConfig cfg;
    std::memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = grid;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = block;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.sharedMemBytes = sharedBytes;
    cfg.hStream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    return d.check(d.cuLaunchKernelEx(&cfg, f, params, nullptr),
                   "cuLaunchKernelEx");
  }
  if (cooperative)
    return d.check(d.cuLaunchCooperativeKernel(f, grid, 1, 1, block, 1, 1,
                                               sharedBytes, stream, params),
                   "cuLaunchCooperativeKernel");
  return d.check(d.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, sharedBytes,
                                  stream, params, nullptr),
                 "cuLaunchKernel");
}

} // namespace nf::cuda
