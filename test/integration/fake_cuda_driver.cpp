// A fake CUDA driver (libnf_fake_cuda.so) for testing the CUDA backend's
// host side without a GPU: nf loads it in place of libcuda.so.1
// (EngineOptions::cudaDriver) and it answers the driver API entry points nf
// resolves, on the host:
//  - one device ("nf fake GPU", sm_90); a context must be current (pushed)
//    for every call that needs one, as with the real driver;
//  - device memory is host memory; every copy and memset is checked to stay
//    inside one live allocation, frees of unknown pointers fail; the device
//    has 1 GiB, or NF_FAKE_CUDA_MEMORY_MIB, which cuMemGetInfo reports less
//    what is allocated (allocations beyond it fail only when that variable
//    is set);
//  - streams queue their work and run it at cuStreamSynchronize (so that
//    host code reading results before synchronising, or changing a staging
//    buffer whose copy is still queued, is caught); stream capture records
//    the work into a graph, which cuGraphLaunch replays;
//  - modules are PTX text or ELF images; a function exists when its name is
//    an entry of the PTX or a string of the image, and runs if it is one of
//    the smoke kernels of cuda_smoke_plan.cpp (implemented here as loops).
// nfFakeCudaLiveAllocations() reports device and pinned allocations still
// held, to check that engines free everything.
#include "nf_abi.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;

constexpr CUresult kSuccess = 0;
constexpr CUresult kInvalidValue = 1;
constexpr CUresult kOutOfMemory = 2;
constexpr CUresult kInvalidContext = 201;
constexpr CUresult kInvalidImage = 200;
constexpr CUresult kNotFound = 500;
constexpr CUresult kIllegalAddress = 700;
constexpr CUresult kLaunchFailed = 719;
constexpr CUresult kCaptureInvalidated = 901;

struct Context {
  int magic = 0x5eed;
};
Context gContext;

thread_local std::vector<Context *> tContexts;

std::mutex gMutex;
std::map<uintptr_t, size_t> gDevice; // base -> bytes
std::map<uintptr_t, size_t> gPinned;

bool current() { return !tContexts.empty(); }

/// Whether [p, p + n) lies in one live device allocation.
bool inDevice(uintptr_t p, size_t n) {
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gDevice.upper_bound(p);
  if (it == gDevice.begin())
    return false;
  --it;
  return p >= it->first && p + n <= it->first + it->second;
}

using Op = std::function<CUresult()>;

struct Stream {
  std::vector<Op> queue;
  bool capturing = false;
  std::vector<Op> captured;
  CUresult captureError = kSuccess;
};

struct Graph {
  std::vector<Op> ops;
};

CUresult enqueue(Stream *s, Op op) {
  if (!s)
    return op(); // the legacy default stream: run now
  if (s->capturing) {
    s->captured.push_back(std::move(op));
    return kSuccess;
  }
  s->queue.push_back(std::move(op));
  return kSuccess;
}

// ---------------------------------------------------------------------------
// Kernels (host versions of cuda_smoke_plan.cpp's smoke kernels)

using Kernel = CUresult (*)(const nf_step_args *);

bool argsOk(const nf_step_args *a) {
  return inDevice(reinterpret_cast<uintptr_t>(a), sizeof *a);
}

CUresult smokeNop(const nf_step_args *a) {
  return argsOk(a) ? kSuccess : kIllegalAddress;
}

CUresult smokeEmbed(const nf_step_args *a) {
  if (!argsOk(a))
    return kIllegalAddress;
  const float *e = static_cast<const float *>(a->weights[0]);
  float *hid = reinterpret_cast<float *>(a->arena + 0);
  const int n = a->num_tokens * 8;
  if (!inDevice(reinterpret_cast<uintptr_t>(hid), n * 4u))
    return kIllegalAddress;
  for (int i = 0; i < n; ++i)
    hid[i] = e[a->tokens[i / 8] * 8 + i % 8];
  return kSuccess;
}

CUresult smokeLmHead(const nf_step_args *a) {
  if (!argsOk(a))
    return kIllegalAddress;
  const float *w = static_cast<const float *>(a->weights[1]);
  const float *hid = reinterpret_cast<const float *>(a->arena + 0);
  float *out = reinterpret_cast<float *>(a->arena + 65536);
  const int n = a->num_tokens * 32;
  if (!inDevice(reinterpret_cast<uintptr_t>(out), n * 4u))
    return kIllegalAddress;
  for (int i = 0; i < n; ++i) {
    const int t = i / 32, v = i % 32;
    float acc = 0.0f;
    for (int h = 0; h < 8; ++h)
      acc += hid[t * 8 + h] * w[v * 8 + h];
    out[i] = acc;
  }
  return kSuccess;
}

CUresult smokeState(const nf_step_args *a) {
  if (!argsOk(a))
    return kIllegalAddress;
  float *conv = static_cast<float *>(a->storage[0]);
  float *ssm = static_cast<float *>(a->storage[1]);
  float *kc = static_cast<float *>(a->storage[2]);
  float *vc = static_cast<float *>(a->storage[3]);
  float *out = reinterpret_cast<float *>(a->arena + 0);
  int *counts = reinterpret_cast<int *>(a->arena + 32768);
  int *experts = reinterpret_cast<int *>(a->arena + 36864);
  for (int s = 0; s < a->num_seqs; ++s) {
    const nf_seq_desc d = a->seqs[s];
    float *cw = conv + d.slot * 9;
    if (!inDevice(reinterpret_cast<uintptr_t>(cw), 36) ||
        !inDevice(reinterpret_cast<uintptr_t>(ssm + d.slot), 4))
      return kIllegalAddress;
    float run = ssm[d.slot];
    const int *pt = a->page_tables + s * a->max_pages_per_seq;
    for (int j = 0; j < d.count; ++j) {
      const int t = d.begin + j, pos = d.start_pos + j, tok = a->tokens[t];
      if (pos / 2 >= a->max_pages_per_seq)
        return kIllegalAddress;
      run += static_cast<float>(tok);
      cw[0] = cw[1];
      cw[1] = cw[2];
      cw[2] = static_cast<float>(tok);
      const int cell = pt[pos / 2] * 2 + pos % 2;
      if (!inDevice(reinterpret_cast<uintptr_t>(kc + cell), 4))
        return kIllegalAddress;
      kc[cell] = static_cast<float>(tok);
      vc[cell] = static_cast<float>(pos);
      float sk = 0.0f, sv = 0.0f;
      for (int p = 0; p <= pos; ++p) {
        const int c = pt[p / 2] * 2 + p % 2;
        sk += kc[c];
        sv += vc[c];
      }
      float *row = out + t * 32;
      for (int v = 0; v < 32; ++v)
        row[v] = 0.0f;
      row[0] = static_cast<float>(tok);
      row[1] = static_cast<float>(pos);
      row[2] = run;
      row[3] = sk;
      row[4] = sv;
      row[5] = cw[0];
      row[6] = cw[1];
      row[7] = cw[2];
      row[8] = a->budget[t];
      row[9] = static_cast<float>(a->experts_per_token);
      row[10] = a->token_seq[t] == s ? 1.0f : 0.0f;
      const int k = 1 + tok % 2;
      counts[t] = k;
      experts[t * 2] = tok % 4;
      experts[t * 2 + 1] = k > 1 ? (tok + 1) % 4 : -1;
    }
    ssm[d.slot] = run;
  }
  return kSuccess;
}

const std::map<std::string, Kernel> &kernels() {
  static const std::map<std::string, Kernel> k = {
      {"smoke_nop", smokeNop},
      {"smoke_embed", smokeEmbed},
      {"smoke_lm_head", smokeLmHead},
      {"smoke_state", smokeState}};
  return k;
}

/// A loaded module: its image and the device memory of its PTX globals
/// (`.global .align A .b8 name[n]`, with an optional `= {bytes}`), freed
/// with the module.
struct Function;

struct Module {
  std::string image;
  std::map<std::string, std::pair<CUdeviceptr, size_t>> globals;
  /// Handles of cuModuleGetFunction: the module owns them, as the real
  /// driver's does (freed by cuModuleUnload).
  std::vector<std::unique_ptr<Function>> functions;
  ~Module();
};

/// The `.global .align A .b8 name[n] (= {b, ...})` declarations of PTX
/// text, as zeroed device allocations holding their initial bytes.
void loadGlobals(Module &m) {
  const std::string key = ".global .align ";
  for (size_t at = m.image.find(key); at != std::string::npos;
       at = m.image.find(key, at + 1)) {
    const size_t b8 = m.image.find(".b8 ", at);
    const size_t open = m.image.find('[', b8);
    const size_t close = m.image.find(']', open);
    const size_t end = m.image.find(';', at);
    if (b8 == std::string::npos || close == std::string::npos || close > end)
      continue;
    const std::string name = m.image.substr(b8 + 4, open - b8 - 4);
    const size_t n = std::stoul(m.image.substr(open + 1, close - open - 1));
    void *mem = std::aligned_alloc(256, (n + 255) / 256 * 256);
    std::memset(mem, 0, n);
    const size_t brace = m.image.find('{', close);
    if (brace < end) {
      std::istringstream in(m.image.substr(brace + 1, end - brace - 1));
      std::string byte;
      for (size_t i = 0; i < n && std::getline(in, byte, ','); ++i)
        static_cast<unsigned char *>(mem)[i] =
            static_cast<unsigned char>(std::stoi(byte));
    }
    std::lock_guard<std::mutex> lock(gMutex);
    gDevice[reinterpret_cast<uintptr_t>(mem)] = n;
    m.globals[name] = {reinterpret_cast<uintptr_t>(mem), n};
  }
}

struct Function {
  std::string name;
  Kernel kernel = nullptr;
};

Module::~Module() {
  for (const auto &[name, g] : globals) {
    {
      std::lock_guard<std::mutex> lock(gMutex);
      gDevice.erase(g.first);
    }
    std::free(reinterpret_cast<void *>(g.first));
  }
}

struct LaunchAttribute {
  int id;
  char pad[4];
  union {
    char pad[64];
    int cooperative;
  } value;
};

struct LaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  Stream *hStream;
  LaunchAttribute *attrs;
  unsigned numAttrs;
};

CUresult launchOn(Function *f, unsigned grid, unsigned block, Stream *s,
                  void **params) {
  if (!current())
    return kInvalidContext;
  if (!f || grid == 0 || block == 0 || block > 1024 || !params || !params[0])
    return kInvalidValue;
  const auto *args = reinterpret_cast<const nf_step_args *>(
      static_cast<uintptr_t>(*static_cast<CUdeviceptr *>(params[0])));
  // The second parameter is the arena's base (nf_abi.h): it must be the
  // address the step arguments hold.
  const uintptr_t arena = *static_cast<CUdeviceptr *>(params[1]);
  Kernel k = f->kernel;
  // Not one of the smoke kernels: fails when it runs.
  return enqueue(s, [k, args, arena] {
    if (reinterpret_cast<uintptr_t>(args->arena) != arena)
      return kLaunchFailed;
    return k ? k(args) : kLaunchFailed;
  });
}

CUresult copy(uintptr_t dst, bool dstDevice, uintptr_t src, bool srcDevice,
              size_t n, Stream *s) {
  if (!current())
    return kInvalidContext;
  if ((dstDevice && !inDevice(dst, n)) || (srcDevice && !inDevice(src, n)))
    return kInvalidValue;
  return enqueue(s, [=] {
    std::memmove(reinterpret_cast<void *>(dst),
                 reinterpret_cast<const void *>(src), n);
    return kSuccess;
  });
}

} // namespace

extern "C" {

__attribute__((visibility("default"))) int nfFakeCudaLiveAllocations() {
  std::lock_guard<std::mutex> lock(gMutex);
  return static_cast<int>(gDevice.size() + gPinned.size());
}

CUresult cuGetErrorName(CUresult r, const char **s) {
  switch (r) {
  case kSuccess:
    *s = "CUDA_SUCCESS";
    return kSuccess;
  case kInvalidValue:
    *s = "CUDA_ERROR_INVALID_VALUE";
    return kSuccess;
  case kOutOfMemory:
    *s = "CUDA_ERROR_OUT_OF_MEMORY";
    return kSuccess;
  case kInvalidContext:
    *s = "CUDA_ERROR_INVALID_CONTEXT";
    return kSuccess;
  case kInvalidImage:
    *s = "CUDA_ERROR_INVALID_IMAGE";
    return kSuccess;
  case kNotFound:
    *s = "CUDA_ERROR_NOT_FOUND";
    return kSuccess;
  case kIllegalAddress:
    *s = "CUDA_ERROR_ILLEGAL_ADDRESS";
    return kSuccess;
  case kLaunchFailed:
    *s = "CUDA_ERROR_LAUNCH_FAILED";
    return kSuccess;
  case kCaptureInvalidated:
    *s = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    return kSuccess;
  default:
    *s = nullptr;
    return kInvalidValue;
  }
}

CUresult cuGetErrorString(CUresult r, const char **s) {
  const char *name = nullptr;
  if (cuGetErrorName(r, &name) != kSuccess)
    return kInvalidValue;
  *s = r == kSuccess ? "no error" : "fake driver error";
  return kSuccess;
}

CUresult cuInit(unsigned) { return kSuccess; }
CUresult cuDriverGetVersion(int *v) {
  *v = 13000;
  return kSuccess;
}
CUresult cuDeviceGetCount(int *n) {
  *n = 1;
  return kSuccess;
}
CUresult cuDeviceGet(int *d, int ordinal) {
  if (ordinal != 0)
    return kInvalidValue;
  *d = 0;
  return kSuccess;
}
CUresult cuDeviceGetName(char *name, int len, int) {
  std::strncpy(name, "nf fake GPU", static_cast<size_t>(len));
  return kSuccess;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int) {
  switch (attr) {
  case 1: // max threads per block
    *v = 1024;
    return kSuccess;
  case 16: // multiprocessors
    *v = 4;
    return kSuccess;
  case 75: // compute capability
    *v = 9;
    return kSuccess;
  case 76:
    *v = 0;
    return kSuccess;
  case 95: // cooperative launch
    *v = 1;
    return kSuccess;
  case 97: // max shared memory per block (opt-in)
    *v = 232448;
    return kSuccess;
  default:
    return kInvalidValue;
  }
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, int) {
  *bytes = size_t{1} << 30;
  return kSuccess;
}
CUresult cuDevicePrimaryCtxRetain(Context **ctx, int) {
  *ctx = &gContext;
  return kSuccess;
}
CUresult cuDevicePrimaryCtxRelease_v2(int) { return kSuccess; }
CUresult cuCtxPushCurrent_v2(Context *ctx) {
  if (ctx != &gContext)
    return kInvalidContext;
  tContexts.push_back(ctx);
  return kSuccess;
}
CUresult cuCtxPopCurrent_v2(Context **ctx) {
  if (tContexts.empty())
    return kInvalidContext;
  if (ctx)
    *ctx = tContexts.back();
  tContexts.pop_back();
  return kSuccess;
}
/// The device's memory (NF_FAKE_CUDA_MEMORY_MIB, default 1 GiB), and
/// whether allocations are held to it (only when that variable is set).
size_t deviceMemory(bool *enforced = nullptr) {
  const char *mib = std::getenv("NF_FAKE_CUDA_MEMORY_MIB");
  if (enforced)
    *enforced = mib && *mib;
  return mib && *mib
             ? static_cast<size_t>(std::strtoull(mib, nullptr, 10)) << 20
             : size_t{1} << 30;
}
size_t allocatedBytes() {
  std::lock_guard<std::mutex> lock(gMutex);
  size_t n = 0;
  for (const auto &[base, bytes] : gDevice)
    n += bytes;
  return n;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
  *total = deviceMemory();
  const size_t used = allocatedBytes();
  *free = used < *total ? *total - used : 0;
  return kSuccess;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  if (!current())
    return kInvalidContext;
  if (n == 0)
    return kInvalidValue;
  bool enforced = false;
  if (const size_t total = deviceMemory(&enforced);
      enforced && allocatedBytes() + n > total)
    return kOutOfMemory;
  void *m = std::aligned_alloc(256, (n + 255) / 256 * 256);
  if (!m)
    return kOutOfMemory;
  std::memset(m, 0xa5, n); // device memory starts as garbage
  std::lock_guard<std::mutex> lock(gMutex);
  gDevice[reinterpret_cast<uintptr_t>(m)] = n;
  *p = reinterpret_cast<uintptr_t>(m);
  return kSuccess;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  if (!current())
    return kInvalidContext;
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gDevice.find(static_cast<uintptr_t>(p));
  if (it == gDevice.end())
    return kInvalidValue;
  std::free(reinterpret_cast<void *>(it->first));
  gDevice.erase(it);
  return kSuccess;
}
CUresult cuMemAllocHost_v2(void **p, size_t n) {
  if (!current())
    return kInvalidContext;
  void *m = std::malloc(n);
  if (!m)
    return kOutOfMemory;
  std::lock_guard<std::mutex> lock(gMutex);
  gPinned[reinterpret_cast<uintptr_t>(m)] = n;
  *p = m;
  return kSuccess;
}
CUresult cuMemFreeHost(void *p) {
  if (!current())
    return kInvalidContext;
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gPinned.find(reinterpret_cast<uintptr_t>(p));
  if (it == gPinned.end())
    return kInvalidValue;
  std::free(p);
  gPinned.erase(it);
  return kSuccess;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n,
                              Stream *s) {
  return copy(dst, true, reinterpret_cast<uintptr_t>(src), false, n, s);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, Stream *s) {
  return copy(reinterpret_cast<uintptr_t>(dst), false, src, true, n, s);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n,
                              Stream *s) {
  return copy(dst, true, src, true, n, s);
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n,
                         Stream *s) {
  if (!current())
    return kInvalidContext;
  if (!inDevice(dst, n))
    return kInvalidValue;
  return enqueue(s, [=] {
    std::memset(reinterpret_cast<void *>(dst), v, n);
    return kSuccess;
  });
}
CUresult cuModuleLoadDataEx(Module **m, const void *image, unsigned n,
                            int *options, void **values) {
  if (!current())
    return kInvalidContext;
  const char *p = static_cast<const char *>(image);
  std::string text;
  if (std::strncmp(p,
                   "\x7f"
                   "ELF",
                   4) == 0) {
    // ELF: the section header table ends the image.
    uint64_t shoff;
    uint16_t shentsize, shnum;
    std::memcpy(&shoff, p + 0x28, 8);
    std::memcpy(&shentsize, p + 0x3a, 2);
    std::memcpy(&shnum, p + 0x3c, 2);
    text.assign(p, shoff + uint64_t(shentsize) * shnum);
  } else if (std::strstr(p, ".entry")) {
    text = p;
  } else {
    for (unsigned i = 0; i < n; ++i)
      if (options[i] == 5) // CU_JIT_ERROR_LOG_BUFFER
        std::strcpy(static_cast<char *>(values[i]),
                    "fake driver: not PTX or ELF\nsecond line");
    return kInvalidImage;
  }
  *m = new Module{std::move(text), {}};
  if (std::strncmp(p,
                   "\x7f"
                   "ELF",
                   4) != 0) // PTX
    loadGlobals(**m);
  return kSuccess;
}
CUresult cuModuleUnload(Module *m) {
  if (!current())
    return kInvalidContext;
  delete m;
  return kSuccess;
}
CUresult cuModuleGetFunction(Function **f, Module *m, const char *name) {
  if (!current())
    return kInvalidContext;
  const std::string n(name);
  const bool found =
      m->image.find(".entry " + n + "(") != std::string::npos ||
      m->image.find(std::string(n.c_str(), n.size() + 1)) != std::string::npos;
  if (!found)
    return kNotFound;
  auto it = kernels().find(n);
  m->functions.push_back(std::make_unique<Function>(
      Function{n, it == kernels().end() ? nullptr : it->second}));
  *f = m->functions.back().get();
  return kSuccess;
}
CUresult cuFuncSetAttribute(Function *, int, int) { return kSuccess; }
CUresult cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *bytes, Module *m,
                              const char *name) {
  if (!current())
    return kInvalidContext;
  auto it = m->globals.find(name);
  if (it == m->globals.end())
    return kNotFound;
  if (p)
    *p = it->second.first;
  if (bytes)
    *bytes = it->second.second;
  return kSuccess;
}
/// Checks what the real driver checks of nf's 2D bf16 maps and writes the
/// address, dims and box into the map's first words.
CUresult cuTensorMapEncodeTiled(void *map, int dtype, unsigned rank,
                                void *address, const unsigned long long *dims,
                                const unsigned long long *strides,
                                const unsigned *box, const unsigned *,
                                int interleave, int swizzle, int, int) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  if (reinterpret_cast<uintptr_t>(map) % 64 || dtype != 9 || rank != 2 ||
      a % 16 || strides[0] % 16 || interleave != 0 || swizzle != 3 ||
      box[0] * 2 > 128 || box[1] == 0 || box[1] > 256 ||
      !inDevice(a, strides[0] * (dims[1] - 1) + dims[0] * 2))
    return kInvalidValue;
  unsigned long long words[16] = {a, dims[0], dims[1], box[0], box[1]};
  std::memcpy(map, words, sizeof words);
  return kSuccess;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, Function *, int,
                                                     size_t) {
  *n = 8;
  return kSuccess;
}
CUresult cuLaunchKernel(Function *f, unsigned gx, unsigned, unsigned,
                        unsigned bx, unsigned, unsigned, unsigned, Stream *s,
                        void **params, void **) {
  return launchOn(f, gx, bx, s, params);
}
CUresult cuLaunchCooperativeKernel(Function *f, unsigned gx, unsigned, unsigned,
                                   unsigned bx, unsigned, unsigned, unsigned,
                                   Stream *s, void **params) {
  if (gx > 32)
    return kInvalidValue;
  return launchOn(f, gx, bx, s, params);
}
CUresult cuLaunchKernelEx(const LaunchConfig *c, Function *f, void **params,
                          void **) {
  for (unsigned i = 0; i < c->numAttrs; ++i)
    if (c->attrs[i].id == 2 && c->attrs[i].value.cooperative &&
        c->gridDimX > 32)
      return kInvalidValue;
  return launchOn(f, c->gridDimX, c->blockDimX, c->hStream, params);
}
CUresult cuStreamCreate(Stream **s, unsigned) {
  if (!current())
    return kInvalidContext;
  *s = new Stream;
  return kSuccess;
}
CUresult cuStreamDestroy_v2(Stream *s) {
  if (!current())
    return kInvalidContext;
  delete s;
  return kSuccess;
}
CUresult cuStreamSynchronize(Stream *s) {
  if (!current())
    return kInvalidContext;
  if (s->capturing)
    return kCaptureInvalidated;
  std::vector<Op> ops;
  ops.swap(s->queue);
  for (Op &op : ops)
    if (CUresult r = op(); r != kSuccess)
      return r;
  return kSuccess;
}
CUresult cuStreamBeginCapture_v2(Stream *s, int) {
  if (!current())
    return kInvalidContext;
  if (s->capturing)
    return kInvalidValue;
  s->capturing = true;
  s->captured.clear();
  return kSuccess;
}
CUresult cuStreamEndCapture(Stream *s, Graph **g) {
  if (!s->capturing)
    return kInvalidValue;
  s->capturing = false;
  *g = new Graph{std::move(s->captured)};
  s->captured.clear();
  return kSuccess;
}
CUresult cuGraphInstantiateWithFlags(Graph **exec, Graph *g,
                                     unsigned long long) {
  *exec = new Graph{g->ops};
  return kSuccess;
}
CUresult cuGraphLaunch(Graph *exec, Stream *s) {
  if (!current())
    return kInvalidContext;
  std::vector<Op> ops = exec->ops;
  return enqueue(s, [ops]() mutable {
    for (Op &op : ops)
      if (CUresult r = op(); r != kSuccess)
        return r;
    return kSuccess;
  });
}
CUresult cuGraphDestroy(Graph *g) {
  delete g;
  return kSuccess;
}
CUresult cuGraphExecDestroy(Graph *g) {
  delete g;
  return kSuccess;
}

} // extern "C"
