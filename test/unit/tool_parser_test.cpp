// nfrun serve's tool-call parser (tools/nfrun/tool_parser.h): Nemotron 3's
// qwen3_coder markup, typed by the tools' schemas, whole and streamed, and
// malformed markup left as text.
#include "nfrun/tool_parser.h"

#include <gtest/gtest.h>

namespace {

using nfrun::parseToolCalls;
using ojson = nlohmann::ordered_json;

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather",
   "parameters": {"type": "object", "properties": {
     "city": {"type": "string"}, "days": {"type": "integer"},
     "metric": {"type": "boolean"}, "scale": {"type": "number"},
     "hours": {"type": "array"}, "opts": {"type": ["object", "null"]}}}}},
  {"type": "function", "function": {"name": "noop"}}])");

TEST(ToolParser, OneCallTypedBySchema) {
  const std::string text = "Let me look.\n<tool_call>\n<function=get_weather>\n"
                           "<parameter=city>\nSan Francisco\n</parameter>\n"
                           "<parameter=days>\n3\n</parameter>\n"
                           "<parameter=metric>\nfalse\n</parameter>\n"
                           "<parameter=scale>\n1.5\n</parameter>\n"
                           "<parameter=hours>\n[1, 2]\n</parameter>\n"
                           "<parameter=opts>\n{\"a\": 1}\n</parameter>\n"
                           "<parameter=extra>\n7\n</parameter>\n"
                           "</function>\n</tool_call>";
  auto out = parseToolCalls(text, kTools);
  EXPECT_EQ(out.content, "Let me look.\n");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments.dump(),
            R"({"city":"San Francisco","days":3,"metric":false,"scale":1.5,)"
            R"("hours":[1,2],"opts":{"a":1},"extra":"7"})");
}

TEST(ToolParser, ValuesThatDoNotParseStayStrings) {
  auto out = parseToolCalls(
      "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n"
      "</parameter>\n<parameter=city>\n\nline 1\nline 2\n\n</parameter>\n"
      "</function>\n</tool_call>",
      kTools);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments["days"], "three");
  // One newline after the tag and one before the closing tag are markup.
  EXPECT_EQ(out.calls[0].arguments["city"], "\nline 1\nline 2\n");
  EXPECT_EQ(out.content, "");
}

TEST(ToolParser, SeveralCallsAndMissingClosingTags) {
  auto out = parseToolCalls(
      "<tool_call>\n<function=noop>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n"
      "<parameter=days>\n2",
      kTools);
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].name, "noop");
  EXPECT_TRUE(out.calls[0].arguments.empty());
  EXPECT_EQ(out.calls[1].arguments.dump(), R"({"city":"Oslo","days":2})");
}

TEST(ToolParser, MalformedMarkupIsText) {
  for (const char *text :
       {"no calls here", "<tool_call>just text</tool_call>",
        "a <tool_call>\n<function=broken\n", "<tool_call>"}) {
    auto out = parseToolCalls(text, kTools);
    EXPECT_TRUE(out.calls.empty()) << text;
    EXPECT_EQ(out.content, text);
  }
}

TEST(ToolParser, StreamHoldsTheCallsForTheEnd) {
  const std::string text =
      "Sure. <tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n"
      "</parameter>\n</function>\n</tool_call>";
  for (size_t piece : {1, 2, 5, 100}) {
    nfrun::ToolCallStream s;
    std::string sent;
    for (size_t at = 0; at < text.size(); at += piece)
      sent += s.feed(text.substr(at, piece));
    auto out = s.finish(kTools);
    EXPECT_EQ(sent + out.content, "Sure. ") << piece;
    ASSERT_EQ(out.calls.size(), 1u) << piece;
    EXPECT_EQ(out.calls[0].arguments["city"], "Rome");
  }
  // Text that only looks like the tag's start is sent at the end.
  nfrun::ToolCallStream s;
  std::string sent = s.feed("a <tool");
  auto out = s.finish(kTools);
  EXPECT_EQ(sent + out.content, "a <tool");
  EXPECT_TRUE(out.calls.empty());
}

TEST(ToolParser, CallIds) {
  const std::string a = nfrun::newToolCallId(), b = nfrun::newToolCallId();
  EXPECT_EQ(a.size(), 29u);
  EXPECT_EQ(a.rfind("call_", 0), 0u);
  EXPECT_NE(a, b);
}

} // namespace
