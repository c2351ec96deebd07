// What every backend of nf::Engine reads of a plan the same way, and the
// host-side bookkeeping of a step they share: model facts, the storage table
// (state slots, KV pages), the values of a step program, op attributes, step
// validation with KV page reservation, and the split of a step into runs of
// at most max_tokens rows. Factored out of the CPU backend so that the CUDA
// backend checks, numbers and batches exactly as it does. Internal.
#pragma once

#include "engine/caches.h"
#include "engine/engine.h"
#include "engine/plan_loader.h"
#include "nf/plan_attrs.h"
#include "nf/plan_ops.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace nf::engine {

// ---------------------------------------------------------------------------
// Model facts

/// ModelInfo from the plan's config (name, vocabulary, tokens per step,
/// expert policy, weights directory); checks the vocabulary size. Leaves the
/// storage-, MoE- and backend-dependent fields alone.
Status readModelInfo(const PlanFile &plan, const BoundWeights &weights,
                     ModelInfo &info);

// ---------------------------------------------------------------------------
// Storage (recurrent state and KV cache)

struct StorageInfo {
  nf::plan::StorageKind kind = nf::plan::StorageKind::MambaState;
  int32_t ordinal = 0; // index among the storages of its kind
  cpu::MambaShape mamba;
  cpu::KvLayerShape kv;
  int64_t pageSize = 0, numPages = 0, slots = 0;
};

struct StorageLayout {
  std::vector<StorageInfo> entries;   // per Plan.storage entry
  std::vector<cpu::MambaShape> mamba; // MambaState entries, in order
  std::vector<cpu::KvLayerShape> kv;  // KVCache entries, in order
  cpu::CacheConfig cache;             // slots, pages (options applied)
  bool hasAttention = false;
  int64_t maxContext = -1; // pages * page size, -1: unlimited
};

/// Checks the plan's Storage table and applies EngineOptions::maxSequences
/// and kvPages (sequence slots default to the plan's slots, else
/// `defaultSlots`). `backendName` names the backend in "not supported"
/// errors ("CPU", "CUDA"). Both backends hold every KV cache element type
/// (cpu::KvStorage).
/// ModelInfo's stateBytesPerSequence and kvBytesPerPage for `layout`:
/// `typedKv`, the KV cache stored in its own type (the CUDA layout,
/// cpu::kvPageBytes), else f32 values (the CPU backend).
void setSequenceMemory(const StorageLayout &layout, bool typedKv,
                       ModelInfo &info);

StatusOr<StorageLayout> readStorage(const PlanFile &plan,
                                    const EngineOptions &options,
                                    int64_t defaultSlots,
                                    const char *backendName);

// ---------------------------------------------------------------------------
// Step programs

struct ValueInfo {
  nf::plan::ValueKind kind = nf::plan::ValueKind::Tensor;
  nf::plan::DType dtype = nf::plan::DType::F32;
  nf::plan::Rows rows = nf::plan::Rows::None;
  std::vector<int64_t> shape;
  int64_t cols = 0; // elements per row (all elements when rows == None)
  int64_t offset = -1;
  int64_t bytes = 0;
  int32_t weight = -1;
  int32_t numExperts = 0;
  int32_t maxPerToken = 0;
};

/// The values of one step program and its roles, checked: kinds, dtypes,
/// shapes, arena bounds (arena_bytes + scratch_bytes), weight indices, the
/// tokens/batch/budget/logits values (logits f32 [tokens, vocab]).
struct StepValues {
  std::string phase;
  std::vector<ValueInfo> values;
  int32_t tokens = -1, batch = -1, budget = -1, logits = -1;
  int64_t maxTokens = 0, arenaBytes = 0, scratchBytes = 0;
};

/// Fills `prog` from `step`; errors name the plan, the phase and the value.
Status readStepValues(const PlanFile &plan, const nf::plan::Step *step,
                      const char *phase, int64_t numWeights, int64_t vocabSize,
                      StepValues &prog);

// Op attributes: nf/plan_attrs.h (shared with the compiler).
using nf::plan::floatAttr;
using nf::plan::intAttr;
using nf::plan::listAttr;
using nf::plan::stringAttr;
namespace attr = nf::plan::attr;

// ---------------------------------------------------------------------------
// Sequences

/// The sequences of an engine: the ids addSequence hands out (never reused)
/// and each one's state slot in the engine's cpu::Caches (lengths, KV page
/// tables; the CPU engine's state itself).
class SequenceTable {
public:
  explicit SequenceTable(cpu::Caches &caches) : caches_(caches) {}

  /// A new sequence in a free slot. `prepare(slot)` (the CUDA engine clears
  /// the slot's device state) runs before the id is handed out; when it
  /// fails, the slot is freed again and its error returned.
  StatusOr<int32_t>
  add(int64_t maxSequences,
      const std::function<Status(int32_t slot)> &prepare = {});
  /// A new sequence continuing from sequence `id` (cpu::Caches::fork).
  /// `copy(fork)` (the CUDA engine copies the state and the partial page
  /// on the device) runs before the id is handed out; when it fails, the
  /// new sequence is removed again and its error returned.
  StatusOr<int32_t> fork(int32_t id,
                         const std::function<Status(const cpu::Caches::Fork &,
                                                    int32_t from)> &copy = {});
  Status remove(int32_t id);
  /// Tokens of the sequence processed so far; -1 for an unknown id.
  int64_t length(int32_t id) const;
  /// The slot of `id`; nullopt for an unknown id.
  std::optional<int32_t> slot(int32_t id) const;
  /// Slots and KV pages in use (KV fields 0 without attention).
  CacheUsage usage(bool hasAttention) const;
  /// KV pages only the given sequences hold (unknown ids are skipped).
  int64_t exclusivePages(std::span<const int32_t> ids) const;

private:
  cpu::Caches &caches_;
  std::unordered_map<int32_t, int32_t> slotOf_;
  int32_t nextId_ = 0;
};

// ---------------------------------------------------------------------------
// Steps

/// A validated step.
struct StepRows {
  std::vector<int32_t> slots;     // per input
  std::vector<int64_t> tokenBase; // per input + 1: first token in the step
  bool allOne = true;             // every input has one token (decode)
  int64_t rows = 0;               // logits rows to return
};

/// The checks of Engine::step (unknown or repeated sequence, no tokens,
/// token outside the vocabulary, expertsPerToken outside [0,
/// maxExpertsOverride], bad budget, context or KV pages exhausted), then the
/// KV pages of every sequence reserved for its new length. On error nothing
/// has changed.
Status checkStep(std::span<const SequenceInput> inputs, LogitsFor which,
                 const ModelInfo &info, int32_t maxExpertsOverride,
                 bool hasAttention, const SequenceTable &sequences,
                 cpu::Caches &caches, StepRows &out);

/// Part of one input in a run of a step program.
struct Chunk {
  int32_t input = 0; // index into the step's inputs
  int64_t first = 0; // first token of the input in this chunk
  int64_t count = 0; // tokens
  int64_t row = 0;   // first row in the run
  bool last = false; // holds the input's last token
};

/// The step as runs of at most `maxRows` rows, inputs in order; an input
/// larger than the room left is split, and the run ends there (a sequence
/// split across runs continues from its state in the next one).
std::vector<std::vector<Chunk>>
splitIntoRuns(std::span<const SequenceInput> inputs, int64_t maxRows);

} // namespace nf::engine
