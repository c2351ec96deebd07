//===- nfc.cpp - the nf compiler driver -----------------------------------===//
//
//   nfc import <hf-dir> [-o model.mlir]     checkpoint -> nf dialect
//   nfc compile model.mlir [--compile-to=P]  lowering pipeline (see
//                                            docs/pipeline.md)
//   nfc compile model.mlir --target=cuda[:sm_90,...] -o plan.nfb
//                                            + CUDA kernels (docs/cuda.md)
//   nfc compile model.mlir --weights=fp8|int4 -o plan.nfb
//                                            + plan.weights.safetensors:
//                                            weights quantised at compile
//                                            time (docs/pipeline.md)
//
// Every failure prints one line "nfc: error: <file>: <problem>" and exits 1.
// Outputs are written to a temporary file and renamed into place, so a failed
// run never clobbers an existing output.
//
//===----------------------------------------------------------------------===//

#include "Pipeline/Pipeline.h"
#include "Plan/PlanWriter.h"
#include "Plan/QuantizedWeights.h"
#include "Target/Cuda/CudaBackend.h"
#include "Target/Cuda/KernelCache.h"
#include "import/Importer.h"
#include "nf/IR/NfOps.h"
#include "nf/file.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include "common/cli_checks.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

namespace {

int fail(const std::string &message) {
  std::cerr << "nfc: error: " << message << "\n";
  return 1;
}

/// MLIR's parser recurses once per level of brackets, braces, parentheses and
/// angle brackets: on an 8 MB stack about 6,000 nested regions or 20,000
/// nested arrays overflow it (SIGSEGV), and the verifier, the passes and the
/// printer recurse over nested regions too. A larger thread stack would only
/// move that point, so the input is scanned first and refused beyond
/// kMaxNesting levels: real models nest fewer than 20, and 256 levels need
/// about 350 KB of stack at that rate, whichever recursion runs over them.
constexpr int kMaxNesting = 256;

/// Fails on the first bracket deeper than kMaxNesting, outside string
/// literals and `//` comments. `->` closes nothing.
nf::Status checkNesting(llvm::StringRef text, const std::string &path) {
  int depth = 0;
  size_t line = 1, lineStart = 0;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    switch (text[i]) {
    case '\n':
      ++line;
      lineStart = i + 1;
      break;
    case '"':
      for (++i; i < n && text[i] != '"'; ++i) {
        if (text[i] == '\\')
          ++i;
        else if (text[i] == '\n') {
          ++line;
          lineStart = i + 1;
        }
      }
      break;
    case '/':
      if (i + 1 < n && text[i + 1] == '/')
        while (i + 1 < n && text[i + 1] != '\n')
          ++i;
      break;
    case '-':
      if (i + 1 < n && text[i + 1] == '>')
        ++i;
      break;
    case '(':
    case '[':
    case '{':
    case '<':
      if (++depth > kMaxNesting)
        return nf::Status::error(
            path + ":" + std::to_string(line) + ":" +
            std::to_string(i - lineStart + 1) + ": nesting deeper than " +
            std::to_string(kMaxNesting) +
            " levels of brackets, braces, parentheses or angle brackets");
      break;
    case ')':
    case ']':
    case '}':
    case '>':
      depth = std::max(0, depth - 1);
      break;
    default:
      break;
    }
  }
  return nf::Status::success();
}

/// Writes `text` to `path` ("-" = stdout) atomically.
nf::Status writeOutput(const std::string &path, const std::string &text) {
  if (path == "-") {
    std::cout << text;
    std::cout.flush();
    return std::cout ? nf::Status::success()
                     : nf::Status::error("<stdout>: write failed");
  }
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return nf::Status::error(path + ": cannot open for writing");
    out << text;
    out.flush();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return nf::Status::error(path + ": write failed");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return nf::Status::error(path + ": cannot replace: " + ec.message());
  return nf::Status::success();
}

int runImport(const std::string &dir, const std::string &output,
              bool genericForm) {
  mlir::MLIRContext context;
  auto module = nf::import::importCheckpoint(context, dir);
  if (!module)
    return fail(module.message());
  std::string text;
  llvm::raw_string_ostream os(text);
  mlir::OpPrintingFlags flags;
  if (genericForm)
    flags.printGenericOpForm();
  (*module)->print(os, flags);
  os.flush();
  if (auto st = writeOutput(output, text); !st)
    return fail(st.message());
  return 0;
}

/// Collects the first error diagnostic as one line "file:line:col: message".
class FirstError {
public:
  explicit FirstError(mlir::MLIRContext &ctx)
      : handler(&ctx, [this](mlir::Diagnostic &d) {
          if (d.getSeverity() == mlir::DiagnosticSeverity::Error &&
              message.empty()) {
            std::string loc;
            llvm::raw_string_ostream os(loc);
            if (auto file =
                    llvm::dyn_cast<mlir::FileLineColLoc>(d.getLocation()))
              os << file.getFilename().getValue() << ":" << file.getLine()
                 << ":" << file.getColumn() << ": ";
            else
              os << d.getLocation() << ": ";
            message = loc + d.str();
            for (char &c : message)
              if (c == '\n')
                c = ' ';
          }
          return mlir::success();
        }) {}
  std::string message;

private:
  mlir::ScopedDiagnosticHandler handler;
};

struct CompileFlags {
  std::string input, output = "-", compileTo;
  bool printIrAfterAll = false, timing = false, generic = false;
  nf::compiler::PipelineOptions pipeline;
  std::string target = "cpu", cudaSourceDir, matmulInputs = "exact";
  bool printCacheStats = false;
};

int runCompile(const CompileFlags &flags) {
  // Without --compile-to the whole pipeline runs and a plan is written.
  const bool emitPlan = flags.compileTo.empty();
  auto phase = emitPlan ? nf::compiler::Phase::Plan
                        : nf::compiler::parsePhase(flags.compileTo);
  if (!phase)
    return fail("--compile-to: unknown phase '" + flags.compileTo + "'");
  if (emitPlan && flags.output == "-")
    return fail("a plan is binary: write it to a file with -o plan.nfb "
                "(or print IR with --compile-to=<phase>)");
  std::optional<nf::codegen::CudaOptions> cuda;
  if (flags.target != "cpu") {
    cuda.emplace();
    if (auto st = nf::codegen::parseCudaTarget(flags.target, *cuda); !st)
      return fail(st.message());
    if (!emitPlan)
      return fail("--target=" + flags.target +
                  " applies to plans: drop --compile-to");
    cuda->sourceDir = flags.cudaSourceDir;
    cuda->matmulTerms = flags.matmulInputs == "bf16" ? 1 : 3;
    cuda->cacheDir = nf::codegen::KernelCache::defaultDirectory();
    if (const char *inject = std::getenv("NF_CUDA_INJECT_ERROR"))
      cuda->injectError = inject; // testing: a syntax error in these kernels
    if (const char *row = std::getenv("NF_CUDA_ROW_LINEAR"))
      cuda->rowLinear = std::string(row) != "0"; // benchmarks: 0 = skinny
    if (const char *sms = std::getenv("NF_CUDA_SM_COUNT")) {
      // Testing: grids (and the variants they choose) for this many SMs.
      char *end = nullptr;
      const long n = std::strtol(sms, &end, 10);
      if (end == sms || *end != '\0' || n < 1 || n > 4096)
        return fail("NF_CUDA_SM_COUNT: expected a number of SMs (1 to "
                    "4096), got '" +
                    std::string(sms) + "'");
      cuda->smCount = static_cast<int>(n);
    }
  } else if (!flags.cudaSourceDir.empty()) {
    return fail("--cuda-source-dir needs --target=cuda");
  } else if (flags.matmulInputs != "exact") {
    return fail("--matmul-inputs needs --target=cuda");
  }
  if (flags.pipeline.kvHotWindow > 0 && flags.pipeline.kvCacheDtype != "fp8")
    return fail("--kv-hot-window: a tiered KV cache compresses pages to "
                "fp8; add --kv-cache-dtype=fp8");
  mlir::DialectRegistry registry;
  nf::compiler::registerDialects(registry);
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  // IR printing and timing report to stderr; keep their output intact.
  FirstError firstError(context);

  llvm::SourceMgr sources;
  std::unique_ptr<llvm::MemoryBuffer> file;
  if (flags.input == "-") {
    std::string error;
    file = mlir::openInputFile(flags.input, &error);
    if (!file)
      return fail(flags.input + ": " + error);
  } else {
    // A regular file of bounded size: a FIFO or /dev/zero would hang or
    // exhaust memory.
    nf::StatusOr<std::string> text = nf::readWholeFile(flags.input);
    if (!text)
      return fail(text.message());
    file = llvm::MemoryBuffer::getMemBufferCopy(*text, flags.input);
  }
  if (auto st = checkNesting(file->getBuffer(), flags.input); !st)
    return fail(st.message());
  sources.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  auto module = mlir::parseSourceFile<mlir::ModuleOp>(sources, &context);
  if (!module)
    return fail(firstError.message.empty() ? flags.input + ": cannot parse"
                                           : firstError.message);
  if (module->getOps<mlir::nf::ModelOp>().empty() &&
      module->getOps<mlir::func::FuncOp>().empty())
    return fail(flags.input + ": no nf.model to compile");

  mlir::PassManager pm(&context);
  if (flags.printIrAfterAll) {
    context.disableMultithreading();
    pm.enableIRPrinting(
        /*shouldPrintBeforePass=*/nullptr,
        /*shouldPrintAfterPass=*/
        [](mlir::Pass *, mlir::Operation *) { return true; },
        /*printModuleScope=*/true, /*printAfterOnlyOnChange=*/false);
  }
  if (flags.timing)
    pm.enableTiming();
  nf::compiler::PipelineOptions pipeline = flags.pipeline;
  pipeline.cudaBf16Inputs = cuda && nf::codegen::roundsGemmInputsToBf16(*cuda);
  pipeline.cudaTarget = cuda.has_value();
  if (cuda) {
    pipeline.cudaSmCount = cuda->smCount;
    pipeline.cudaAmpereOrLater = nf::codegen::targetsAmpereOrLater(*cuda);
    pipeline.cudaHopperOrLater = nf::codegen::targetsHopperOrLater(*cuda);
    pipeline.cudaWgmma = nf::codegen::targetsWgmma(*cuda);
    pipeline.cudaMaxSharedBytes = nf::codegen::maxSharedBytesOf(*cuda);
    pipeline.cudaMatmulTerms = cuda->matmulTerms;
    pipeline.cudaRowLinear = cuda->rowLinear;
  }
  nf::compiler::buildPipeline(pm, *phase, pipeline);
  if (mlir::failed(pm.run(*module)))
    return fail(firstError.message.empty()
                    ? flags.input + ": compilation failed"
                    : firstError.message);

  for (auto func : module->getOps<mlir::func::FuncOp>())
    if (auto arena = func->getAttrOfType<mlir::IntegerAttr>("nf.arena_bytes")) {
      int64_t noReuse =
          func->getAttrOfType<mlir::IntegerAttr>("nf.no_reuse_bytes").getInt();
      int64_t tokens =
          func->getAttrOfType<mlir::IntegerAttr>("nf.max_tokens").getInt();
      std::cerr << "memory plan @" << func.getName().str() << " (" << tokens
                << " tokens): arena " << arena.getInt() << " bytes, no reuse "
                << noReuse << " bytes ("
                << (noReuse ? 100.0 * arena.getInt() / noReuse : 0.0) << "%)\n";
    }

  if (emitPlan) {
    // Compile-time quantisation: the codes go beside the plan
    // (plan.nfb -> plan.weights.safetensors), which lists the file.
    std::filesystem::path codes(flags.output);
    codes.replace_extension(".weights.safetensors");
    if (auto st = nf::compiler::writeQuantizedWeights(*module, codes.string());
        !st)
      return fail(flags.input + ": " + st.message());
    nf::codegen::CudaPlanBinaries binaries;
    auto plan = nf::compiler::writePlan(
        *module, std::string("nfc ") + NF_VERSION,
        flags.pipeline.defaultExpertBudget, cuda ? &*cuda : nullptr, &binaries);
    if (!plan)
      return fail(flags.input + ": " + plan.message());
    if (cuda && flags.printCacheStats)
      std::cerr << "kernel cache: " << binaries.cacheHits << " hits, "
                << binaries.cacheMisses << " misses, " << binaries.compiles
                << " modules x archs ("
                << (binaries.cacheDir.empty() ? std::string("disabled")
                                              : binaries.cacheDir)
                << "), " << binaries.seconds << " s\n";
    std::string bytes(plan->begin(), plan->end());
    if (auto st = writeOutput(flags.output, bytes); !st)
      return fail(st.message());
    return 0;
  }

  std::string text;
  llvm::raw_string_ostream os(text);
  mlir::OpPrintingFlags printing;
  if (flags.generic)
    printing.printGenericOpForm();
  module->print(os, printing);
  if (auto st = writeOutput(flags.output, text); !st)
    return fail(st.message());
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  CLI::App app{"nfc: the nf ahead-of-time compiler for Nemotron-H models"};
  app.set_version_flag("--version", std::string("nfc ") + NF_VERSION);
  app.require_subcommand(1);

  std::string importDir, importOut = "-";
  bool generic = false;
  auto *import = app.add_subcommand(
      "import",
      "Read a Hugging Face checkpoint and print it in the nf dialect");
  import
      ->add_option("hf-dir", importDir,
                   "Checkpoint directory (config.json + safetensors)")
      ->required();
  import->add_option("-o,--output", importOut, "Output file ('-' = stdout)");
  import->add_flag("--mlir-print-op-generic", generic,
                   "Print the generic op form");

  CompileFlags compile;
  auto *compileCmd = app.add_subcommand(
      "compile", "Lower an nf model through the compile phases");
  compileCmd
      ->add_option("model", compile.input, "Model in the nf dialect (.mlir)")
      ->required();
  compileCmd->add_option("-o,--output", compile.output,
                         "Output file ('-' = stdout)");
  std::string phases;
  for (const auto &p : nf::compiler::phaseNames())
    phases += (phases.empty() ? "" : "|") + p;
  compileCmd
      ->add_option("--compile-to", compile.compileTo,
                   "Stop after this phase and print its IR: " + phases)
      ->capture_default_str();
  compileCmd
      ->add_option("--max-tokens", compile.pipeline.maxTokens,
                   "Most tokens in one prefill step (memory plan)")
      ->capture_default_str()
      ->check(nf::cli::Positive);
  compileCmd
      ->add_option("--max-sequences", compile.pipeline.maxSequences,
                   "Most sequences in flight / in one decode step")
      ->capture_default_str()
      ->check(nf::cli::Positive);
  compileCmd
      ->add_option("--page-size", compile.pipeline.pageSize,
                   "Tokens per KV-cache page")
      ->capture_default_str()
      ->check(nf::cli::Positive);
  compileCmd
      ->add_option("--kv-pages", compile.pipeline.kvPages,
                   "KV-cache pages per attention layer")
      ->capture_default_str()
      ->check(nf::cli::Positive);
  compileCmd
      ->add_option("--kv-cache-dtype", compile.pipeline.kvCacheDtype,
                   "What the KV cache stores: f32 (exact), bf16, or fp8 "
                   "(E4M3, a scale per token and kv head); both backends "
                   "store what a cache of that type holds. auto: bf16 for "
                   "CUDA targets with bf16 matmul inputs, else f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "f32", "bf16", "fp8"}));
  compileCmd
      ->add_option("--kv-hot-window", compile.pipeline.kvHotWindow,
                   "With --kv-cache-dtype=fp8: a tiered cache, whose pages "
                   "holding any of a sequence's last N positions stay bf16 "
                   "and are compressed to fp8 after (0: every page fp8)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  compileCmd
      ->add_option("--expert-policy", compile.pipeline.expertPolicy,
                   "Expert selection: topk or budget")
      ->capture_default_str()
      ->check(CLI::IsMember({"topk", "budget"}));
  compileCmd
      ->add_option("--default-expert-budget",
                   compile.pipeline.defaultExpertBudget,
                   "Expert budget of requests that give none (fraction of "
                   "static top-k FLOPs; budget policy)")
      ->capture_default_str()
      ->check(nf::cli::Between("0", "1"));
  compileCmd
      ->add_option("--target", compile.target,
                   "Backend of the plan: cpu (ops only), or cuda[:sm_90,...] "
                   "(ops + CUDA kernels compiled with NVRTC for these "
                   "architectures; default sm_90)")
      ->capture_default_str();
  compileCmd->add_option("--cuda-source-dir", compile.cudaSourceDir,
                         "Also write the generated CUDA sources (.cu per "
                         "kernel, and the kernels/ headers) to this directory");
  compileCmd
      ->add_option("--matmul-inputs", compile.matmulInputs,
                   "Activations entering tensor-core GEMMs with bf16 weights "
                   "(CUDA): exact (three bf16 terms, products exact) or bf16 "
                   "(rounded once, as bf16 frameworks do: a third of the "
                   "tensor-core work)")
      ->capture_default_str()
      ->check(CLI::IsMember({"exact", "bf16"}));
  compileCmd
      ->add_option("--weights", compile.pipeline.quantizeWeights,
                   "Quantise weights at compile time, round to nearest, "
                   "weight only: fp8 (E4M3, a scale per output channel) or "
                   "int4 (a scale per group of input columns); the codes are "
                   "written beside the plan (<plan>.weights.safetensors)")
      ->check(CLI::IsMember({"fp8", "int4"}));
  compileCmd
      ->add_option("--quantize", compile.pipeline.quantizeScope,
                   "With --weights: experts (the routed experts' weights) or "
                   "all (every linear projection; never embeddings, LM head, "
                   "routers, norms or convolutions)")
      ->capture_default_str()
      ->check(CLI::IsMember({"experts", "all"}));
  compileCmd
      ->add_option("--quant-group-size", compile.pipeline.quantGroupSize,
                   "With --weights=int4: input columns per scale (a power of "
                   "two; halved for a weight it does not divide)")
      ->capture_default_str()
      ->check(CLI::IsMember({8, 16, 32, 64, 128, 256, 512, 1024}));
  compileCmd->add_flag("--print-kernel-cache-stats", compile.printCacheStats,
                       "Report kernel cache hits and misses (stderr; "
                       "cache: $NF_KERNEL_CACHE, see docs/cuda.md)");
  compileCmd->add_flag("--mlir-print-ir-after-all", compile.printIrAfterAll,
                       "Print the IR after every pass (stderr)");
  compileCmd->add_flag("--mlir-timing", compile.timing,
                       "Report the time of every pass (stderr)");
  compileCmd->add_flag("--mlir-print-op-generic", compile.generic,
                       "Print the generic op form");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp &e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp &e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion &e) {
    return app.exit(e);
  } catch (const CLI::ParseError &e) {
    return fail(e.what()); // one line, as every other error
  }
  if (*import)
    return runImport(importDir, importOut, generic);
  if (*compileCmd)
    return runCompile(compile);
  return 0;
}
