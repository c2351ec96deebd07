//===- KernelCache.h - content-addressed NVRTC output cache ----*- C++ -*-===//
//
// Compiled kernels are cached by the SHA-256 of everything that determines
// the compiler's output: the generated source, the embedded kernels/*
// headers, the target architecture, the NVRTC version and the options. A
// recompile of an unchanged model therefore skips NVRTC entirely.
//
// Directory: $NF_KERNEL_CACHE if set (empty, "0" or "off" disable the
// cache), else $XDG_CACHE_HOME/nf/kernels, else $HOME/.cache/nf/kernels.
// Layout: <dir>/<key[0:2]>/<key>.cubin and <key>.ptx, written atomically
// (temporary file + rename), so concurrent nfc runs may share a directory.
// Entries are never evicted; deleting the directory (or any file in it) is
// always safe. A cache that cannot be read or written is skipped silently.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <string_view>

namespace nf::codegen {

/// Lower-case hex SHA-256 of `data`.
std::string sha256Hex(std::string_view data);

class KernelCache {
public:
  /// The directory the environment selects ("" = disabled).
  static std::string defaultDirectory();

  explicit KernelCache(std::string directory) : dir_(std::move(directory)) {}

  bool enabled() const { return !dir_.empty(); }
  const std::string &directory() const { return dir_; }

  /// The entry `key` + `ext` (".cubin", ".ptx"), if present.
  std::optional<std::string> load(const std::string &key,
                                  const std::string &ext) const;
  /// Best effort: failures leave the cache without the entry.
  void store(const std::string &key, const std::string &ext,
             std::string_view data) const;

  std::atomic<int> hits{0}, misses{0};

private:
  std::string path(const std::string &key, const std::string &ext) const;
  std::string dir_;
};

} // namespace nf::codegen
