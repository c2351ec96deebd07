//===- CudaCodegen.cpp - plan kernels -> CUDA C++ -------------------------===//
//
// One module per plan kernel; one __global__ function per op, or fewer where
// ops fuse:
//   nf.linear + nf.split [+ nf_kv.append]   one GEMM whose epilogue writes
//                                            the split columns (and K/V
//                                            cache rows)
//   nf.linear + nf.activation                GEMM with the activation in its
//                                            epilogue
//   nf.add + nf.rms_norm                     one row kernel
//   nf_moe.router + nf_moe.select            one block per token (scores in
//                                            f64 stay in shared memory)
// and a few ops take more than one launch (no grid-wide barriers anywhere):
//   nf_kv.causal_conv (prefill mode)         outputs, then the conv window
//   nf_moe.select (budget policy)            per-token ranking, then one
//                                            block per sequence decides counts
//   nf_moe.shared_expert                     up GEMM (+act), then down GEMM
// Function names: <p|d>k<kernel>_op<first op>_<what>, e.g.
// pk12_op0_add_rms_norm for prefill kernel 12.
//
// This file: the entry point, the step (value table, row formats, expert
// statistics, top logits) and the module text of each kernel
// (KernelEmitter::run). The class is in KernelEmitter.h, its op emitters in
// Emit*.cpp, the row formats in RowFormats.cpp.
//
//===----------------------------------------------------------------------===//

#include "Target/Cuda/CudaCodegen.h"
#include "Target/Cuda/KernelEmitter.h"

#include <cctype>
#include <string_view>

namespace nf::codegen {
namespace detail {

StatusOr<CudaKernelSource> KernelEmitter::run() {
  for (const PlanOp &op : kernel.ops)
    ops.push_back(&op);
  outputs.insert(kernel.outputs.begin(), kernel.outputs.end());
  for (const PlanOp *op : ops)
    for (int v : operands(*op))
      if (v < 0 || v >= static_cast<int>(values.size()))
        return fail(0, "operand value " + std::to_string(v) + " out of range");

  for (size_t i = 0; i < ops.size();) {
    StatusOr<size_t> n = fail(i, "no CUDA implementation");
    switch (opCode(*ops[i])) {
    case OpCode::Embed:
      n = embed(i);
      break;
    case OpCode::RmsNorm:
      n = rmsNorm(i);
      break;
    case OpCode::Add:
      n = add(i);
      break;
    case OpCode::Linear:
    case OpCode::LmHead:
    case OpCode::LatentProj:
      n = linear(i);
      break;
    case OpCode::Split:
      n = split(i);
      break;
    case OpCode::Activation:
      n = activation(i);
      break;
    case OpCode::GatedRmsNorm:
      n = gatedRmsNorm(i);
      break;
    case OpCode::CausalConv:
      n = causalConv(i);
      break;
    case OpCode::SsmScan:
    case OpCode::SsmUpdate:
      n = ssm(i);
      break;
    case OpCode::KvAppend:
      n = kvAppend(i);
      break;
    case OpCode::KvAttend:
      n = kvAttend(i);
      break;
    case OpCode::Router:
    case OpCode::Select:
      n = route(i);
      break;
    case OpCode::Dispatch:
      n = dispatch(i);
      break;
    case OpCode::ExpertUp:
      n = expert(i, true);
      break;
    case OpCode::ExpertDown:
      n = expert(i, false);
      break;
    case OpCode::Combine:
      n = combine(i);
      break;
    case OpCode::SharedExpert:
      n = phase == "decode" && i + 1 < ops.size() &&
                  opCode(*ops[i + 1]) == OpCode::Router
              ? routeSharedExpert(i)
              : sharedExpert(i);
      break;
    case OpCode::Unknown:
      break;
    }
    if (!n)
      return n.status();
    i += *n;
  }
  // Launches for more tokens than a step has never run (plans of one-token
  // steps: the dispatch and the layer's end of oneTokenExperts).
  for (size_t l = launches.size(); l-- > 0;)
    if (launches[l].minTokens > maxTokens) {
      launches.erase(launches.begin() + static_cast<std::ptrdiff_t>(l));
      functions.erase(functions.begin() + static_cast<std::ptrdiff_t>(l));
    }
  if (launches.empty())
    return fail(0, "kernel has no ops");
  if (!internalError.empty())
    return fail(ops.size(), "internal: " + internalError);
  // Every region nf-cuda-kernel-scratch sized is one the code uses.
  for (size_t i = 0; i < ops.size(); ++i) {
    const size_t sized = listAttr(*ops[i], "nf.kernel_scratch")
                             .value_or(std::vector<int64_t>{})
                             .size();
    auto it = scratchTaken.find(ops[i]);
    const size_t taken = it == scratchTaken.end() ? 0 : it->second;
    if (taken != sized)
      return fail(
          i, "internal: nf.kernel_scratch sizes " + std::to_string(sized) +
                 " scratch regions; its kernels use " + std::to_string(taken));
  }
  // Every value stored as bf16 rows or with a bf16 copy must have been
  // written so by its producer here (nf-cuda-row-formats, RowFormats.cpp and
  // the emitters agree).
  for (size_t i = 0; i < ops.size(); ++i)
    for (int r : results(*ops[i])) {
      if (rowsBf16(r) && !wroteBf16.count(r))
        return fail(i, "internal: value " + std::to_string(r) +
                           " is stored as bf16 rows but its producer does "
                           "not write them");
      if (shadowed(r) && !wroteShadow.count(r))
        return fail(i, "internal: value " + std::to_string(r) +
                           " has a bf16 copy but its producer does not "
                           "write it");
    }

  for (size_t l = 0; l < launches.size(); ++l) {
    const FunctionText &f = functions[l];
    text << "// " << f.comment << "\n"
         << "extern \"C\" __global__ void __launch_bounds__("
         << launches[l].block
         << (f.minBlocks > 0 ? ", " + std::to_string(f.minBlocks) : "") << ") "
         << (f.clusterBlocks > 0
                 ? "__cluster_dims__(" + std::to_string(f.clusterBlocks) +
                       ", 1, 1) "
                 : "")
         << launches[l].function
         << (phase == "decode" ? "(const nf_step_args *__restrict__ args) {\n"
                               : "(const nf_step_args *__restrict__ args, char "
                                 "*__restrict__ arena) {\n")
         << (f.ownsStep          ? ""
             : phase == "decode" ? "  const nf::Step a{args, nullptr};\n"
                                 : "  const nf::Step a{args, arena};\n")
         << f.body << "}\n\n";
  }

  CudaKernelSource out;
  out.step = phase;
  out.index = index;
  out.name = kname();
  std::string safe = out.name;
  for (char &c : safe)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_')
      c = '_';
  out.fileName = phase + "_k" + std::to_string(index) + "_" + safe + ".cu";
  std::ostringstream src;
  src << "// Generated by nfc: " << phase << " kernel " << index << " \""
      << out.name << "\" (";
  for (size_t i = 0; i < ops.size(); ++i)
    src << (i ? ", " : "") << opName(*ops[i]);
  src << ").\n// Launch ABI: nf_abi.h. Launches in order:";
  for (const CudaLaunchInfo &l : launches)
    src << "\n//   " << l.function << " <<<" << l.grid << ", " << l.block
        << ">>>";
  // Decode functions read the arena's base from the step's arguments at
  // each use (nf_common.cuh, nf::arena).
  src << "\n"
      << (phase == "decode" ? "#define NF_ARENA_FROM_ARGS 1\n" : "")
      << "#include \"nf_common.cuh\"\n";
  for (const std::string &inc : includes)
    src << "#include \"" << inc << "\"\n";
  if (!tensorMaps.empty()) {
    // Encoded by the runtime when it loads the module (nf_abi.h).
    src << "\nextern \"C\" {\n__device__ nf_tensor_map_desc "
           "nf_tensor_map_descs["
        << tensorMaps.size() << "] = {\n";
    for (const std::string &m : tensorMaps)
      src << "    " << m << ",\n";
    src << "};\n__device__ nf_tensor_map nf_tensor_maps[" << tensorMaps.size()
        << "];\n}\n";
  }
  src << "\n" << text.str();
  out.source = src.str();
  out.launches = launches;
  out.hopperFeatures = hopperFeatures;
  return out;
}

namespace {

/// Appends the top-logits functions (kernels/nf_sample.cuh) to the module of
/// the kernel that computes the decode step's logits, where
/// nf-cuda-kernel-scratch gave that op `nf.top_logits_chunk`; their buffers
/// are its after-step regions (nf-plan-memory).
Status addTopLogits(const PlanStep &step, const std::vector<ValueInfo> &values,
                    const CudaCodegenOptions &opts, CudaStepSources &out) {
  int kernel = -1;
  const PlanOp *op = nullptr;
  for (size_t k = 0; k < step.kernels.size(); ++k)
    for (const PlanOp &o : step.kernels[k].ops)
      if (intAttr(o, "nf.top_logits_chunk")) {
        kernel = static_cast<int>(k);
        op = &o;
      }
  if (!op)
    return Status::success();
  const int logits = step.logits;
  const int64_t chunk = *intAttr(*op, "nf.top_logits_chunk");
  const std::vector<int64_t> regions =
      listAttr(*op, "nf.after_step_scratch_offsets")
          .value_or(std::vector<int64_t>{});
  if (logits < 0 || logits >= static_cast<int>(values.size()) ||
      op->results.size() != 1 || op->results[0] != logits ||
      values[logits].dtype != pl::DType::F32 || values[logits].offset < 0 ||
      chunk != shapes::topLogitsChunk(values[logits].cols) ||
      regions.size() != 6)
    return Status::error("cuda: " + opName(*op) +
                         " has nf.top_logits_chunk but does not compute the "
                         "step's f32 logits, or has no after-step regions "
                         "(nf-cuda-kernel-scratch, nf-plan-memory)");
  const int64_t vocab = values[logits].cols;
  constexpr int64_t kTopLogits = shapes::kTopLogits;
  const int64_t chunks = ceilDiv(vocab, chunk), rows = step.maxTokens;
  CudaTopLogits &t = out.topLogits;
  t.kernel = kernel;
  t.k = kTopLogits;
  const int64_t partial = regions[0];
  t.idsOffset = regions[1];
  t.valuesOffset = regions[2];
  t.noiseOffset = regions[3];
  t.totalsOffset = regions[4];
  // The chunks' parts of the totals (nf::top_chunk_total, 16 bytes).
  const int64_t chunkSums = regions[5];

  CudaKernelSource &src = out.kernels[static_cast<size_t>(kernel)];
  const std::string prefix = "dk" + std::to_string(kernel) + "_top_logits";
  const std::string tmpl = std::to_string(vocab) + ", " +
                           std::to_string(chunk) + ", " +
                           std::to_string(kTopLogits);
  const std::string rowsAndNoise = "nf::arena<float>(a, " +
                                   std::to_string(values[logits].offset) +
                                   "ll), nf::arena<nf::top_logit_noise>(a, " +
                                   std::to_string(t.noiseOffset) + "ll)";
  const std::string inc = "#include \"nf_common.cuh\"\n";
  const size_t at = src.source.find(inc);
  if (at != std::string::npos)
    src.source.insert(at + inc.size(), "#include \"nf_sample.cuh\"\n");
  src.source +=
      "// The largest logits of each row, run by the runtime after the step "
      "on request:\n// ranks of " +
      std::to_string(chunk) + " logits, " + std::to_string(kTopLogits) +
      " kept from each\nextern \"C\" __global__ void __launch_bounds__(256) " +
      prefix + "_chunks(const nf_step_args *__restrict__ args) {\n" +
      "  const nf::Step a{args, nullptr};\n  nf::top_logits_chunks<" + tmpl +
      ", 256>(a, " + rowsAndNoise + ", nf::arena<unsigned long long>(a, " +
      std::to_string(partial) + "ll), nf::arena<nf::top_chunk_total>(a, " +
      std::to_string(chunkSums) + "ll));\n}\n\n// the rows' " +
      std::to_string(kTopLogits) +
      " largest of the chunks' (ids and values)\nextern \"C\" __global__ "
      "void __launch_bounds__(512) " +
      prefix + "_merge(const nf_step_args *__restrict__ args) {\n" +
      "  const nf::Step a{args, nullptr};\n  nf::top_logits_merge<" + tmpl +
      ", 512>(a, " + rowsAndNoise + ", nf::arena<unsigned long long>(a, " +
      std::to_string(partial) + "ll), nf::arena<nf::top_chunk_total>(a, " +
      std::to_string(chunkSums) + "ll), nf::arena<int>(a, " +
      std::to_string(t.idsOffset) + "ll), nf::arena<float>(a, " +
      std::to_string(t.valuesOffset) + "ll), nf::arena<double>(a, " +
      std::to_string(t.totalsOffset) + "ll));\n}\n";
  CudaLaunchInfo c;
  c.function = prefix + "_chunks";
  c.grid = gridOf(rows * chunks, int64_t(opts.smCount) * 8);
  c.block = 256;
  CudaLaunchInfo m;
  m.function = prefix + "_merge";
  m.grid = gridOf(rows, int64_t(opts.smCount) * 8);
  m.block = 512;
  t.launches = {c, m};
  return Status::success();
}

StatusOr<CudaStepSources> generateStep(const PlanModel &plan,
                                       const PlanStep &step, const char *phase,
                                       const CudaCodegenOptions &opts) {
  std::vector<ValueInfo> values;
  for (const compiler::PlanValue &v : step.values) {
    ValueInfo vi;
    vi.kind = v.kind;
    vi.dtype = v.dtype;
    vi.rows = v.rows;
    vi.shape = v.shape;
    for (size_t d = vi.rows != pl::Rows::None ? 1 : 0; d < vi.shape.size(); ++d)
      vi.cols *= vi.shape[d];
    vi.offset = v.offset;
    vi.bytes = v.bytes;
    vi.weight = v.weight;
    vi.numExperts = v.numExperts;
    vi.maxPerToken = v.maxPerToken;
    values.push_back(std::move(vi));
  }
  CudaStepSources out;
  const int64_t arena = step.arenaBytes;
  auto formats = rowFormatsOf(step, values);
  if (!formats)
    return formats.status();
  RowFormats &rowFormats = *formats;
  // nf-plan-memory placed everything, the kernels' scratch regions and the
  // top logits' buffers too.
  const int64_t scratchEnd = std::max(
      {arena + step.scratchBytes, step.reservedBytes, step.kernelScratchEnd});
  // The expert statistics region's layout (its offset is the planner's).
  ExpertStatsLayout stats;
  stats.rows = step.maxTokens;
  for (const PlanKernel &kernel : step.kernels)
    for (const PlanOp &op : kernel.ops)
      if (opCode(op) == OpCode::Select && op.results.size() == 3) {
        const int e = op.results[0];
        if (e < 0 || e >= static_cast<int>(values.size()))
          continue;
        stats.layerOf[&op] = stats.layers++;
        stats.maxK = std::max(stats.maxK, values[e].cols);
      }
  if (stats.layers > 0) {
    if (step.expertStatsOffset < 0)
      return Status::error("cuda: " + step.phase +
                           " step has no expert statistics region (plan "
                           "memory without expert-stats)");
    stats.offset = step.expertStatsOffset;
    out.expertStatsOffset = stats.offset;
  }
  for (size_t k = 0; k < step.kernels.size(); ++k) {
    KernelEmitter e(plan, values, rowFormats, phase, static_cast<int>(k),
                    step.kernels[k], step.maxTokens, arena, opts);
    e.expertStats = &stats;
    e.narrowTokens = step.skinnyNarrowTokens;
    auto src = e.run();
    if (!src)
      return src.status();
    out.kernels.push_back(std::move(*src));
  }
  if (std::string_view(phase) == "decode")
    if (Status s = addTopLogits(step, values, opts, out); !s.ok())
      return s;
  out.scratchBytes = alignTo(scratchEnd - arena);
  return out;
}

} // namespace
} // namespace detail

StatusOr<CudaPlanSources> generateCudaSources(const compiler::PlanModel &plan,
                                              const CudaCodegenOptions &opts) {
  for (const compiler::PlanStorage &s : plan.storage)
    if (s.kind == ::nf::plan::StorageKind::KVCache &&
        s.dtype != ::nf::plan::DType::F32 &&
        s.dtype != ::nf::plan::DType::BF16 &&
        s.dtype != ::nf::plan::DType::F8E4M3)
      return Status::error("cuda: KV cache " + s.name + " stores " +
                           ::nf::plan::EnumNameDType(s.dtype) +
                           "; the CUDA kernels read f32, bf16 and fp8 caches");
  CudaPlanSources out;
  auto prefill = detail::generateStep(plan, plan.prefill, "prefill", opts);
  if (!prefill)
    return prefill.status();
  auto decode = detail::generateStep(plan, plan.decode, "decode", opts);
  if (!decode)
    return decode.status();
  out.prefill = std::move(*prefill);
  out.decode = std::move(*decode);
  return out;
}

} // namespace nf::codegen
