// Fuzz target: safetensors headers and sharded checkpoints
// (runtime/src/safetensors.cpp), and the runtime's mapping of them
// (WeightStore, runtime/src/weights.cpp).
//
// The input is a small archive of files: records separated by the line
// "%%FILE%%", each "<file name>\n<contents>". They are written to a scratch
// directory, then every file is read as a safetensors header and mapped,
// and the directory is opened as a checkpoint (model.safetensors, or
// model.safetensors.index.json and the shards it names). Names other than
// [A-Za-z0-9._-]{1,64} are skipped.
#include "fuzz_util.h"
#include "nf/safetensors.h"
#include "weights.h"

#include <cctype>
#include <set>

namespace {

bool plainName(std::string_view name) {
  if (name.empty() || name.size() > 64 || name == "." || name == "..")
    return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
          c == '-'))
      return false;
  return true;
}

// Reads every byte of every tensor a store hands out: a view outside the
// mapping is an ASan report (the mapping is followed by unmapped memory or
// the report of a wild read).
void touch(const nf::WeightStore &store) {
  volatile uint8_t sink = 0;
  for (const auto &[name, info] : store.tensors()) {
    nf::StatusOr<nf::WeightView> v = store.find(name);
    if (!v) {
      nf::fuzz::checkError(v.message(), "");
      continue;
    }
    const size_t bytes =
        static_cast<size_t>(v->numElements()) * v->elementSize();
    if (bytes != info.dataEnd - info.dataBegin)
      nf::fuzz::violated("view of '" + name + "' has " + std::to_string(bytes) +
                         " bytes, header says " +
                         std::to_string(info.dataEnd - info.dataBegin));
    const auto *p = static_cast<const uint8_t *>(v->data);
    for (size_t i = 0; i < bytes; ++i)
      sink = sink + p[i];
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const auto &dir = nf::fuzz::scratch();
  dir.clear();
  std::set<std::string> written;
  for (std::string_view rec : nf::fuzz::split(
           std::string_view(reinterpret_cast<const char *>(data), size),
           "%%FILE%%\n")) {
    size_t nl = rec.find('\n');
    if (nl == std::string_view::npos)
      continue;
    std::string name(rec.substr(0, nl));
    if (!plainName(name) || written.count(name))
      continue;
    dir.write(name, rec.substr(nl + 1));
    written.insert(name);
  }

  for (const std::string &name : written) {
    const std::string path = dir.path() + "/" + name;
    nf::StatusOr<nf::SafetensorsFile> f = nf::readSafetensorsHeader(path);
    if (!f) {
      nf::fuzz::checkError(f.message(), path);
      continue;
    }
    for (const auto &[tname, t] : f->tensors)
      if (t.dataBegin < f->dataOffset || t.dataEnd > f->fileSize ||
          t.dataEnd < t.dataBegin)
        nf::fuzz::violated("tensor '" + tname + "' outside the file");
    nf::StatusOr<nf::WeightStore> store = nf::WeightStore::openFile(path);
    if (!store) {
      nf::fuzz::checkError(store.message(), "");
      continue;
    }
    touch(*store);
  }

  nf::StatusOr<nf::Checkpoint> ckpt = nf::openCheckpoint(dir.path());
  if (!ckpt) {
    nf::fuzz::checkError(ckpt.message(), dir.path());
    return 0;
  }
  nf::StatusOr<nf::WeightStore> store =
      nf::WeightStore::openCheckpoint(dir.path());
  if (!store) {
    nf::fuzz::checkError(store.message(), "");
    return 0;
  }
  touch(*store);
  return 0;
}
