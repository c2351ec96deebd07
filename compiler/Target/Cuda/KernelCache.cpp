//===- KernelCache.cpp - content-addressed NVRTC output cache -------------===//

#include "Target/Cuda/KernelCache.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/SHA256.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace nf::codegen {

namespace fs = std::filesystem;

std::string sha256Hex(std::string_view data) {
  llvm::SHA256 h;
  h.update(llvm::StringRef(data.data(), data.size()));
  auto digest = h.final();
  return llvm::toHex(digest, /*LowerCase=*/true);
}

std::string KernelCache::defaultDirectory() {
  if (const char *env = std::getenv("NF_KERNEL_CACHE")) {
    std::string v = env;
    if (v.empty() || v == "0" || v == "off" || v == "OFF")
      return "";
    return v;
  }
  if (const char *xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return (fs::path(xdg) / "nf" / "kernels").string();
  if (const char *home = std::getenv("HOME"); home && *home)
    return (fs::path(home) / ".cache" / "nf" / "kernels").string();
  return "";
}

std::string KernelCache::path(const std::string &key,
                              const std::string &ext) const {
  return (fs::path(dir_) / key.substr(0, 2) / (key + ext)).string();
}

std::optional<std::string> KernelCache::load(const std::string &key,
                                             const std::string &ext) const {
  if (!enabled())
    return std::nullopt;
  std::ifstream in(path(key, ext), std::ios::binary);
  if (!in)
    return std::nullopt;
  std::ostringstream data;
  data << in.rdbuf();
  if (!in.good() && !in.eof())
    return std::nullopt;
  return std::move(data).str();
}

void KernelCache::store(const std::string &key, const std::string &ext,
                        std::string_view data) const {
  if (!enabled())
    return;
  std::error_code ec;
  const fs::path final = path(key, ext);
  fs::create_directories(final.parent_path(), ec);
  if (ec)
    return;
  static std::atomic<unsigned> counter{0};
  const fs::path tmp = final.string() + ".tmp." + std::to_string(::getpid()) +
                       "." + std::to_string(counter.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return;
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.flush();
    if (!out) {
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, final, ec);
  if (ec)
    fs::remove(tmp, ec);
}

} // namespace nf::codegen
