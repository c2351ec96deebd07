// nfrun serve's reasoning parser (tools/nfrun/reasoning_parser.h): the
// split of Nemotron 3 outputs into reasoning and answer, whole and in
// pieces of every size.
#include "nfrun/reasoning_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace {

using nfrun::ReasoningParser;

struct Split {
  std::string reasoning, content;
  bool sawReasoning = false;
};

/// Feeds `text` in pieces of `piece` bytes (0: whole).
Split parse(const std::string &text, bool inReasoning, size_t piece = 0) {
  ReasoningParser p(inReasoning);
  Split s;
  auto add = [&](const ReasoningParser::Delta &d) {
    s.reasoning += d.reasoning;
    s.content += d.content;
  };
  if (piece == 0)
    add(p.feed(text));
  else
    for (size_t at = 0; at < text.size(); at += piece)
      add(p.feed(text.substr(at, piece)));
  add(p.finish());
  s.sawReasoning = p.sawReasoning();
  return s;
}

TEST(ReasoningParser, TemplateOpenedBlock) {
  for (size_t piece : {0, 1, 2, 3, 5, 7}) {
    Split s =
        parse("Let me see.\nOK.</think>\n\nThe answer is 4.", true, piece);
    EXPECT_EQ(s.reasoning, "Let me see.\nOK.") << piece;
    EXPECT_EQ(s.content, "The answer is 4.") << piece;
    EXPECT_TRUE(s.sawReasoning);
  }
}

TEST(ReasoningParser, ModelOpensTheBlock) {
  for (size_t piece : {0, 1, 4}) {
    Split s = parse("\n<think>plan</think>done", false, piece);
    EXPECT_EQ(s.reasoning, "plan") << piece;
    EXPECT_EQ(s.content, "done") << piece;
    EXPECT_TRUE(s.sawReasoning);
  }
}

TEST(ReasoningParser, NoReasoning) {
  for (size_t piece : {0, 1, 3}) {
    // Thinking off: the prompt closed the block; a later "<think>" is text.
    Split s = parse("Hello <think> world</think>", false, piece);
    EXPECT_EQ(s.reasoning, "") << piece;
    EXPECT_EQ(s.content, "Hello <think> world</think>") << piece;
    EXPECT_FALSE(s.sawReasoning);
  }
  // A text shorter than the tag that could have begun it.
  Split s = parse("<thi", false, 1);
  EXPECT_EQ(s.content, "<thi");
  EXPECT_FALSE(s.sawReasoning);
}

TEST(ReasoningParser, UnterminatedBlockIsAllReasoning) {
  for (size_t piece : {0, 1, 2}) {
    Split s = parse("still thinking </thi", true, piece);
    EXPECT_EQ(s.reasoning, "still thinking </thi") << piece;
    EXPECT_EQ(s.content, "") << piece;
  }
}

TEST(ReasoningParser, ToolCallEndsReasoning) {
  const std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
      "</parameter>\n</function>\n</tool_call>";
  for (size_t piece : {0, 1, 6}) {
    Split s = parse("I need the weather.\n" + call, true, piece);
    EXPECT_EQ(s.reasoning, "I need the weather.\n") << piece;
    EXPECT_EQ(s.content, call) << piece;
  }
}

TEST(ReasoningParser, PiecesNeverChangeTheSplit) {
  const std::string texts[] = {"a</think>b",
                               "</think>",
                               "x<tool_call>y</think>z",
                               "<<</</think>>",
                               "  <think>\n r \n</think>\n c ",
                               "<think",
                               "</think></think>"};
  std::mt19937 rng(7);
  for (const std::string &t : texts)
    for (bool in : {false, true}) {
      const Split whole = parse(t, in);
      for (int trial = 0; trial < 50; ++trial) {
        ReasoningParser p(in);
        Split s;
        for (size_t at = 0; at < t.size();) {
          const size_t n = 1 + rng() % 4;
          auto d = p.feed(t.substr(at, n));
          s.reasoning += d.reasoning;
          s.content += d.content;
          at += n;
        }
        auto d = p.finish();
        s.reasoning += d.reasoning;
        s.content += d.content;
        EXPECT_EQ(s.reasoning, whole.reasoning) << t;
        EXPECT_EQ(s.content, whole.content) << t;
      }
    }
}

TEST(ReasoningParser, PromptOpensReasoning) {
  EXPECT_TRUE(nfrun::promptOpensReasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(
      nfrun::promptOpensReasoning("<|im_start|>assistant\n<think></think>"));
  EXPECT_FALSE(nfrun::promptOpensReasoning("<|im_start|>assistant\n"));
  EXPECT_TRUE(nfrun::promptOpensReasoning("<think>a</think> <think>"));
  EXPECT_TRUE(nfrun::isReasoningParser("nemotron_v3"));
  EXPECT_FALSE(nfrun::isReasoningParser("deepseek"));
}

} // namespace
