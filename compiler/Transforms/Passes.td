//===- Passes.td - nf compiler passes ----------------------*- tablegen -*-===//
//
// The lowering pipeline, in order: (compile-time quantisation) quantize
// weights, outline steps, lower mixers, lower MoE,
// pack weights, fuse kernels, (CUDA target) row formats, plan memory. Each
// pass keeps the IR verifying.
//
//===----------------------------------------------------------------------===//

#ifndef NF_TRANSFORMS_PASSES_TD
#define NF_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def QuantizeWeights : Pass<"nf-quantize-weights", "mlir::ModuleOp"> {
  let summary = "Chooses the weights a plan stores quantised (compile-time quantisation)";
  let description = [{
    `nfc compile --weights=fp8|int4`: marks unquantised f32/bf16/f16
    linear-projection weights to be stored quantised, round to nearest,
    weight only (`activations = none`):
    - `fp8`: E4M3 codes with one f32 scale per output channel (row),
      `s = max|W[r, :]| / 448`, as llm-compressor's FP8_DYNAMIC weights;
    - `int4`: symmetric int4 codes in [-8, 7] packed 8 per i32, one f32
      scale per row and group of `group-size` input columns,
      `s = max|group| / 7.5`, as compressed-tensors' W4A16. Where the group
      size does not divide a weight's input columns, the largest power of
      two below it that does (at least 8) is used; a weight with none stays
      unquantised.
    `scope=experts` quantises the routed experts' stacked weights only;
    `scope=all` also the Mamba, attention, MLP, shared-expert and latent
    projections. Embeddings, the LM head, routers, norms and convolutions
    are never quantised, nor weights a checkpoint already quantised.
    Each chosen weight gets its `#nf.quant`, code element type and new
    tensor names (`<source>.nfc_<scheme>`, scales `..._scale`; a stacked
    expert tensor becomes one tensor per expert), and `nf.quantize_from`,
    the source tensors the codes are computed from when the plan is written
    (compiler/Plan/QuantizedWeights.cpp). Runs before packing, so packed
    q/k/v keep one scale tensor per part.
  }];
  let options = [
    Option<"scheme", "scheme", "std::string", /*default=*/"\"fp8\"",
           "Code format: fp8 (E4M3, per output channel) or int4 (per group)">,
    Option<"scope", "scope", "std::string", /*default=*/"\"experts\"",
           "Which weights: experts (routed experts) or all (every linear "
           "projection)">,
    Option<"groupSize", "group-size", "int64_t", /*default=*/"128",
           "int4: input columns per scale">,
  ];
}

def OutlineSteps : Pass<"nf-outline-steps", "mlir::ModuleOp"> {
  let summary = "Turns each nf.model into prefill and decode step functions";
  let description = [{
    A model describes one whole sequence; the runtime executes steps over a
    batch of sequences. Each `nf.model` becomes `func.func @prefill` and
    `func.func @decode` taking the step's token ids, its `!nf_kv.batch` and
    the per-token expert budget, and returning logits. The model's
    attributes move to the module as `nf.model`.
  }];
  let dependentDialects = ["mlir::func::FuncDialect", "mlir::nf_kv::NfKvDialect"];
}

def LowerMixers : Pass<"nf-lower-mixers", "mlir::ModuleOp"> {
  let summary = "Lowers Mamba2, attention and MLP mixers to nf_kv and compute ops";
  let description = [{
    Declares the per-layer storage (`nf_kv.mamba_state`, `nf_kv.kv_cache`)
    and rewrites each mixer of a step function for its phase: Mamba2 into
    in_proj, split, causal conv, SSM update (decode) or chunked scan
    (prefill), gated norm and out_proj; attention into projections, K/V
    append, attend and o_proj; the MLP into linear, relu2, linear.
  }];
  let options = [
    Option<"maxSequences", "max-sequences", "int64_t", /*default=*/"64",
           "Recurrent-state slots (sequences in flight)">,
    Option<"pageSize", "page-size", "int64_t", /*default=*/"16",
           "Tokens per KV-cache page">,
    Option<"kvPages", "kv-pages", "int64_t", /*default=*/"4096",
           "KV-cache pages per attention layer">,
    Option<"kvDtype", "kv-dtype", "std::string", /*default=*/"\"f32\"",
           "What the KV cache stores: f32, bf16 or fp8 (E4M3, a scale per "
           "token and kv head)">,
    Option<"kvHotWindow", "kv-hot-window", "int64_t", /*default=*/"0",
           "fp8 caches: the last positions of a sequence whose pages stay "
           "bf16 (a tiered cache); 0: none">,
  ];
  let dependentDialects = ["mlir::nf_kv::NfKvDialect"];
}

def LowerMoE : Pass<"nf-lower-moe", "mlir::ModuleOp"> {
  let summary = "Lowers nf.moe to router, run-time selection, dispatch, grouped experts and combine";
  let options = [
    Option<"policy", "policy", "std::string", /*default=*/"\"topk\"",
           "Expert selection policy: topk or budget">,
    Option<"minK", "min-k", "int64_t", /*default=*/"1",
           "Fewest experts per token the budget policy may use">,
  ];
  let dependentDialects = ["mlir::nf_moe::NfMoeDialect"];
}

def PackWeights : Pass<"nf-pack-weights", "mlir::ModuleOp"> {
  let summary = "Fuses linears that share an input into one over concatenated weights";
  let description = [{
    A weight layout decision: q/k/v projections reading the same input
    become one GEMM over a `concat_rows` weight followed by a split. The
    runtime packs the concatenated weight at load time. Quantised weights
    are concatenated only with weights quantised the same way (scheme,
    granularity, activation scheme, scale dtype), and the packed weight's
    `#nf.quant` lists every part's scales in order.
  }];
}

def FuseKernels : Pass<"nf-fuse-kernels", "mlir::ModuleOp"> {
  let summary = "Groups the compute ops of each step into nf.kernel regions";
  let description = [{
    One region per future GPU kernel: residual add + RMSNorm; router +
    selection + dispatch; expert up-projection + relu2; down-projection +
    weighted combine; Mamba2 conv + SSM update + gated norm (decode); the
    chunked SSD scan (prefill); QKV projection + split + K/V append. Every
    other compute op gets a kernel of its own. Weights stay outside as
    kernel operands.
  }];
}

def PlanMemory : Pass<"nf-plan-memory", "mlir::ModuleOp"> {
  let summary = "Places every buffer of a step in its arena";
  let description = [{
    The one memory planner: every byte a step uses is placed here, after
    the passes that decide what needs memory.

    - Kernel results: each dynamic dimension bounded by the step's maximum
      tokens (expert assignments: tokens times top-k), placed first-fit in
      decreasing size order so that buffers with overlapping live ranges
      never overlap; `arena_offsets` on each kernel, `nf.arena_bytes` and
      `nf.no_reuse_bytes` on the step.
    - Kernel-internal values (computed and consumed inside one region):
      after the results, in op order, reused by every kernel;
      `scratch_offsets` on each kernel, `nf.scratch_bytes` on the step.
    - The bf16 copies of rows that `nf-cuda-row-formats` marked "f32+bf16":
      a value at offset o has its copy at the copies' base + o / 2 (values
      live together have disjoint offsets, so their copies are disjoint);
      `nf.copy_offset` on the producer.
    - With `expert-stats`, the CUDA steps' expert statistics region (each
      `nf_moe.select`'s counts and experts, read back after the step):
      `nf.expert_stats_offset` on the step.

    - The scratch regions of the ops' kernels (`nf.kernel_scratch`, from
      `nf-cuda-kernel-scratch`): each kernel's after the regions above and
      its own internal values, in op order, every kernel starting again
      there; `nf.kernel_scratch_offsets` on each op. Then the regions used
      after the step (`nf.after_step_scratch`), never reused:
      `nf.after_step_scratch_offsets`. The end of every region of the step,
      `nf.kernel_scratch_end`, on the step.

    `nf.reserved_bytes` on the step ends the copies and the statistics
    region (0: neither).
  }];
  let options = [
    Option<"maxTokens", "max-tokens", "int64_t", /*default=*/"2048",
           "Most tokens in one prefill step">,
    Option<"maxSequences", "max-sequences", "int64_t", /*default=*/"64",
           "Most sequences (tokens) in one decode step">,
    Option<"alignment", "alignment", "int64_t", /*default=*/"256",
           "Byte alignment of every buffer">,
    Option<"expertStats", "expert-stats", "bool", /*default=*/"false",
           "Reserve the expert statistics region (CUDA steps)">,
  ];
}

def CudaGemmPaths : Pass<"nf-cuda-gemm-paths", "mlir::ModuleOp"> {
  let summary = "Chooses the CUDA GEMM path of each op that multiplies by weights";
  let description = [{
    Marks every op inside `nf.kernel` regions that runs GEMMs over weights
    (`nf.linear`, `nf.lm_head`, `nf_moe.latent_proj`, `nf_moe.expert_up`,
    `nf_moe.expert_down`, the logits of `nf_moe.router`: one;
    `nf_moe.shared_expert`: its up, then its down projection) with
    `nf.gemm_paths`, one string per GEMM:
    - `"bf16_planes"`: outside decode steps, unquantised bf16 weights and K
      a multiple of 8: the input rows are split into bf16 planes (one per
      term of the matmul inputs, or stored as bf16 rows by their producer)
      and multiplied on tensor cores in tiles (wgmma on sm_90a).
    - `"bf16_skinny"`: decode steps, unquantised bf16 weights or FP8 E4M3
      codes (widened to bf16 as they are loaded, exactly; each output then
      scaled by its row's scale) and K a multiple of 32: the skinny
      tensor-core GEMVs (weights as mma's A operand), whose wide variants
      may stream a bf16 copy of the rows (not for routers).
    - `"int4_rows"`: every step of int4 codes with group scales (not for
      routers), on any target: a warp per item of rows and features on
      CUDA cores, the codes dequantised in registers.
    - `"other"`: the f32 paths (f32 and f16 weights, and quantised codes
      outside decode), chosen by the code generator;
      also every GEMM of targets before sm_80 (`ampere-or-later` off: the
      two tensor-core paths need mma.sync's bf16 shapes).
    Marks each decode step function with `nf.skinny_narrow_tokens` (16):
    steps of 2 to that many tokens run the narrow skinny variants (items of
    16 rows reading f32 rows), longer steps the wide variants, which stream
    bf16 copies of their rows; one-token steps run row GEMVs.
    `nf-cuda-row-formats` and the CUDA code generator read these decisions
    instead of making them again.
  }];
  let options = [
    Option<"ampereOrLater", "ampere-or-later", "bool", /*default=*/"true",
           "Every target is sm_80 or later (mma.sync's bf16 shapes)">,
  ];
}

def CudaGemmVariants : Pass<"nf-cuda-gemm-variants", "mlir::ModuleOp"> {
  let summary = "Chooses the kernel of each skinny GEMM in wide decode steps";
  let description = [{
    In decode steps that can be longer than their `nf.skinny_narrow_tokens`
    (`max-sequences` more), marks every op with `nf.gemm_paths` with
    `nf.gemm_wide_variants`, one string per GEMM: the kernel its longer
    steps run.
    - `"feature_tiles"`: an LM head of bf16 weights whose result no op
      reads (it computes only the logit rows) and whose input has a bf16 copy
      (`nf-cuda-row-formats`): tiles of 128 features whose rows are staged
      once in shared memory.
    - `"tma"`: another single dense bf16 weight (`nf.linear`, `nf.lm_head`,
      `nf_moe.latent_proj`) whose input has a bf16 copy, every target sm_90
      or later: weights and rows streamed into shared memory by TMA.
    - `"skinny_rows32"`: a dense weight of more than two 32-feature columns
      an SM: skinny items of up to 32 rows, each weight tile read once.
    - `"skinny"`: the skinny GEMV's wide variant (routed experts, the shared
      expert beside them, other dense weights).
    - `"none"`: a GEMM not on the `"bf16_skinny"` path.
    And `nf.gemm_wide_warps`, one per GEMM: the warps a block of the skinny
    variants' wide items, 4 (four blocks an SM) for the routed experts, the
    shared expert and dense weights of at least a 32-feature column an SM,
    else 8 (two an SM); 0 for a GEMM not on the skinny path.
    The CUDA code generator emits the variant it is given.
  }];
  let options = [
    Option<"maxSequences", "max-sequences", "int64_t", /*default=*/"64",
           "Most tokens in one decode step">,
    Option<"smCount", "sm-count", "int64_t", /*default=*/"132",
           "Streaming multiprocessors the launch grids are sized for">,
    Option<"hopperOrLater", "hopper-or-later", "bool", /*default=*/"false",
           "Every target is sm_90 or later (TMA)">,
  ];
}

def CudaEpilogues : Pass<"nf-cuda-epilogues", "mlir::ModuleOp"> {
  let summary = "Chooses the ops CUDA launches compute in their epilogues";
  let description = [{
    Marks every op inside an `nf.kernel` region whose next ops its launch
    computes as it stores its result with `nf.epilogue`, the names of those
    ops in order (ops in an epilogue get no mark of their own). For
    `nf.linear`, `nf.lm_head` and `nf_moe.latent_proj`:
    - `["nf.split", "nf_kv.append"]`: the split of its result, then the
      append of two of the pieces into an f32 KV cache (the K/V rows are
      stored into their pages as they are computed);
    - `["nf.split", "nf_kv.causal_conv"]` (decode steps): the split, then
      the decode conv of a piece (each channel's conv computed as its
      column is stored);
    - `["nf.split"]`: the split of its result (each piece stored directly);
    - `["nf.activation"]`: an activation of its result.
    For other ops:
    - `nf.add`: `["nf.rms_norm"]`, the norm of the sum (one row kernel);
    - `nf_moe.shared_expert`: `["nf.add"]`, the add of its result to
      another row where nothing else reads its result (the down
      projection's epilogue stores the sum);
    - `nf_moe.combine`: `["nf.add", "nf.add", "nf.rms_norm"]`, the add of
      the shared expert's rows, the residual add and the norm of the sum,
      where nothing else reads the combined rows or the first sum (one row
      kernel a token);
    - `nf_kv.ssm_update` (decode, every target sm_90 or later):
      `["nf.gated_rms_norm"]`, the gated norm of its result over the state's
      groups where nothing else reads the result and the state's tiling
      allows (a thread block cluster per (sequence, group), a block per
      head, the norm over distributed shared memory). Such a launch runs
      only in steps whose clusters fit the GPU at a block an SM, up to
      `nf.epilogue_max_tokens` (sm-count / heads) tokens; longer steps
      launch the norm after the update.
    The CUDA code generator emits those ops in the producer's launch and
    fails where the mark and the ops differ.
  }];
  let options = [
    Option<"smCount", "sm-count", "int64_t", /*default=*/"132",
           "Streaming multiprocessors the launch grids are sized for">,
    Option<"hopperOrLater", "hopper-or-later", "bool", /*default=*/"false",
           "Every target is sm_90 or later (thread block clusters)">,
  ];
}

def CudaAttentionForms : Pass<"nf-cuda-attention-forms", "mlir::ModuleOp"> {
  let summary = "Chooses the CUDA kernel form of each attention";
  let description = [{
    Marks every `nf_kv.attend` of a step with `nf.attention_form`, the
    kernels its launches run (kernels/nf_attention.cuh):
    - decode, split-context flash decoding and a combine:
      - `"split_mma"`: a warp per (token, kv head, split) whose query heads
        are one tensor-core tile (every target sm_80 or later, at most 16
        query heads a kv head, head_dim a multiple of 16, the K/V tiles
        within the targets' shared memory);
      - `"split_gqa"`: a warp per (token, head, split) for steps of up to 3
        tokens, a warp per (token, kv head, split) for its 2 to 16 query
        heads from 4 tokens (decode steps of at least 4 tokens, the queries
        within 48 KB of static shared memory);
      - `"split"`: a warp per (token, head, split).
    - prefill:
      - `"mma"`: FlashAttention-2 on tensor cores (sm_80 or later, head_dim
        a multiple of 16 and at most 128, its tiles within the targets'
        shared memory), with `nf.attention_positions` K/V positions a tile:
        64 with bf16 inputs (the step's K/V rows rounded to bf16 once) where
        they fit, else 32;
      - `"tiles"`: a block per (query tile, kv head), K/V tiles in shared
        memory (a one-token block within 48 KB);
      - `"warp"`: a warp per (token, head).
    The CUDA code generator emits the form it is given.
  }];
  let options = [
    Option<"maxSequences", "max-sequences", "int64_t", /*default=*/"64",
           "Most tokens in one decode step">,
    Option<"bf16Inputs", "bf16-inputs", "bool", /*default=*/"false",
           "Tensor-core inputs are rounded to bf16 (one term)">,
    Option<"ampereOrLater", "ampere-or-later", "bool", /*default=*/"true",
           "Every target is sm_80 or later (mma.sync's bf16 shapes)">,
    Option<"maxSharedBytes", "max-shared-bytes", "int64_t",
           /*default=*/"232448",
           "Dynamic shared memory a block may have on every target">,
  ];
}

def CudaScanForms : Pass<"nf-cuda-scan-forms", "mlir::ModuleOp"> {
  let summary = "Chooses the CUDA kernel form of each Mamba2 scan";
  let description = [{
    Marks every prefill `nf_kv.ssm_scan` with `nf.scan_form`, the kernels
    its launches run (kernels/nf_mamba.cuh), in chunks of 256 tokens:
    - `"ssd"`: SSD's matrix form on tensor cores (ssd_chunk; every target
      sm_80 or later, head channels and state size multiples of 16, at most
      128 channels), with `nf.scan_sub_chunk` tokens a sub-chunk: 64 where
      its tiles fit the targets' shared memory, else 32. Steps longer than a
      chunk first compute each chunk's state from zero and carry the
      chunks' initial states in order (generated scratch).
    - `"chunked"`: the sequential walk, each chunk's state computed in
      parallel and carried in order (steps longer than a chunk, head
      channels a multiple of 4 and state size of 8).
    - `"sequential"`: the walk over each sequence's tokens.
    The CUDA code generator emits the form it is given.
  }];
  let options = [
    Option<"maxTokens", "max-tokens", "int64_t", /*default=*/"2048",
           "Most tokens in one prefill step">,
    Option<"matmulTerms", "matmul-terms", "int64_t", /*default=*/"3",
           "bf16 terms of each tensor-core product (1: bf16 inputs)">,
    Option<"ampereOrLater", "ampere-or-later", "bool", /*default=*/"true",
           "Every target is sm_80 or later (mma.sync's bf16 shapes)">,
    Option<"maxSharedBytes", "max-shared-bytes", "int64_t",
           /*default=*/"232448",
           "Dynamic shared memory a block may have on every target">,
  ];
}

def CudaLaunchTiles : Pass<"nf-cuda-launch-tiles", "mlir::ModuleOp"> {
  let summary = "Chooses the tiles of the shape-dependent CUDA launches";
  let description = [{
    Records the tiles of the CUDA launches whose shapes depend on the step's
    tokens and the target; the code generator launches them over the grid
    they imply:
    - `nf_moe.router` routed by the `nf_moe.select` after it:
      `nf.router_logits`, the form of its logits (kernels/nf_moe.cuh):
      `"warp"` (decode: a warp per token and expert), `"gemm"` (bf16 inputs
      on the `"bf16_planes"` path: a GEMM whose epilogue computes the f64
      scores), `"dmma"` (f64 tensor cores, every target sm_80 or later, where
      a block's slices fit static shared memory) or `"tiles"` (f64 tiles of
      tokens x experts); for the last two `nf.router_tiles`, one
      `[tokens, experts, first, last]` per launch: a block's tokens and
      experts (0: all) and the step sizes it runs for (0: unbounded), 16
      tokens a block up to 2048 tokens and 32 beyond (the f64 tiles: 16 x 32
      and 32 x 64).
    - every op with a GEMM on the `"bf16_planes"` path: `nf.gemm_ws_tiles`,
      one per GEMM, the feature tile (256, 192 or 128, whichever covers the
      features at the best measured rate) of the warp-specialised wgmma
      GEMM, where every target is sm_90, the inputs are one bf16 term and
      its stages fit `max-shared-bytes`; 0 for the other GEMMs (tiles on
      wgmma or mma.sync).
    - an SSM op that walks its tokens (a prefill `nf_kv.ssm_scan` not in
      SSD's form, a decode `nf_kv.ssm_update` without ssm_decode's warps):
      `nf.walk_tile`, `[channels, tokens]`, the head channels of a block of
      at most 128 threads and the tokens a chunk staged in 44 KB of static
      shared memory (at most 32; updates one).
  }];
  let options = [
    Option<"maxTokens", "max-tokens", "int64_t", /*default=*/"2048",
           "Most tokens in one prefill step">,
    Option<"matmulTerms", "matmul-terms", "int64_t", /*default=*/"3",
           "bf16 terms of each tensor-core product (1: bf16 inputs)">,
    Option<"ampereOrLater", "ampere-or-later", "bool", /*default=*/"true",
           "Every target is sm_80 or later (mma.sync's bf16 shapes)">,
    Option<"wgmma", "wgmma", "bool", /*default=*/"true",
           "Every target is sm_90 (its cubins use wgmma)">,
    Option<"maxSharedBytes", "max-shared-bytes", "int64_t",
           /*default=*/"232448",
           "Dynamic shared memory a block may have on every target">,
  ];
}

def CudaKernelScratch : Pass<"nf-cuda-kernel-scratch", "mlir::ModuleOp"> {
  let summary = "Sizes the scratch regions of each op's CUDA kernels";
  let description = [{
    Marks every op whose CUDA kernels use memory beyond the plan's values
    with `nf.kernel_scratch`, the bytes of each region in the order the code
    generator uses them, for the step's most tokens (prefill: `max-tokens`,
    decode: `max-sequences`), from the forms the earlier CUDA passes chose:
    - a GEMM whose weight quantises its input to FP8 (`#nf.quant`
      activations): the input rows quantised and back to f32, on any path;
    - a GEMM on the `"bf16_planes"` path whose input rows are not stored as
      bf16: the rows split into the plan's bf16 terms (`matmul-terms`); then,
      for a weight of FP8 codes, the codes widened to bf16 (every element);
    - `nf_moe.shared_expert`: its hidden rows (bf16 where its down GEMM is
      on the plane path with bf16 inputs and does not quantise them), their
      bf16 copy for decode steps
      that run the wide skinny variants, then its GEMMs' planes;
    - `nf_moe.router` with its select after it: each token's f64 logit sums,
      then the planes of its logits GEMM with bf16 inputs;
    - decode `nf_kv.attend`: each context split's partial output, max and
      sum; prefill `"mma"` with bf16 inputs: the step's K and V rows as bf16;
    - `nf_kv.ssm_scan` whose steps run in more than one chunk (`"ssd"`,
      `"chunked"`): each chunk's state from zero, and its decay.
    On the op that computes a decode step's f32 logits, the top-logits
    launches the runtime runs after the step (kernels/nf_sample.cuh):
    `nf.top_logits_chunk`, the logits each block ranks (none for
    vocabularies beyond 64 chunks of 4096), and `nf.after_step_scratch`,
    their buffers (each chunk's best 64, the rows' 64 ids and values, the
    noise, the totals, the chunks' parts of the totals).
    `nf-plan-memory` places the regions (`nf.kernel_scratch_offsets`,
    `nf.after_step_scratch_offsets`).
  }];
  let options = [
    Option<"maxTokens", "max-tokens", "int64_t", /*default=*/"2048",
           "Most tokens in one prefill step">,
    Option<"maxSequences", "max-sequences", "int64_t", /*default=*/"64",
           "Most tokens in one decode step">,
    Option<"matmulTerms", "matmul-terms", "int64_t", /*default=*/"3",
           "bf16 terms of each tensor-core product (1: bf16 inputs)">,
    Option<"ampereOrLater", "ampere-or-later", "bool", /*default=*/"true",
           "Every target is sm_80 or later (mma.sync's bf16 shapes)">,
  ];
}

def CudaCoLaunches : Pass<"nf-cuda-co-launches", "mlir::ModuleOp"> {
  let summary = "Chooses the launches a decode MoE layer runs side by side";
  let description = [{
    In decode steps, for each `nf_moe.shared_expert` followed in its kernel
    by the layer's `nf_moe.router` (FuseKernels' hoisted shared experts):
    - `nf.co_launch` on the shared expert, where both its GEMMs are on the
      `"bf16_skinny"` path (`nf-cuda-gemm-paths`), the router's ranking
      (`nf_moe.select` of both its scores) follows it and it has at most 256
      experts (a co-launch's static shared memory holds both parts'):
      - `"routing"` (steps no longer than `nf.skinny_narrow_tokens`): each
        GEMV variant runs in one launch with the routing chain, the up
        projection beside the router's logits, the down projection beside
        the ranking;
      - `"routing_and_experts"` (steps can be longer, and the routed experts,
        also skinny, follow in the kernel): the narrow variants so, and the
        wide variants beside the routed experts' wide variants (the up
        projections together, then the down projections).
    - `nf.one_token_experts` (unit) on the `nf_moe.dispatch` of the routed
      experts that follow, where their GEMMs are skinny, one-token steps run
      `row_linear` (`row-linear`), the `nf_moe.combine` computes the layer's
      end in its epilogue (`nf-cuda-epilogues`) and a token has at most 8
      slots: in steps of one token, the experts read the ranking's slots
      (no dispatch) and the down projection computes the combine, both adds
      and the norm.
    Neither form is chosen where a GEMM of the layer quantises its input
    to FP8 (a launch of its own before the GEMM). The CUDA code generator
    arranges the launches so and fails where it cannot.
  }];
  let options = [
    Option<"maxSequences", "max-sequences", "int64_t", /*default=*/"64",
           "Most tokens in one decode step">,
    Option<"rowLinear", "row-linear", "bool", /*default=*/"true",
           "Decode steps of one token run row_linear">,
  ];
}

def CudaRowFormats : Pass<"nf-cuda-row-formats", "mlir::ModuleOp"> {
  let summary = "Chooses how a CUDA plan stores the activations GEMMs read";
  let description = [{
    With bf16 matmul inputs (activations rounded once to bf16 before
    tensor-core GEMMs with bf16 weights), GEMM inputs can be stored rounded
    by the ops that produce them, so that no launch rounds them first and
    fewer bytes move. Marks each such producer (inside `nf.kernel` regions)
    with `nf.row_format`:
    - `"bf16"` (prefill): its result is stored as bf16 rows instead of f32.
      A result qualifies when it is an f32 token or assignment row tensor,
      not the logits, every reader is the input of a GEMM on the
      `"bf16_planes"` path of `nf-cuda-gemm-paths` (a linear, an expert
      projection, the shared expert) or of a router with bf16 weights and K
      a multiple of 8 whose selection is in the same kernel, and its
      producer can write bf16 rows (norms, activations, linears, expert
      up-projections).
    - `"f32+bf16"` (decode steps that can be longer than their
      `nf.skinny_narrow_tokens`): its result keeps
      f32 rows and gets a bf16 copy beside them, which the wide skinny GEMM
      variants stream; narrow steps and every other reader take the f32
      rows, so results do not depend on the step's size. A result qualifies
      when it is an f32 row tensor, not the logits, read as the input of a
      GEMM on the `"bf16_skinny"` path, and its producer can
      write the copy (norms, activations, expert up-projections,
      attention).
    A GEMM whose weight quantises its input to FP8 (`#nf.quant`
    activations) reads f32 rows: it is no bf16 reader.
    The CUDA code generator stores and reads these values accordingly.
  }];
  let options = [
    Option<"bf16Inputs", "bf16-inputs", "bool", /*default=*/"false",
           "GEMM inputs are rounded to bf16 and every target has mma.sync's "
           "bf16 shapes (sm_80 or later)">,
    Option<"maxSequences", "max-sequences", "int64_t", /*default=*/"64",
           "Most tokens in one decode step">,
  ];
}

#endif // NF_TRANSFORMS_PASSES_TD
