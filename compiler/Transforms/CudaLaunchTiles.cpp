//===- CudaLaunchTiles.cpp - the tiles of shape-dependent CUDA launches ---===//
//
// Chooses the tiles of the CUDA launches whose shapes depend on the step's
// tokens and the target (Passes.td), and records them on the ops: a routed
// MoE router's logits (`nf.router_logits`, `nf.router_tiles`), the feature
// tile of the warp-specialised prefill GEMMs (`nf.gemm_ws_tiles`) and the
// walk of an SSM scan or update (`nf.walk_tile`). The CUDA code
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
    clearDecision(module, kGemmWsTilesAttr);
    for (auto func : module.getOps<func::FuncOp>()) {
      const StringRef phase = stepPhase(func);
      if (phase.empty())
        continue;
      func.walk([&](Operation *op) {
        markGemmTiles(*op);
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

  /// The feature tile of each GEMM on the bf16-plane path that runs the
  /// warp-specialised wgmma GEMM (every target sm_90, one bf16 term, its
  /// stages in shared memory; a loading warpgroup and two multiplying ones,
  /// one block an SM): 499-508 TFLOP/s on the Nano shapes on the H200
  /// against 441-472 for wgmma_tile (bench/kernels/gemm_tiles.cu). Tiles of
  /// 256 features, or 192 or 128 where 256 rounds the features up by enough
  /// more to outweigh their lower rates (0.95x and 0.84x on the H200).
  void markGemmTiles(Operation &op) {
    const SmallVector<StringRef, 2> paths = gemmPaths(op);
    if (!llvm::is_contained(paths, "bf16_planes"))
      return;
    const SmallVector<Value, 2> weights = gemmWeights(op);
    SmallVector<int64_t, 2> tiles;
    for (auto [i, path] : llvm::enumerate(paths)) {
      int64_t tile = 0;
      if (path == "bf16_planes" && wgmma && matmulTerms == 1 &&
          i < weights.size()) {
        // Features: a stacked weight's rows ([experts, out, in]).
        auto w = dyn_cast<RankedTensorType>(weights[i].getType());
        const int64_t n =
            w && w.getRank() >= 2 ? w.getShape()[w.getRank() - 2] : 0;
        tile = wsTileN(n);
        if (shapes::wsGemmSmem(tile) + shapes::kStaticSharedAllowance >
            maxSharedBytes)
          tile = 0;
      }
      tiles.push_back(tile);
    }
    Builder b(&getContext());
    op.setAttr(kGemmWsTilesAttr, b.getDenseI64ArrayAttr(tiles));
  }

  static int64_t wsTileN(int64_t n) {
    auto rounded = [&](int64_t tile) {
      return double((n + tile - 1) / tile * tile);
    };
    const double cost256 = rounded(256), cost192 = rounded(192) / 0.95,
                 cost128 = rounded(128) / 0.84;
    if (cost128 < std::min(cost192, cost256))
      return 128;
    return cost192 < cost256 ? 192 : 256;
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
