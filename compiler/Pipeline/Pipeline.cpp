//===- Pipeline.cpp - the nfc compile phases ------------------------------===//

#include "Pipeline/Pipeline.h"

#include "Transforms/Passes.h"
#include "nf/IR/NfDialect.h"
#include "nf_kv/IR/NfKvOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace nf::compiler {

const std::vector<std::string> &phaseNames() {
  static const std::vector<std::string> names = {"import", "outline", "lower",
                                                 "pack",   "fuse",    "plan"};
  return names;
}

std::optional<Phase> parsePhase(const std::string &name) {
  const auto &names = phaseNames();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name)
      return static_cast<Phase>(i);
  return std::nullopt;
}

void buildPipeline(mlir::PassManager &pm, Phase last,
                   const PipelineOptions &options) {
  if (!options.quantizeWeights.empty()) {
    QuantizeWeightsOptions quantize;
    quantize.scheme = options.quantizeWeights;
    quantize.scope = options.quantizeScope;
    quantize.groupSize = options.quantGroupSize;
    pm.addPass(createQuantizeWeights(quantize));
  }
  if (last >= Phase::Outline)
    pm.addPass(createOutlineSteps());
  if (last >= Phase::Lower) {
    LowerMixersOptions mixers;
    mixers.maxSequences = options.maxSequences;
    mixers.pageSize = options.pageSize;
    mixers.kvPages = options.kvPages;
    mixers.kvDtype = options.kvCacheDtype;
    pm.addPass(createLowerMixers(mixers));
    LowerMoEOptions moe;
    moe.policy = options.expertPolicy;
    moe.minK = options.minExperts;
    pm.addPass(createLowerMoE(moe));
  }
  if (last >= Phase::Pack)
    pm.addPass(createPackWeights());
  if (last >= Phase::Fuse)
    pm.addPass(createFuseKernels());
  if (last >= Phase::Plan) {
    if (options.cudaTarget) {
      CudaGemmPathsOptions paths;
      paths.ampereOrLater = options.cudaAmpereOrLater;
      pm.addPass(createCudaGemmPaths(paths));
      CudaEpiloguesOptions epilogues;
      epilogues.smCount = options.cudaSmCount;
      epilogues.hopperOrLater = options.cudaHopperOrLater;
      pm.addPass(createCudaEpilogues(epilogues));
    }
    CudaRowFormatsOptions rowFormats;
    rowFormats.bf16Inputs = options.cudaBf16Inputs;
    rowFormats.maxSequences = options.maxSequences;
    pm.addPass(createCudaRowFormats(rowFormats));
    if (options.cudaTarget) {
      CudaGemmVariantsOptions variants;
      variants.maxSequences = options.maxSequences;
      variants.smCount = options.cudaSmCount;
      variants.hopperOrLater = options.cudaHopperOrLater;
      pm.addPass(createCudaGemmVariants(variants));
      CudaAttentionFormsOptions attention;
      attention.maxSequences = options.maxSequences;
      attention.bf16Inputs = options.cudaBf16Inputs;
      attention.ampereOrLater = options.cudaAmpereOrLater;
      attention.maxSharedBytes = options.cudaMaxSharedBytes;
      pm.addPass(createCudaAttentionForms(attention));
      CudaScanFormsOptions scans;
      scans.maxTokens = options.maxTokens;
      scans.matmulTerms = options.cudaMatmulTerms;
      scans.ampereOrLater = options.cudaAmpereOrLater;
      scans.maxSharedBytes = options.cudaMaxSharedBytes;
      pm.addPass(createCudaScanForms(scans));
      CudaCoLaunchesOptions coLaunches;
      coLaunches.maxSequences = options.maxSequences;
      coLaunches.rowLinear = options.cudaRowLinear;
      pm.addPass(createCudaCoLaunches(coLaunches));
      CudaKernelScratchOptions scratch;
      scratch.maxTokens = options.maxTokens;
      scratch.maxSequences = options.maxSequences;
      scratch.matmulTerms = options.cudaMatmulTerms;
      scratch.ampereOrLater = options.cudaAmpereOrLater;
      pm.addPass(createCudaKernelScratch(scratch));
    }
    PlanMemoryOptions memory;
    memory.maxTokens = options.maxTokens;
    memory.maxSequences = options.maxSequences;
    memory.expertStats = options.cudaTarget;
    pm.addPass(createPlanMemory(memory));
  }
}

void registerDialects(mlir::DialectRegistry &registry) {
  registry.insert<mlir::nf::NfDialect, mlir::nf_kv::NfKvDialect,
                  mlir::nf_moe::NfMoeDialect, mlir::func::FuncDialect>();
}

} // namespace nf::compiler
