// The CUDA engine's steps: a program's launches (and statistics copies) into
// the stream, the decode graphs captured from them, and Engine::step: the
// step checked and split into runs, each run's arguments uploaded, its
// graph replayed or its kernels launched, the logits rows read back, the
// decode step's top logits ranked on the device (and lastTokenRow), and the
// expert statistics summed. The class is in cuda_engine_impl.h.
#include "backends/cuda/cuda_engine_impl.h"

#include "nf_abi.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

namespace nf::engine::cuda_detail {

// ---------------------------------------------------------------------------
// Enqueue and decode graphs

/// The program's kernels (and statistics copies) into the stream; `rows`:
/// rows of the select results to copy.
Status CudaEngine::enqueue(const Program &p, int64_t rows) {
  Gpu &g = *gpu_;
  CUstream stream = g.stream.get();
  const size_t R = static_cast<size_t>(layout_.maxRows);
  const size_t L = static_cast<size_t>(info_.numMoeLayers);
  size_t c = 0;
  for (size_t i = 0; i <= p.launches.size(); ++i) {
    for (; c < p.copies.size() && p.copies[c].afterLaunch == i; ++c) {
      if (g.stats.ptr() == 0)
        continue;
      const StatCopy &sc = p.copies[c];
      const CUdeviceptr counts =
          g.stats.ptr() + static_cast<size_t>(sc.layer) * R * sizeof(int32_t);
      const CUdeviceptr experts =
          g.stats.ptr() + (L * R + static_cast<size_t>(sc.layer) * R *
                                       static_cast<size_t>(maxK_)) *
                              sizeof(int32_t);
      const size_t n = static_cast<size_t>(rows);
      if (Status s = d_->check(
              d_->cuMemcpyDtoDAsync(counts, g.arena.ptr() + sc.countsOffset,
                                    n * sizeof(int32_t), stream),
              "cuMemcpyDtoDAsync");
          !s)
        return Status::error(where() + ": expert statistics: " + s.message());
      if (Status s = d_->check(
              d_->cuMemcpyDtoDAsync(
                  experts, g.arena.ptr() + sc.expertsOffset,
                  n * static_cast<size_t>(sc.k) * sizeof(int32_t), stream),
              "cuMemcpyDtoDAsync");
          !s)
        return Status::error(where() + ": expert statistics: " + s.message());
    }
    if (i == p.launches.size())
      break;
    const LaunchInfo &l = p.launches[i];
    if (!l.runsFor(rows))
      continue;
    const bool traced = tracing_ && !capturing_;
    if (traced)
      std::fprintf(stderr, "nf trace: %zu rows: %s grid %u block %u smem %u\n",
                   static_cast<size_t>(rows), l.where.c_str(), l.grid, l.block,
                   l.shared);
    const auto t0 = std::chrono::steady_clock::now();
    const bool timed = profiling_ && g.profileStart && g.profileEnd;
    if (timed)
      (void)d_->cuEventRecord(g.profileStart.get(), stream);
    if (Status s = launch(*d_, l.fn, l.grid, l.block, l.shared, l.cooperative,
                          l.programmatic && !profiling_ && !traced, stream,
                          g.args.ptr(), g.arena.ptr());
        !s)
      return Status::error(l.where + ": " + s.message());
    if (traced)
      if (Status s =
              d_->check(d_->cuStreamSynchronize(stream), "cuStreamSynchronize");
          !s)
        return Status::error(l.where + ": " + s.message());
    if (profiling_) {
      double seconds = 0.0;
      float ms = 0.0f;
      if (timed &&
          d_->cuEventRecord(g.profileEnd.get(), stream) == CUDA_SUCCESS &&
          d_->cuEventSynchronize(g.profileEnd.get()) == CUDA_SUCCESS &&
          d_->cuEventElapsedTime(&ms, g.profileStart.get(),
                                 g.profileEnd.get()) == CUDA_SUCCESS) {
        seconds = ms * 1e-3;
      } else {
        if (Status s = d_->check(d_->cuStreamSynchronize(stream),
                                 "cuStreamSynchronize");
            !s)
          return Status::error(l.where + ": " + s.message());
        seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
      }
      auto &entry = profile_[l.profileKey];
      entry.first += seconds;
      ++entry.second;
    }
  }
  return Status::success();
}

Status CudaEngine::captureDecode() {
  Gpu &g = *gpu_;
  CUstream stream = g.stream.get();
  // Bucket bounds: where the set of launches that run changes, and the most.
  std::set<int64_t> bounds{decode_.maxTokens};
  for (const LaunchInfo &l : decode_.launches) {
    if (l.maxTokens > 0 && l.maxTokens < decode_.maxTokens)
      bounds.insert(l.maxTokens);
    if (l.minTokens > 1 && l.minTokens - 1 < decode_.maxTokens)
      bounds.insert(l.minTokens - 1);
  }
  capturing_ = true;
  struct Reset {
    bool &flag;
    ~Reset() { flag = false; }
  } reset{capturing_};
  for (int64_t bound : bounds) {
    const std::string what = ": capturing the decode graph for " +
                             std::to_string(bound) + " tokens: ";
    if (Status s = d_->check(d_->cuStreamBeginCapture(
                                 stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                             "cuStreamBeginCapture");
        !s)
      return Status::error(where() + what + s.message());
    Status enq = enqueue(decode_, bound);
    CUgraph graph = nullptr;
    Status end =
        d_->check(d_->cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
    Graph owned;
    if (graph)
      owned = Graph(*d_, graph);
    if (!enq)
      return Status::error(where() + what + enq.message());
    if (!end)
      return Status::error(where() + what + end.message());
    CUgraphExec exec = nullptr;
    if (Status s = d_->check(d_->cuGraphInstantiateWithFlags(&exec, graph, 0),
                             "cuGraphInstantiateWithFlags");
        !s)
      return Status::error(where() + ": instantiating the decode graph for " +
                           std::to_string(bound) + " tokens: " + s.message());
    g.decodeBuckets.push_back(bound);
    g.decodeGraphs.push_back(std::move(owned));
    g.decodeExecs.push_back(GraphExec(*d_, exec));
  }
  return Status::success();
}

// ---------------------------------------------------------------------------
// Steps

Status CudaEngine::runStep(std::span<const SequenceInput> inputs,
                           LogitsFor which, std::vector<float> &logits,
                           StepStats *stats, TopLogits *top) {
  lastTopRows_.clear();
  const bool wantTop = which == LogitsFor::LastTokenTop;
  if (top)
    top->k = 0;
  if (wantTop)
    which = LogitsFor::LastTokenPerSequence;
  const size_t n = inputs.size();
  const int64_t V = info_.vocabSize;
  // One static top-k override per step: nf_step_args has one.
  for (size_t i = 1; i < n; ++i)
    if (inputs[i].expertsPerToken != inputs[0].expertsPerToken)
      return Status::error("step: input " + std::to_string(i) + " (sequence " +
                           std::to_string(inputs[i].sequence) +
                           "): " + std::to_string(inputs[i].expertsPerToken) +
                           " experts per token, input 0 asks for " +
                           std::to_string(inputs[0].expertsPerToken) +
                           "; the CUDA backend runs one override per step");
  StepRows sr;
  if (Status s = checkStep(inputs, which, info_, maxExpertsOverride_,
                           storage_.hasAttention, sequences_, caches_, sr);
      !s)
    return s;
  // Top lists where the decode program ranks them, in one run (a later
  // run would overwrite an earlier one's rows, which lastTokenRow reads).
  const Program &prog = sr.allOne ? decode_ : prefill_;
  const std::vector<std::vector<Chunk>> runs =
      splitIntoRuns(inputs, prog.maxTokens);
  if (wantTop && top && !top->noise.empty() && top->noise.size() != n)
    return Status::error("step: top-list noise for " +
                         std::to_string(top->noise.size()) + " of " +
                         std::to_string(n) + " inputs");
  bool keys = false, totals = false;
  if (wantTop && top)
    for (const TopNoise &z : top->noise) {
      keys = keys || z.keys;
      totals = totals || z.total;
    }
  const bool served = wantTop && top && sr.allOne && decode_.top.k > 0 &&
                      runs.size() == 1 && (!keys || info_.topLogitsNoise) &&
                      (!totals || info_.topLogitsTotals);
  if (served)
    which = LogitsFor::LastTokenTop;
  else
    logits.resize(static_cast<size_t>(sr.rows * V));
  if (stats)
    resetStats(*stats, n);
  if (n == 0)
    return Status::success();

  ContextScope scope(*d_, ctx_.get());
  if (!scope.status())
    return Status::error("step: " + scope.status().message());
  for (const std::vector<Chunk> &chunks : runs) {
    if (Status s =
            runProgram(prog, inputs, chunks, which, sr.tokenBase, logits.data(),
                       stats, inputs[0].expertsPerToken, top);
        !s)
      return Status::error("step: " + s.message());
    for (const Chunk &c : chunks)
      (void)caches_.advance(sr.slots[c.input], c.count);
  }
  return Status::success();
}

Status CudaEngine::lastTokenRow(size_t input, std::span<float> row) {
  const int64_t V = info_.vocabSize;
  if (input >= lastTopRows_.size() || lastTopRows_[input] < 0)
    return Status::error("the last step returned no top logits for input " +
                         std::to_string(input));
  if (row.size() < static_cast<size_t>(V))
    return Status::error("logits row: room for " + std::to_string(row.size()) +
                         " of " + std::to_string(V) + " values");
  ContextScope scope(*d_, ctx_.get());
  if (!scope.status())
    return Status::error("logits row: " + scope.status().message());
  Gpu &g = *gpu_;
  const size_t rowBytes = static_cast<size_t>(V) * sizeof(float);
  const CUdeviceptr src =
      g.arena.ptr() +
      static_cast<size_t>(decode_.values[decode_.logits].offset) +
      static_cast<size_t>(lastTopRows_[input]) * rowBytes;
  CUstream stream = g.stream.get();
  if (Status s =
          d_->check(d_->cuMemcpyDtoHAsync(row.data(), src, rowBytes, stream),
                    "cuMemcpyDtoHAsync");
      !s)
    return Status::error(where() + ": logits row: " + s.message());
  return syncStream(where() + ": logits row");
}

Status CudaEngine::runProgram(const Program &p,
                              std::span<const SequenceInput> inputs,
                              std::span<const Chunk> chunks, LogitsFor which,
                              std::span<const int64_t> tokenBase,
                              float *logitsOut, StepStats *stats,
                              int32_t expertsPerToken, TopLogits *top) {
  Gpu &g = *gpu_;
  const ArgsLayout &L = layout_;
  CUstream stream = g.stream.get();
  uint8_t *h = g.staging.data();
  auto *tokens = reinterpret_cast<int32_t *>(h + L.tokens);
  auto *budget = reinterpret_cast<float *>(h + L.budget);
  auto *seqs = reinterpret_cast<nf_seq_desc *>(h + L.seqs);
  auto *tokenSeq = reinterpret_cast<int32_t *>(h + L.tokenSeq);
  auto *logitRows = reinterpret_cast<int32_t *>(h + L.logitRows);
  auto *pages = reinterpret_cast<int32_t *>(h + L.pages);
  const int64_t numSeqs = static_cast<int64_t>(chunks.size());
  int64_t maxPages = 1;
  for (const Chunk &c : chunks)
    maxPages = std::max<int64_t>(
        maxPages,
        static_cast<int64_t>(
            caches_.pageTable(sequences_.slot(inputs[c.input].sequence).value())
                .size()));
  if (numSeqs > L.maxSeqs || maxPages > L.maxPages)
    return Status::error("internal: run of " + std::to_string(numSeqs) +
                         " sequences / " + std::to_string(maxPages) +
                         " pages exceeds the argument buffers");
  // A tiered cache's pages that left the hot window: the run's appends
  // move them to fp8 before writing its rows (nf_kv_cache.cuh). After the
  // checks above, so that a refused run leaves the page tables as they
  // are on the device (compression renumbers pages, never adds any).
  auto *moves = reinterpret_cast<int32_t *>(h + L.moves);
  kvMoves_.clear();
  const bool tiered = caches_.kv().tiered();
  if (tiered) {
    caches_.compress(&kvMoves_);
    std::copy(kvMoves_.begin(), kvMoves_.end(), moves);
  }
  tokenInput_.clear();
  int64_t T = 0;
  int32_t numLogitRows = 0; // the rows copied back below
  for (int64_t ci = 0; ci < numSeqs; ++ci) {
    const Chunk &c = chunks[static_cast<size_t>(ci)];
    const SequenceInput &in = inputs[c.input];
    const int32_t slot = sequences_.slot(in.sequence).value();
    nf_seq_desc &sd = seqs[ci];
    sd.begin = static_cast<int32_t>(c.row);
    sd.count = static_cast<int32_t>(c.count);
    sd.start_pos = static_cast<int32_t>(caches_.length(slot));
    sd.slot = slot;
    for (int64_t j = 0; j < c.count; ++j) {
      tokens[T] = in.tokens[static_cast<size_t>(c.first + j)];
      budget[T] = in.expertBudget;
      tokenSeq[T] = static_cast<int32_t>(ci);
      tokenInput_.push_back(c.input);
      ++T;
    }
    if (which != LogitsFor::AllTokens && c.last)
      logitRows[numLogitRows++] = static_cast<int32_t>(c.row + c.count - 1);
    const std::vector<int32_t> &pt = caches_.pageTable(slot);
    int32_t *row = pages + ci * maxPages;
    if (tiered) // entries unit * 2 + hot (kv_tiered)
      std::transform(pt.begin(), pt.end(), row, [&](int32_t page) {
        return page * 2 + (caches_.kv().isHot(page) ? 1 : 0);
      });
    else
      std::copy(pt.begin(), pt.end(), row);
    std::fill(row + pt.size(), row + maxPages, 0);
  }
  if (T > L.maxRows)
    return Status::error("internal: run of " + std::to_string(T) +
                         " rows exceeds the argument buffers");
  const CUdeviceptr dev = g.args.ptr();
  auto devPtr = [&](size_t off) {
    return reinterpret_cast<void *>(static_cast<uintptr_t>(dev + off));
  };
  nf_step_args args;
  std::memset(&args, 0, sizeof args);
  args.arena = reinterpret_cast<char *>(static_cast<uintptr_t>(g.arena.ptr()));
  args.weights = reinterpret_cast<const void *const *>(
      static_cast<uintptr_t>(g.weightPtrs.ptr()));
  args.storage = reinterpret_cast<void *const *>(
      static_cast<uintptr_t>(g.storagePtrs.ptr()));
  args.tokens = static_cast<const int32_t *>(devPtr(L.tokens));
  args.budget = static_cast<const float *>(devPtr(L.budget));
  args.seqs = static_cast<const nf_seq_desc *>(devPtr(L.seqs));
  args.token_seq = static_cast<const int32_t *>(devPtr(L.tokenSeq));
  args.page_tables = static_cast<const int32_t *>(devPtr(L.pages));
  args.num_tokens = static_cast<int32_t>(T);
  args.num_seqs = static_cast<int32_t>(numSeqs);
  args.max_pages_per_seq = static_cast<int32_t>(maxPages);
  args.experts_per_token = expertsPerToken;
  args.budget_pooled = budgetPooled_;
  args.distinct_expert_cap = distinctExpertCap_;
  // The LM head computes the rows whose logits are read (all: null).
  args.logit_rows = which == LogitsFor::AllTokens
                        ? nullptr
                        : static_cast<const int32_t *>(devPtr(L.logitRows));
  args.num_logit_rows = numLogitRows;
  args.kv_moves = static_cast<const int32_t *>(devPtr(L.moves));
  args.num_kv_moves = static_cast<int32_t>(kvMoves_.size() / 2);
  std::memcpy(h, &args, sizeof args);
  const size_t used =
      L.pages + static_cast<size_t>(numSeqs * maxPages) * sizeof(int32_t);
  if (Status s = d_->check(d_->cuMemcpyHtoDAsync(dev, h, used, stream),
                           "cuMemcpyHtoDAsync");
      !s)
    return s;

  size_t bucket = 0;
  while (bucket < g.decodeBuckets.size() && g.decodeBuckets[bucket] < T)
    ++bucket;
  if (&p == &decode_ && bucket < g.decodeExecs.size() && !profiling_) {
    if (Status s =
            d_->check(d_->cuGraphLaunch(g.decodeExecs[bucket].get(), stream),
                      "cuGraphLaunch");
        !s)
      return Status::error(where() + ": decode graph: " + s.message());
  } else if (Status s = enqueue(p, T); !s) {
    return s;
  }

  // The logits rows asked for, straight into the caller's buffer.
  const int64_t V = info_.vocabSize;
  const size_t rowBytes = static_cast<size_t>(V) * sizeof(float);
  const CUdeviceptr src =
      g.arena.ptr() + static_cast<size_t>(p.values[p.logits].offset);
  for (const Chunk &c : chunks) {
    CUresult r = CUDA_SUCCESS;
    if (which == LogitsFor::AllTokens)
      r = d_->cuMemcpyDtoHAsync(logitsOut + (tokenBase[c.input] + c.first) * V,
                                src + static_cast<size_t>(c.row) * rowBytes,
                                static_cast<size_t>(c.count) * rowBytes,
                                stream);
    else if (c.last && which == LogitsFor::LastTokenPerSequence)
      r = d_->cuMemcpyDtoHAsync(logitsOut + static_cast<int64_t>(c.input) * V,
                                src + static_cast<size_t>(c.row + c.count - 1) *
                                          rowBytes,
                                rowBytes, stream);
    if (Status s = d_->check(r, "cuMemcpyDtoHAsync"); !s)
      return Status::error(where() + ": logits: " + s.message());
  }
  // The rows' largest logits, ranked on the device after the step.
  const bool ranked = which == LogitsFor::LastTokenTop;
  const size_t topBytes =
      static_cast<size_t>(numLogitRows) * static_cast<size_t>(p.top.k) * 4;
  // The rows' totals land after the noise records in the pinned buffer.
  const size_t totalsAt = static_cast<size_t>(p.maxTokens) *
                          (static_cast<size_t>(p.top.k) * 8 + kTopNoiseBytes);
  bool anyTotal = false;
  if (ranked)
    for (const TopNoise &z : top->noise)
      anyTotal = anyTotal || z.total;
  if (ranked) {
    if (p.top.noiseOffset >= 0) {
      // How each row is ranked: row j is the j-th sequence's last token.
      auto *noise = g.topHost.data() + static_cast<size_t>(p.maxTokens) *
                                           static_cast<size_t>(p.top.k) * 8;
      size_t j = 0;
      for (const Chunk &c : chunks) {
        if (!c.last)
          continue;
        const TopNoise z =
            top->noise.empty() ? TopNoise{} : top->noise[c.input];
        const uint32_t flags = (z.keys ? 1u : 0u) | (z.total ? 2u : 0u);
        std::memcpy(noise + j * kTopNoiseBytes, &z.seed, 8);
        std::memcpy(noise + j * kTopNoiseBytes + 8, &z.draw, 8);
        std::memcpy(noise + j * kTopNoiseBytes + 16, &z.temperature, 4);
        std::memcpy(noise + j * kTopNoiseBytes + 20, &flags, 4);
        ++j;
      }
      if (Status s = d_->check(
              d_->cuMemcpyHtoDAsync(g.arena.ptr() +
                                        static_cast<size_t>(p.top.noiseOffset),
                                    noise, j * kTopNoiseBytes, stream),
              "cuMemcpyHtoDAsync");
          !s)
        return Status::error(where() + ": top-list noise: " + s.message());
    }
    for (const LaunchInfo &l : p.top.launches)
      if (Status s = launch(*d_, l.fn, l.grid, l.block, l.shared, false, false,
                            stream, g.args.ptr(), g.arena.ptr());
          !s)
        return Status::error(l.where + ": " + s.message());
    for (int part = 0; part < 2; ++part)
      if (Status s = d_->check(
              d_->cuMemcpyDtoHAsync(
                  g.topHost.data() + part * topBytes,
                  g.arena.ptr() + static_cast<size_t>(part ? p.top.valuesOffset
                                                           : p.top.idsOffset),
                  topBytes, stream),
              "cuMemcpyDtoHAsync");
          !s)
        return Status::error(where() + ": top logits: " + s.message());
    if (anyTotal)
      if (Status s = d_->check(
              d_->cuMemcpyDtoHAsync(
                  g.topHost.data() + totalsAt,
                  g.arena.ptr() + static_cast<size_t>(p.top.totalsOffset),
                  static_cast<size_t>(numLogitRows) * 8, stream),
              "cuMemcpyDtoHAsync");
          !s)
        return Status::error(where() + ": top-list totals: " + s.message());
  }
  const bool haveStats = g.stats.ptr() != 0 && !p.copies.empty();
  // Plans 1.8: the kernels' own region of the arena (its layout fits in
  // statsHost: no more layers, rows or columns than the engine's).
  const bool statsInArena = p.statsOffset >= 0;
  if (haveStats)
    if (Status s = d_->check(
            statsInArena
                ? d_->cuMemcpyDtoHAsync(
                      g.statsHost.data(),
                      g.arena.ptr() + static_cast<size_t>(p.statsOffset),
                      static_cast<size_t>(4 * p.statsLayers * p.statsRows *
                                          (1 + p.statsMaxK)),
                      stream)
                : d_->cuMemcpyDtoHAsync(g.statsHost.data(), g.stats.ptr(),
                                        g.stats.bytes, stream),
            "cuMemcpyDtoHAsync");
        !s)
      return Status::error(where() + ": expert statistics: " + s.message());
  if (Status s = syncStream(where() + ": " + p.phase + " run"); !s)
    return s;

  if (ranked) {
    // List j is that of the j-th sequence's last token (the logit rows'
    // order).
    const size_t k = static_cast<size_t>(p.top.k);
    top->k = p.top.k;
    top->ids.resize(inputs.size() * k);
    top->values.resize(inputs.size() * k);
    top->totals.assign(inputs.size(), std::numeric_limits<double>::quiet_NaN());
    lastTopRows_.assign(inputs.size(), -1);
    const auto *ids = reinterpret_cast<const int32_t *>(g.topHost.data());
    const auto *vals =
        reinterpret_cast<const float *>(g.topHost.data() + topBytes);
    size_t j = 0;
    for (const Chunk &c : chunks) {
      if (!c.last)
        continue;
      std::copy_n(ids + j * k, k, top->ids.data() + c.input * k);
      std::copy_n(vals + j * k, k, top->values.data() + c.input * k);
      if (anyTotal && top->noise[c.input].total)
        std::memcpy(&top->totals[c.input], g.topHost.data() + totalsAt + j * 8,
                    8);
      lastTopRows_[c.input] = c.row + c.count - 1;
      ++j;
    }
  }
  if (haveStats) {
    const size_t R =
        static_cast<size_t>(statsInArena ? p.statsRows : L.maxRows);
    const size_t layers = static_cast<size_t>(
        statsInArena ? p.statsLayers : int64_t(info_.numMoeLayers));
    const size_t maxK =
        static_cast<size_t>(statsInArena ? p.statsMaxK : int64_t(maxK_));
    const auto *all = reinterpret_cast<const int32_t *>(g.statsHost.data());
    for (const StatCopy &sc : p.copies) {
      const int32_t *counts = all + static_cast<size_t>(sc.layer) * R;
      const int32_t *experts =
          all + layers * R + static_cast<size_t>(sc.layer) * R * maxK;
      std::vector<int64_t> &used = utilization_[static_cast<size_t>(sc.layer)];
      for (int64_t t = 0; t < T; ++t) {
        const int32_t kt = std::clamp(counts[t], 0, sc.k);
        const int32_t input = tokenInput_[static_cast<size_t>(t)];
        if (stats) {
          stats->expertCalls[static_cast<size_t>(input)] += kt;
          stats->expertCallsPerLayer[static_cast<size_t>(input)]
                                    [static_cast<size_t>(sc.layer)] += kt;
        }
        for (int32_t j = 0; j < kt; ++j) {
          const int32_t e = experts[t * sc.k + j];
          if (e >= 0 && e < info_.numExperts)
            ++used[static_cast<size_t>(e)];
        }
      }
    }
  }
  return Status::success();
}

} // namespace nf::engine::cuda_detail
