// Helpers shared by the fuzz targets of test/fuzz.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <unistd.h>
#include <vector>

namespace nf::fuzz {

/// A directory of this process (under /dev/shm when it exists: no disk
/// writes per input), removed at exit. Entry points that only read files are
/// fuzzed by writing each input there.
class ScratchDir {
public:
  ScratchDir() {
    namespace fs = std::filesystem;
    std::string base = "/tmp";
    if (const char *t = std::getenv("TMPDIR"); t && *t)
      base = t;
    std::error_code ec;
    if (fs::is_directory("/dev/shm", ec) && access("/dev/shm", W_OK) == 0)
      base = "/dev/shm";
    std::string pattern = base + "/nf-fuzz-XXXXXX";
    if (!mkdtemp(pattern.data())) {
      std::perror(("nf fuzz: mkdtemp " + pattern).c_str());
      std::abort();
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir &) = delete;
  ScratchDir &operator=(const ScratchDir &) = delete;

  const std::string &path() const { return path_; }

  /// Empties the directory (what the previous input left).
  void clear() const {
    std::error_code ec;
    for (const auto &e : std::filesystem::directory_iterator(path_, ec))
      std::filesystem::remove_all(e.path(), ec);
  }

  /// Writes `bytes` to `name` in the directory; returns the path.
  std::string write(const std::string &name, std::string_view bytes) const {
    std::string p = path_ + "/" + name;
    FILE *f = std::fopen(p.c_str(), "wb");
    if (!f) {
      std::perror(("nf fuzz: " + p).c_str());
      std::abort();
    }
    if (!bytes.empty() &&
        std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
      std::perror(("nf fuzz: " + p).c_str());
      std::abort();
    }
    std::fclose(f);
    return p;
  }

private:
  std::string path_;
};

/// One per process; a function-local static so that it is destroyed (and
/// the directory removed) at exit.
inline const ScratchDir &scratch() {
  static ScratchDir dir;
  return dir;
}

/// `data` split at every occurrence of `sep`.
inline std::vector<std::string_view> split(std::string_view data,
                                           std::string_view sep) {
  std::vector<std::string_view> parts;
  size_t at = 0;
  while (true) {
    size_t next = data.find(sep, at);
    if (next == std::string_view::npos) {
      parts.push_back(data.substr(at));
      return parts;
    }
    parts.push_back(data.substr(at, next - at));
    at = next + sep.size();
  }
}

/// Aborts with `what` (a property of a successful result that does not
/// hold): libFuzzer records the input as a crash.
[[noreturn]] inline void violated(const std::string &what) {
  std::fprintf(stderr, "nf fuzz: property violated: %s\n", what.c_str());
  std::abort();
}

/// nf's error convention (nf/status.h): one line that starts with the
/// input's name. An error message that breaks it is a bug like a crash.
inline void checkError(const std::string &message, std::string_view source) {
  if (message.empty())
    violated("an error without a message");
  if (message.find('\n') != std::string::npos)
    violated("an error of more than one line: " + message);
  if (!source.empty() && message.rfind(source, 0) != 0)
    violated("an error that does not name '" + std::string(source) +
             "' first: " + message);
}

} // namespace nf::fuzz
