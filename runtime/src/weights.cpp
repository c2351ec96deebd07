#include "weights.h"
#include "nf/file.h"

#include <cerrno>
#include <fcntl.h>
#include <new>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace nf {

int64_t WeightView::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

int64_t WeightView::cols() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i)
    n *= shape[i];
  return n;
}

WeightView WeightView::slice(int64_t begin, int64_t count) const {
  WeightView v = *this;
  v.data = static_cast<const char *>(data) +
           static_cast<size_t>(begin * cols()) * elementSize();
  if (!v.shape.empty())
    v.shape[0] = count;
  return v;
}

WeightView WeightView::at(int64_t index) const {
  WeightView v = slice(index, 1);
  if (!v.shape.empty())
    v.shape.erase(v.shape.begin());
  return v;
}

std::vector<WeightView> splitExperts(const WeightView &stacked) {
  std::vector<WeightView> out;
  for (int64_t e = 0; e < stacked.rows(); ++e)
    out.push_back(stacked.at(e));
  return out;
}

namespace {
/// n 16-bit values from p (any alignment) to f32 by `widen`.
template <class Widen>
void widen16(const char *p, int64_t n, float *out, Widen widen) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    out[i] = widen(v);
  }
}
} // namespace

void convertToF32(const WeightView &w, int64_t begin, int64_t n, float *out) {
  const char *base = static_cast<const char *>(w.data);
  switch (w.dtype) {
  case DType::F32:
    std::memcpy(out, base + 4 * begin, static_cast<size_t>(n) * 4);
    return;
  case DType::BF16:
    widen16(base + 2 * begin, n, out, [](uint16_t v) { return bf16ToF32(v); });
    return;
  case DType::F16:
    widen16(base + 2 * begin, n, out, [](uint16_t v) { return f16ToF32(v); });
    return;
  default:
    for (int64_t i = 0; i < n; ++i)
      out[i] = 0.0f;
  }
}

// ---------------------------------------------------------------------------
// MappedFile

static std::string errnoText(int err) {
  return std::string(std::strerror(err));
}

StatusOr<MappedFile> MappedFile::open(const std::string &path) {
  // InputFile refuses FIFOs and devices: mapping /dev/zero would "succeed",
  // and opening a FIFO would wait for a writer.
  StatusOr<InputFile> file = InputFile::open(path);
  if (!file)
    return file.status();
  MappedFile m;
  m.path_ = path;
  m.size_ = static_cast<size_t>(file->size());
  if (m.size_ == 0)
    return Status::error(path + ": file is empty");
  void *addr = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, file->fd(), 0);
  if (addr == MAP_FAILED)
    return Status::error(path + ": mmap of " + std::to_string(m.size_) +
                         " bytes failed: " + errnoText(errno));
  // The mapping keeps the file alive; the descriptor closes with `file`.
  m.addr_ = addr;
  return m;
}

MappedFile::MappedFile(MappedFile &&o) noexcept
    : path_(std::move(o.path_)), addr_(o.addr_), size_(o.size_), fd_(o.fd_) {
  o.addr_ = nullptr;
  o.size_ = 0;
  o.fd_ = -1;
}

MappedFile &MappedFile::operator=(MappedFile &&o) noexcept {
  if (this != &o) {
    reset();
    path_ = std::move(o.path_);
    addr_ = o.addr_;
    size_ = o.size_;
    fd_ = o.fd_;
    o.addr_ = nullptr;
    o.size_ = 0;
    o.fd_ = -1;
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() noexcept {
  // Failures here cannot be reported (destructor path); they would only leak
  // address space or a descriptor.
  if (addr_)
    (void)::munmap(addr_, size_);
  if (fd_ >= 0)
    (void)::close(fd_);
  addr_ = nullptr;
  size_ = 0;
  fd_ = -1;
}

// ---------------------------------------------------------------------------
// WeightStore

Status WeightStore::addFile(const std::string &path,
                            const std::map<std::string, TensorInfo> &tensors) {
  StatusOr<MappedFile> mf = MappedFile::open(path);
  if (!mf)
    return mf.status();
  auto owned = std::make_unique<MappedFile>(std::move(*mf));
  const uint8_t *base = owned->data();
  for (const auto &[name, info] : tensors) {
    if (info.file != path)
      continue;
    if (info.dataEnd > owned->size() || info.dataBegin > info.dataEnd)
      return Status::error(path + ": tensor '" + name +
                           "' lies outside the file (file changed while "
                           "being opened?)");
    const uint8_t *p = base + info.dataBegin;
    const size_t align = dtypeSize(info.dtype);
    if (align > 1 && reinterpret_cast<uintptr_t>(p) % align != 0) {
      const size_t n = info.dataEnd - info.dataBegin;
      std::unique_ptr<uint8_t[]> copy(new (std::nothrow) uint8_t[n ? n : 1]);
      if (!copy)
        return Status::error(path +
                             ": out of memory copying misaligned "
                             "tensor '" +
                             name + "'");
      std::memcpy(copy.get(), p, n);
      p = copy.get();
      alignedCopies_.push_back(std::move(copy));
    }
    tensors_[name] = info;
    data_[name] = p;
  }
  files_.push_back(std::move(owned));
  return Status::success();
}

StatusOr<WeightStore> WeightStore::openFile(const std::string &path) {
  try {
    StatusOr<SafetensorsFile> header = readSafetensorsHeader(path);
    if (!header)
      return header.status();
    WeightStore ws;
    ws.where_ = path;
    std::map<std::string, TensorInfo> tensors = header->tensors;
    for (auto &[name, info] : tensors)
      info.file = path;
    if (Status s = ws.addFile(path, tensors); !s)
      return s;
    return ws;
  } catch (const std::exception &e) {
    return Status::error(path + ": " + e.what());
  }
}

StatusOr<WeightStore> WeightStore::openCheckpoint(const std::string &dir) {
  try {
    StatusOr<Checkpoint> ckpt = nf::openCheckpoint(dir);
    if (!ckpt)
      return ckpt.status();
    WeightStore ws;
    ws.where_ = dir;
    for (const std::string &f : ckpt->files)
      if (Status s = ws.addFile(f, ckpt->tensors); !s)
        return s;
    return ws;
  } catch (const std::exception &e) {
    return Status::error(dir + ": " + e.what());
  }
}

WeightStore WeightStore::inMemory(const std::string &where) {
  WeightStore ws;
  ws.where_ = where;
  return ws;
}

void WeightStore::addView(const std::string &name, DType dtype,
                          const std::vector<int64_t> &shape,
                          const uint8_t *data) {
  TensorInfo info;
  info.name = name;
  info.dtype = dtype;
  info.shape = shape;
  info.file = where_;
  tensors_[name] = std::move(info);
  data_[name] = data;
}

StatusOr<WeightView> WeightStore::find(const std::string &name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    return Status::error(where_ + ": no tensor '" + name + "'");
  WeightView v;
  v.data = data_.at(name);
  v.dtype = it->second.dtype;
  v.shape = it->second.shape;
  return v;
}

} // namespace nf
