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

std::string resolvedKvCacheDtype(const PipelineOptions &options) {
  if (options.kvCacheDtype != "auto")
    return options.kvCacheDtype;
  return options.cudaTarget && options.cudaBf16Inputs ? "bf16" : "f32";
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
    mixers.kvDtype = resolvedKvCacheDtype(options);
    mixers.kvHotWindow = options.kvHotWindow;
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
    // The plan phase's passes take the step sizes and the CUDA target's
    // facts under the same option names.
    auto planOptions = [&](auto o) {
#define NF_PLAN_OPTION(name, value)                                            \
  if constexpr (requires { o.name; })                                          \
    o.name = value;
      NF_PLAN_OPTION(maxTokens, options.maxTokens)
      NF_PLAN_OPTION(maxSequences, options.maxSequences)
      NF_PLAN_OPTION(smCount, options.cudaSmCount)
      NF_PLAN_OPTION(bf16Inputs, options.cudaBf16Inputs)
      NF_PLAN_OPTION(matmulTerms, options.cudaMatmulTerms)
      NF_PLAN_OPTION(ampereOrLater, options.cudaAmpereOrLater)
      NF_PLAN_OPTION(hopperOrLater, options.cudaHopperOrLater)
      NF_PLAN_OPTION(wgmma, options.cudaWgmma)
      NF_PLAN_OPTION(maxSharedBytes, options.cudaMaxSharedBytes)
      NF_PLAN_OPTION(rowLinear, options.cudaRowLinear)
      NF_PLAN_OPTION(expertStats, options.cudaTarget)
#undef NF_PLAN_OPTION
      return o;
    };
    if (options.cudaTarget) {
      pm.addPass(createCudaGemmPaths(planOptions(CudaGemmPathsOptions{})));
      pm.addPass(createCudaEpilogues(planOptions(CudaEpiloguesOptions{})));
    }
    pm.addPass(createCudaRowFormats(planOptions(CudaRowFormatsOptions{})));
    if (options.cudaTarget) {
      pm.addPass(
          createCudaGemmVariants(planOptions(CudaGemmVariantsOptions{})));
      pm.addPass(
          createCudaAttentionForms(planOptions(CudaAttentionFormsOptions{})));
      pm.addPass(createCudaScanForms(planOptions(CudaScanFormsOptions{})));
      pm.addPass(createCudaLaunchTiles(planOptions(CudaLaunchTilesOptions{})));
      pm.addPass(createCudaCoLaunches(planOptions(CudaCoLaunchesOptions{})));
      pm.addPass(
          createCudaKernelScratch(planOptions(CudaKernelScratchOptions{})));
    }
    pm.addPass(createPlanMemory(planOptions(PlanMemoryOptions{})));
  }
}

void registerDialects(mlir::DialectRegistry &registry) {
  registry.insert<mlir::nf::NfDialect, mlir::nf_kv::NfKvDialect,
                  mlir::nf_moe::NfMoeDialect, mlir::func::FuncDialect>();
}

} // namespace nf::compiler
