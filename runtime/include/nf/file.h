// Reading untrusted input files: every file nf reads (config.json, the
// checkpoint index, safetensors headers, tokenizer files, chat templates, the
// plan) is opened here, so that a FIFO, a device or a huge file gives one
// error line instead of a hang or an exhausted memory.
#pragma once

#include "nf/status.h"

#include <cstdint>
#include <string>

namespace nf {

/// The most bytes read whole from a JSON or text file. Real tokenizer.json
/// files are 10-20 MB; a larger file is certainly not one nf should parse.
inline constexpr uint64_t kMaxTextFileBytes = 256ull << 20;

/// A regular file opened for reading.
class InputFile {
public:
  /// Opens `path`. Anything but a regular file is refused: a directory with
  /// "<path>: cannot open: Is a directory", anything else with "<path>: not a
  /// regular file (a FIFO)". The open never blocks (O_NONBLOCK), so a FIFO
  /// with no writer is refused rather than waited on.
  static StatusOr<InputFile> open(const std::string &path);

  InputFile(InputFile &&o) noexcept;
  InputFile &operator=(InputFile &&o) noexcept;
  InputFile(const InputFile &) = delete;
  InputFile &operator=(const InputFile &) = delete;
  ~InputFile();

  const std::string &path() const { return path_; }
  int fd() const { return fd_; }
  /// The size when opened.
  uint64_t size() const { return size_; }
  /// Reads exactly `n` bytes from the current position.
  Status read(void *dst, size_t n);

private:
  InputFile() = default;
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// `s` with control characters written as \xNN, so that an error message
/// quoting untrusted bytes (a file name, a JSON string) stays on one line.
std::string printable(const std::string &s);

/// The contents of `path`, refused with "<path>: file is too large (N bytes;
/// the limit is M)" beyond `maxBytes`.
StatusOr<std::string> readWholeFile(const std::string &path,
                                    uint64_t maxBytes = kMaxTextFileBytes);

/// `dir`/`name` for a file name read from an untrusted list (the weight_map
/// of model.safetensors.index.json, the weight files of a plan). The name must
/// stay inside `dir`: absolute names, names with a ".." component and empty
/// names are refused with "<source>: <what> '<name>' is not a file name
/// inside the checkpoint directory". Symbolic links are followed: the
/// Hugging Face cache keeps every file of a snapshot as a link into
/// ../../blobs, and a link is placed by whoever controls the directory.
StatusOr<std::string> pathInside(const std::string &dir,
                                 const std::string &name,
                                 const std::string &source,
                                 const std::string &what);

} // namespace nf
