//===- CudaLaunchTiles.cpp - the tiles of shape-dependent CUDA launches ---===//
//
// Chooses the tiles of the CUDA launches whose shapes depend on the step's
// tokens and the target (Passes.td), and records them on the ops: a routed
// MoE router's logits (`nf.router_logits`, `nf.router_tiles`) and the walk of
// an SSM scan or update (`nf.walk_tile`). The CUDA code
// generator (compiler/Target/Cuda/Emit*.cpp) launches the tiles it is given
// over the grid they imply, and fails where the target does not allow them;
// both size the kernels by compiler/Target/Cuda/KernelShapes.h.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "Target/Cuda/KernelShapes.h"
#include "nf_kv/IR/NfKvOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"

#include <algorithm>

namespace nf::compiler {
#define GEN_PASS_DEF_CUDALAUNCHTILES
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;
namespace shapes = ::nf::codegen::shapes;

namespace nf::compiler {
namespace {

struct CudaLaunchTiles : impl::CudaLaunchTilesBase<CudaLaunchTiles> {
  using CudaLaunchTilesBase::CudaLaunchTilesBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    clearDecision(module, kRouterLogitsAttr);
    clearDecision(module, kRouterTilesAttr);
    clearDecision(module, kWalkTileAttr);
    for (auto func : module.getOps<func::FuncOp>()) {
      const StringRef phase = stepPhase(func);
      if (phase.empty())
        continue;
      func.walk([&](Operation *op) {
        if (isa<moe::RouterOp>(op) && routesWithSelect(*op))
          markRouter(cast<moe::RouterOp>(op), phase == "decode");
        else if (auto scan = dyn_cast<kv::SSMScanOp>(op))
          markWalk(module, op, scan.getStateAttr());
        else if (auto update = dyn_cast<kv::SSMUpdateOp>(op))
          markWalk(module, op, update.getStateAttr());
      });
    }
  }

  /// A routed router's logits. Decode: a warp per (token, expert). Prefill
  /// with bf16 inputs on the plane path: the logits GEMM (products exact,
  /// sums in f32, as bf16 frameworks compute them). Else tiles of tokens x
  /// experts in f64, on f64 tensor cores (sm_80+) where their slices fit
  /// static shared memory: 16 tokens a block up to 2048 tokens, then 32
  /// (bench/kernels/router_check.cu, H200, Nano shape: 0.145 ms for 1000
  /// tokens and 0.299 for 8192, against 0.186 and 0.653 for the f64 tiles;
  /// the same sums, products being exact). The f64 tiles: 16 x 32 for short
  /// prompts, so that every SM gets work; 32 x 64 for long ones, which
  /// reuse each staged value more.
  void markRouter(moe::RouterOp op, bool decode) {
    Builder b(&getContext());
    auto form = [&](StringRef f) {
      op->setAttr(kRouterLogitsAttr, b.getStringAttr(f));
    };
    if (decode)
      return form("warp");
    const SmallVector<StringRef, 2> paths = gemmPaths(*op);
    if (matmulTerms == 1 && ampereOrLater && !paths.empty() &&
        paths.front() == "bf16_planes")
      return form("gemm");
    const int64_t experts = dimOf(op.getOperand(1), 0);
    const bool dmma = ampereOrLater && shapes::routerDmmaFits(16, experts) &&
                      shapes::routerDmmaFits(32, experts);
    // Each launch: [tokens, experts] of a block (experts 0: all), and the
    // step sizes it runs for, [first, last] (0: unbounded).
    SmallVector<Attribute, 2> tiles;
    auto tile = [&](int64_t tokens, int64_t tileExperts, int64_t first,
                    int64_t last) {
      tiles.push_back(
          b.getDenseI64ArrayAttr({tokens, tileExperts, first, last}));
    };
    const int64_t small = shapes::kRouterSmallTileTokens;
    if (maxTokens <= small) {
      tile(16, dmma ? 0 : 32, 0, 0);
    } else {
      tile(16, dmma ? 0 : 32, 0, small);
      tile(32, dmma ? 0 : 64, small + 1, 0);
    }
    form(dmma ? "dmma" : "tiles");
    op->setAttr(kRouterTilesAttr, b.getArrayAttr(tiles));
  }

  /// The walk of an SSM op that walks its tokens (prefill scans not in
  /// SSD's matrix form; updates without ssm_decode's warp layout): the most
  /// head channels a block of at most 128 threads takes (a divisor of the
  /// head's), and as many tokens a staged chunk as static shared memory
  /// holds (at most 32). Updates stage one: chunks sized for prefill (11
  /// tokens at the Nano shape, 42 KB a block) would limit them to 5 blocks
  /// an SM.
  void markWalk(ModuleOp module, Operation *op, SymbolRefAttr stateRef) {
    auto decl = dyn_cast_or_null<kv::MambaStateOp>(
        SymbolTable::lookupSymbolIn(module, stateRef));
    if (!decl)
      return;
    kv::MambaStateType state = decl.getType();
    const int64_t P = state.getHeadDim(), N = state.getStateSize();
    const bool update = isa<kv::SSMUpdateOp>(op);
    if (P <= 0 || N <= 0)
      return;
    auto form = op->getAttrOfType<StringAttr>(kScanFormAttr);
    if (update ? shapes::ssmDecodeFits(state.getNumHeads(), P, N,
                                       state.getConvDim())
               : form && form.getValue() == "ssd")
      return;
    const int64_t threads = shapes::ssmThreadsPerChannel(N);
    int64_t channels = P;
    while (channels > 1 && (P % channels != 0 || channels * threads > 128))
      --channels;
    const int64_t tokens =
        update
            ? 1
            : std::clamp<int64_t>(shapes::kSsmWalkSharedBytes /
                                      shapes::ssmWalkBytesPerToken(channels, N),
                                  1, 32);
    Builder b(&getContext());
    op->setAttr(kWalkTileAttr, b.getDenseI64ArrayAttr({channels, tokens}));
  }
};

} // namespace
} // namespace nf::compiler
