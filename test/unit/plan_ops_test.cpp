// nf/plan_ops.def against the dialects' ODS: every plan op is a registered
// op of nf, nf_kv or nf_moe, every attribute key is an attribute some plan op
// declares, and codes are distinct and never 0 (0 means "not stored").
#include "nf/IR/NfOps.h"
#include "nf/plan_ops.h"
#include "nf_kv/IR/NfKvOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace {

namespace pl = nf::plan;

class PlanOps : public ::testing::Test {
protected:
  void SetUp() override {
    ctx.loadDialect<mlir::nf::NfDialect, mlir::nf_kv::NfKvDialect,
                    mlir::nf_moe::NfMoeDialect>();
  }
  mlir::MLIRContext ctx;
};

TEST_F(PlanOps, EveryOpIsADialectOp) {
  for (const pl::OpCodeName &e : pl::kOpCodeNames)
    EXPECT_TRUE(mlir::RegisteredOperationName::lookup(e.name, &ctx))
        << e.name << " is not a registered op";
}

TEST_F(PlanOps, EveryAttributeKeyIsDeclaredByAPlanOp) {
  std::set<std::string> declared;
  for (const pl::OpCodeName &e : pl::kOpCodeNames)
    if (auto op = mlir::RegisteredOperationName::lookup(e.name, &ctx))
      for (mlir::StringAttr a : op->getAttributeNames())
        declared.insert(a.str());
  for (std::string_view key : pl::kAttrKeys)
    EXPECT_TRUE(declared.count(std::string(key)))
        << "'" << key << "' is not an attribute of any plan op";
}

TEST_F(PlanOps, CodesAreDistinctAndRoundTrip) {
  std::set<uint16_t> codes;
  for (const pl::OpCodeName &e : pl::kOpCodeNames) {
    EXPECT_NE(e.code, pl::OpCode::Unknown) << e.name;
    EXPECT_TRUE(codes.insert(static_cast<uint16_t>(e.code)).second) << e.name;
    EXPECT_EQ(pl::opCodeOf(e.name), e.code);
    EXPECT_EQ(pl::opCodeName(e.code), e.name);
  }
  EXPECT_EQ(pl::opCodeOf("nf.no_such_op"), pl::OpCode::Unknown);
  EXPECT_EQ(pl::opCodeName(pl::OpCode::Unknown), "");
}

} // namespace
