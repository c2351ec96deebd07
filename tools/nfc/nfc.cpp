//===- nfc.cpp - the nf compiler driver -----------------------------------===//
//
//   nfc import <hf-dir> [-o model.mlir]   checkpoint -> nf dialect
//
// Every failure prints one line "nfc: error: <file>: <problem>" and exits 1.
// Outputs are written to a temporary file and renamed into place, so a failed
// run never clobbers an existing output.
//
//===----------------------------------------------------------------------===//

#include "import/Importer.h"
#include "nf/IR/NfDialect.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/raw_ostream.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

namespace {

int fail(const std::string &message) {
  std::cerr << "nfc: error: " << message << "\n";
  return 1;
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  if (*import)
    return runImport(importDir, importOut, generic);
  return 0;
}
