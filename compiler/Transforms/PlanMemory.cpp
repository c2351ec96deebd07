//===- PlanMemory.cpp - every buffer of a step in one arena ---------------===//
//
// Every kernel result of a step is a buffer in one arena. A buffer lives from
// the kernel that writes it to the last kernel (or return) that reads it.
// Buffers are placed first-fit in decreasing size order; two buffers share
// bytes only if their live ranges are disjoint. After them come the regions
// that follow from earlier passes' decisions: kernel-internal values, the
// bf16 copies of rows (nf-cuda-row-formats), the expert statistics and the
// scratch regions of the CUDA kernels (nf-cuda-kernel-scratch) (Passes.td
// says where each is recorded).
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "nf/IR/NfOps.h"

#include "mlir/IR/Builders.h"

#include <algorithm>

namespace nf::compiler {
#define GEN_PASS_DEF_PLANMEMORY
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;

namespace nf::compiler {
namespace {

struct Buffer {
  nfir::KernelOp kernel;
  unsigned result;
  int64_t bytes;
  int64_t begin, end; // live range in kernel indices, inclusive
  int64_t offset = -1;
};

int64_t alignTo(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

constexpr llvm::StringLiteral kCopyOffsetAttr = "nf.copy_offset";

struct PlanMemoryPass : impl::PlanMemoryBase<PlanMemoryPass> {
  using Base::Base;

  void runOnOperation() override {
    if (alignment <= 0 || (alignment & (alignment - 1))) {
      getOperation().emitError()
          << "nf-plan-memory: alignment must be a power of two";
      return signalPassFailure();
    }
    clearDecision(getOperation(), kKernelScratchOffsetsAttr);
    clearDecision(getOperation(), kAfterStepScratchOffsetsAttr);
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      StringRef phase = stepPhase(func);
      if (phase.empty())
        continue;
      int64_t rows = phase == "decode" ? maxSequences : maxTokens;
      if (rows <= 0) {
        func.emitOpError() << "max tokens must be positive, got " << rows;
        return signalPassFailure();
      }
      if (failed(plan(func, rows)))
        return signalPassFailure();
    }
  }

  /// Bytes of `v`, computed by `def`, with `rows` tokens.
  FailureOr<int64_t> valueBytes(Value v, Operation *def, int64_t rows) {
    // Expert FFN rows are (token, expert) assignments: tokens * top-k.
    if (auto d = dyn_cast<moe::DispatchType>(v.getType())) {
      // permutation + token of each assignment + per-expert offsets (i32).
      int64_t assignments = rows * d.getMaxPerToken();
      return 4 * (2 * assignments + d.getNumExperts() + 1);
    }
    auto type = dyn_cast<RankedTensorType>(v.getType());
    if (!type || !type.getElementType().isIntOrFloat())
      return emitError(v.getLoc())
             << "value of type " << v.getType() << " has no known size";
    int64_t dynamicRows = rows;
    if (isa_and_nonnull<moe::ExpertUpOp, moe::ExpertDownOp>(def))
      dynamicRows *= cast<moe::DispatchType>(def->getOperand(1).getType())
                         .getMaxPerToken();
    int64_t elements = 1;
    for (int64_t d : type.getShape())
      elements *= ShapedType::isDynamic(d) ? dynamicRows : d;
    return elements * ((type.getElementTypeBitWidth() + 7) / 8);
  }

  /// Bytes of the `index`-th result of `kernel`, with `rows` tokens.
  FailureOr<int64_t> bufferBytes(nfir::KernelOp kernel, unsigned index,
                                 int64_t rows) {
    auto yield = cast<nfir::YieldOp>(kernel.getBody().front().getTerminator());
    Operation *def = yield.getValues()[index].getDefiningOp();
    auto bytes = valueBytes(kernel.getResult(index), def ? def : kernel, rows);
    if (failed(bytes))
      return kernel.emitOpError() << "result " << index << " has no known size";
    return bytes;
  }

  LogicalResult plan(func::FuncOp func, int64_t rows) {
    SmallVector<nfir::KernelOp> kernels(
        func.getBody().front().getOps<nfir::KernelOp>());
    llvm::DenseMap<Operation *, int64_t> index;
    for (auto [i, k] : llvm::enumerate(kernels))
      index[k] = i;
    const int64_t returnIndex = kernels.size();

    std::vector<Buffer> buffers;
    for (auto [i, kernel] : llvm::enumerate(kernels))
      for (unsigned r = 0; r < kernel.getNumResults(); ++r) {
        auto bytes = bufferBytes(kernel, r, rows);
        if (failed(bytes))
          return failure();
        int64_t end = i;
        for (Operation *user : kernel.getResult(r).getUsers()) {
          auto it = index.find(user);
          end = std::max(end, it == index.end() ? returnIndex : it->second);
        }
        buffers.push_back(
            {kernel, r, alignTo(*bytes, alignment), (int64_t)i, end});
      }

    // First fit, largest first; ties by start so the result is deterministic.
    std::vector<Buffer *> order;
    for (Buffer &b : buffers)
      order.push_back(&b);
    std::stable_sort(order.begin(), order.end(), [](Buffer *a, Buffer *b) {
      return a->bytes != b->bytes ? a->bytes > b->bytes : a->begin < b->begin;
    });
    std::vector<Buffer *> placed;
    int64_t arena = 0, noReuse = 0;
    for (Buffer *buf : order) {
      std::vector<std::pair<int64_t, int64_t>> busy;
      for (Buffer *p : placed)
        if (p->begin <= buf->end && buf->begin <= p->end)
          busy.push_back({p->offset, p->offset + p->bytes});
      std::sort(busy.begin(), busy.end());
      int64_t offset = 0;
      for (auto [lo, hi] : busy) {
        if (offset + buf->bytes <= lo)
          break;
        offset = std::max(offset, hi);
      }
      buf->offset = offset;
      placed.push_back(buf);
      arena = std::max(arena, offset + buf->bytes);
      noReuse += buf->bytes;
    }

    // The invariant the runtime relies on, checked rather than assumed.
    for (const Buffer &x : buffers)
      for (const Buffer &y : buffers)
        if (&x < &y && x.begin <= y.end && y.begin <= x.end &&
            x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes)
          return nfir::KernelOp(x.kernel).emitOpError()
                 << "memory plan overlaps two live buffers (internal error)";

    Builder b(func.getContext());
    for (nfir::KernelOp kernel : kernels) {
      SmallVector<int64_t> offsets;
      for (const Buffer &buf : buffers)
        if (buf.kernel == kernel)
          offsets.push_back(buf.offset);
      kernel.setArenaOffsetsAttr(b.getDenseI64ArrayAttr(offsets));
    }
    func->setAttr("nf.arena_bytes", b.getI64IntegerAttr(arena));
    func->setAttr("nf.no_reuse_bytes", b.getI64IntegerAttr(noReuse));
    func->setAttr("nf.max_tokens", b.getI64IntegerAttr(rows));
    return placeRegions(func, kernels, buffers, arena, rows);
  }

  /// Places the scratch regions `op` lists in `sizesAttr` (if any) from
  /// `top` on, in order; records them in `offsetsAttr` and moves `top` past
  /// them.
  LogicalResult placeScratch(Operation &op, StringRef sizesAttr,
                             StringRef offsetsAttr, int64_t &top) {
    auto bytes = op.getAttrOfType<DenseI64ArrayAttr>(sizesAttr);
    if (!bytes)
      return success();
    SmallVector<int64_t> offsets;
    for (int64_t n : bytes.asArrayRef()) {
      if (n <= 0)
        return op.emitOpError()
               << sizesAttr << ": a region of " << n << " bytes";
      offsets.push_back(alignTo(top, alignment));
      top = offsets.back() + alignTo(n, alignment);
    }
    op.setAttr(offsetsAttr,
               Builder(op.getContext()).getDenseI64ArrayAttr(offsets));
    return success();
  }

  /// The regions after the kernel results (Passes.td).
  LogicalResult placeRegions(func::FuncOp func,
                             ArrayRef<nfir::KernelOp> kernels,
                             ArrayRef<Buffer> results, int64_t arena,
                             int64_t rows) {
    Builder b(func.getContext());
    // Offsets and bytes of the values inside the kernels: the results as
    // placed (their yielded values), then the internal ones.
    llvm::DenseMap<Value, int64_t> offsetOf, bytesOf;
    for (const Buffer &buf : results) {
      nfir::KernelOp kernel = buf.kernel;
      Value v = cast<nfir::YieldOp>(kernel.getBody().front().getTerminator())
                    .getValues()[buf.result];
      offsetOf[v] = buf.offset;
      bytesOf[v] = buf.bytes;
    }
    // Kernel-internal values: each kernel's after the results, in op order;
    // every kernel starts again at the same place.
    int64_t scratch = 0;
    llvm::DenseMap<Operation *, int64_t> internalEnd; // per kernel
    for (nfir::KernelOp kernel : kernels) {
      SmallVector<int64_t> offsets;
      int64_t used = 0;
      for (Value v : kernel.internalValues()) {
        auto bytes = valueBytes(v, v.getDefiningOp(), rows);
        if (failed(bytes))
          return failure();
        offsets.push_back(arena + used);
        offsetOf[v] = arena + used;
        bytesOf[v] = alignTo(*bytes, alignment);
        used += bytesOf[v];
      }
      kernel.setScratchOffsetsAttr(b.getDenseI64ArrayAttr(offsets));
      internalEnd[kernel] = arena + used;
      scratch = std::max(scratch, used);
    }
    func->setAttr("nf.scratch_bytes", b.getI64IntegerAttr(scratch));

    // The bf16 copies: half the bytes, at half the offset.
    const int64_t copies = alignTo(arena + scratch, alignment);
    int64_t reserved = 0;
    for (nfir::KernelOp kernel : kernels)
      kernel.getBody().walk([&](Operation *op) {
        auto format = op->getAttrOfType<StringAttr>(kRowFormatAttr);
        if (!format || format.getValue() != "f32+bf16" ||
            op->getNumResults() != 1)
          return;
        Value v = op->getResult(0);
        const int64_t at = copies + offsetOf.lookup(v) / 2;
        op->setAttr(kCopyOffsetAttr, b.getI64IntegerAttr(at));
        reserved = std::max(
            reserved, alignTo(at + (bytesOf.lookup(v) + 1) / 2, alignment));
      });

    // The expert statistics: per select (layer l of L), counts i32 [rows]
    // then, after all counts, experts i32 [rows, k]; the runtime reads
    // docs/cuda.md's layout.
    if (expertStats) {
      int64_t layers = 0, maxK = 0;
      for (nfir::KernelOp kernel : kernels)
        kernel.getBody().walk([&](moe::SelectOp select) {
          if (select->getNumResults() != 3)
            return;
          ++layers;
          auto experts = cast<ShapedType>(select->getResult(0).getType());
          int64_t k = 1;
          for (int64_t d : experts.getShape().drop_front())
            k *= d;
          maxK = std::max(maxK, k);
        });
      if (layers > 0) {
        const int64_t offset =
            alignTo(std::max(arena + scratch, reserved), alignment);
        func->setAttr("nf.expert_stats_offset", b.getI64IntegerAttr(offset));
        reserved = offset + alignTo(4 * layers * rows * (1 + maxK), alignment);
      }
    }
    func->setAttr("nf.reserved_bytes", b.getI64IntegerAttr(reserved));

    // The kernels' scratch regions: a kernel's run only while it does, so
    // each kernel's start after everything above and its own internal
    // values, and every kernel reuses the same bytes. Then the regions used
    // after the step: after all of them, never reused.
    const int64_t regionsEnd = std::max(arena, reserved);
    int64_t end = std::max(arena + scratch, reserved);
    for (nfir::KernelOp kernel : kernels) {
      int64_t top = std::max(regionsEnd, internalEnd.lookup(kernel));
      for (Operation &op : kernel.getBody().front())
        if (failed(placeScratch(op, kKernelScratchAttr,
                                kKernelScratchOffsetsAttr, top)))
          return failure();
      end = std::max(end, top);
    }
    for (nfir::KernelOp kernel : kernels)
      for (Operation &op : kernel.getBody().front())
        if (failed(placeScratch(op, kAfterStepScratchAttr,
                                kAfterStepScratchOffsetsAttr, end)))
          return failure();
    func->setAttr("nf.kernel_scratch_end", b.getI64IntegerAttr(end));
    return success();
  }
};

} // namespace
} // namespace nf::compiler
