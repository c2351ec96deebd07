// Fuzz target: config.json parsing (compiler/hf, no MLIR) and the binding of
// the parsed model to a checkpoint. The input is the config.json text; a
// config that parses is bound to the tiny-hybrid fixture's tensors, which
// runs every shape computation on the (hostile) hyperparameters.
#include "fuzz_util.h"
#include "hf/HFConfig.h"

#include <cstdio>
#include <cstdlib>

namespace {

const nf::Checkpoint &checkpoint() {
  static const nf::Checkpoint ckpt = [] {
    auto c =
        nf::openCheckpoint(NF_SOURCE_DIR "/test/data/fixtures/tiny-hybrid");
    if (!c) {
      std::fprintf(stderr, "nf fuzz: %s\n", c.message().c_str());
      std::abort();
    }
    return std::move(*c);
  }();
  return ckpt;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  const std::string source = "config.json";
  nf::StatusOr<nf::hf::ModelConfig> config =
      nf::hf::parseConfigText(text, source);
  if (!config) {
    nf::fuzz::checkError(config.message(), source);
    return 0;
  }
  nf::StatusOr<nf::hf::ModelBinding> binding =
      nf::hf::bindCheckpoint(*config, checkpoint());
  if (!binding)
    nf::fuzz::checkError(binding.message(), "");
  return 0;
}
