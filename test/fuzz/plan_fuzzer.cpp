// Fuzz target: the plan loader (runtime/src/engine): the file checks and
// flatbuffers verification of openPlan, the storage and step-program checks,
// weight binding and the CPU backend's checks of every op, then one prefill
// and one decode step of the loaded plan. The checks must make every plan
// that loads safe to run, so the steps run too.
//
// The input is a plan file (.nfb). Its weights come from the test fixture
// its config.checkpoint names (test/data/fixtures/<name>; tiny-hybrid when
// it names none of them). A plan whose arena and caches would take more
// than 256 MiB is not loaded: a plan may rightly ask for gigabytes, and
// under ASan an allocation that fails is a crash, not std::bad_alloc.
#include "engine/engine.h"
#include "engine/plan_common.h"
#include "engine/plan_loader.h"
#include "fuzz_util.h"

#include <algorithm>
#include <filesystem>

namespace {

namespace pl = nf::plan;

std::string fixtureDir(const pl::Plan &plan) {
  std::string name = "tiny-hybrid";
  if (plan.config() && plan.config()->checkpoint()) {
    std::string base = std::filesystem::path(plan.config()->checkpoint()->str())
                           .filename()
                           .string();
    for (const char *f : {"tiny-hybrid", "tiny-hybrid-bf16", "tiny-dense",
                          "tiny-nano", "tiny-latent"})
      if (base == f)
        name = f;
  }
  return NF_SOURCE_DIR "/test/data/fixtures/" + name;
}

// Bytes of the arena and the caches the CPU engine would allocate, as a
// double (no overflow on hostile sizes).
double memoryNeeded(const pl::Plan &plan, int64_t slots, int64_t kvPages) {
  double bytes = 0;
  for (const pl::Step *s : {plan.prefill(), plan.decode()})
    bytes = std::max(bytes, static_cast<double>(s->arena_bytes()) +
                                static_cast<double>(s->scratch_bytes()));
  if (plan.storage())
    for (const pl::Storage *s : *plan.storage()) {
      const double state = static_cast<double>(s->num_heads()) * s->head_dim() *
                               s->state_size() +
                           static_cast<double>(s->conv_dim()) *
                               (static_cast<double>(s->conv_window()) + 1);
      const double kv =
          2.0 * s->kv_heads() * s->head_dim() * s->page_size() * kvPages;
      bytes += 4 * (std::abs(state) * slots + std::abs(kv));
    }
  return bytes;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const auto &dir = nf::fuzz::scratch();
  const std::string path = dir.write(
      "plan.nfb", std::string_view(reinterpret_cast<const char *>(data), size));

  auto plan = nf::engine::openPlan(path);
  if (!plan) {
    nf::fuzz::checkError(plan.message(), path);
    return 0;
  }
  nf::EngineOptions options;
  options.backend = "cpu";
  options.numThreads = 1;
  // Two sequences and a small KV cache (the plans' defaults hold thousands
  // of tokens; filling those dominated the time per input).
  options.maxSequences = 2;
  options.kvPages = 4;
  options.weightsDir = fixtureDir(*(*plan)->plan);
  if (memoryNeeded(*(*plan)->plan, options.maxSequences, options.kvPages) >
      256.0 * (1 << 20))
    return 0;
  plan->reset();

  auto engine = nf::Engine::load(path, options);
  if (!engine) {
    nf::fuzz::checkError(engine.message(), "");
    return 0;
  }
  nf::Engine &e = **engine;
  const int64_t vocab = e.info().vocabSize;
  auto seq = e.addSequence();
  if (!seq) {
    nf::fuzz::checkError(seq.message(), "");
    return 0;
  }
  std::vector<int32_t> prompt;
  for (int32_t t = 1; t <= 3; ++t)
    prompt.push_back(static_cast<int32_t>(t % vocab));
  std::vector<float> logits;
  for (int round = 0; round < 2; ++round) {
    nf::SequenceInput in;
    in.sequence = *seq;
    in.tokens = round == 0 ? std::span<const int32_t>(prompt)
                           : std::span<const int32_t>(prompt).first(1);
    nf::Status s =
        e.step({&in, 1}, nf::LogitsFor::LastTokenPerSequence, logits);
    if (!s) {
      nf::fuzz::checkError(s.message(), "");
      return 0;
    }
    if (static_cast<int64_t>(logits.size()) != vocab)
      nf::fuzz::violated("a step returned " + std::to_string(logits.size()) +
                         " logits for a vocabulary of " +
                         std::to_string(vocab));
  }
  return 0;
}
