// Opening and reading untrusted input files (see nf/file.h).
#include "nf/file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace nf {

namespace {

Status fail(const std::string &path, const std::string &what) {
  return Status::error(path + ": " + what);
}

std::string errnoText(int err) { return std::strerror(err); }

// Why `mode` is not acceptable, or empty when it is a regular file.
std::string notRegular(mode_t mode) {
  if (S_ISREG(mode))
    return {};
  if (S_ISDIR(mode))
    return "cannot open: Is a directory";
  const char *kind = S_ISFIFO(mode)   ? "a FIFO"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                                      : "an unknown file type";
  return std::string("not a regular file (") + kind + ")";
}

} // namespace

StatusOr<InputFile> InputFile::open(const std::string &path) {
  // stat first, so that devices are never opened at all; O_NONBLOCK and the
  // fstat below close the window where the path is replaced in between.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return fail(path, "cannot open: " + errnoText(errno));
  if (std::string why = notRegular(st.st_mode); !why.empty())
    return fail(path, why);
  InputFile f;
  f.path_ = path;
  do
    f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  while (f.fd_ < 0 && errno == EINTR);
  if (f.fd_ < 0)
    return fail(path, "cannot open: " + errnoText(errno));
  if (::fstat(f.fd_, &st) != 0)
    return fail(path, "cannot open: " + errnoText(errno));
  if (std::string why = notRegular(st.st_mode); !why.empty())
    return fail(path, why);
  int flags = ::fcntl(f.fd_, F_GETFL);
  if (flags < 0 || ::fcntl(f.fd_, F_SETFL, flags & ~O_NONBLOCK) != 0)
    return fail(path, "cannot open: " + errnoText(errno));
  f.size_ = static_cast<uint64_t>(st.st_size);
  return f;
}

InputFile::InputFile(InputFile &&o) noexcept
    : path_(std::move(o.path_)), fd_(o.fd_), size_(o.size_) {
  o.fd_ = -1;
}

InputFile &InputFile::operator=(InputFile &&o) noexcept {
  if (this != &o) {
    if (fd_ >= 0)
      (void)::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    size_ = o.size_;
    o.fd_ = -1;
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0)
    (void)::close(fd_);
}

Status InputFile::read(void *dst, size_t n) {
  auto *p = static_cast<char *>(dst);
  while (n > 0) {
    ssize_t got = ::read(fd_, p, n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return fail(path_, "read error: " + errnoText(errno));
    if (got == 0)
      return fail(path_, "read error: unexpected end of file");
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Status::success();
}

StatusOr<std::string> readWholeFile(const std::string &path,
                                    uint64_t maxBytes) {
  StatusOr<InputFile> f = InputFile::open(path);
  if (!f)
    return f.status();
  if (f->size() > maxBytes)
    return fail(path, "file is too large (" + std::to_string(f->size()) +
                          " bytes; the limit is " + std::to_string(maxBytes) +
                          ")");
  std::string text;
  try {
    text.resize(f->size());
  } catch (const std::bad_alloc &) {
    return fail(path, "out of memory reading " + std::to_string(f->size()) +
                          " bytes");
  }
  if (Status s = f->read(text.data(), text.size()); !s)
    return s;
  return text;
}

std::string printable(const std::string &s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

StatusOr<std::string> pathInside(const std::string &dir,
                                 const std::string &name,
                                 const std::string &source,
                                 const std::string &what) {
  namespace fs = std::filesystem;
  auto refuse = [&](const std::string &shown) {
    return Status::error(source + ": " + what + " '" + shown +
                         "' is not a file name inside the checkpoint "
                         "directory");
  };
  const std::string shown = printable(name);
  // A NUL would end the path early at the system call.
  if (name.empty() || name.find('\0') != std::string::npos)
    return refuse(shown);
  fs::path p(name);
  if (p.is_absolute() || p.has_root_name() || p.has_root_directory())
    return refuse(shown);
  for (const fs::path &part : p)
    if (part == "..")
      return refuse(shown);
  return (fs::path(dir) / p).string();
}

} // namespace nf
