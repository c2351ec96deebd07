// Chat templates (runtime/src/chat): what the comparison with Python's
// jinja2 (test/lit/chat/render-reference.test) cannot show: error messages
// and their lines, constructs nf refuses instead of rendering them wrongly,
// the bounds on hostile templates, and finding a checkpoint's template and
// special tokens. Expected texts here follow jinja2's documented rules.
#include "chat/chat_template.h"

#include "TestUtil.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <ctime>

using namespace nf;
using namespace nf::test;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using ojson = nlohmann::ordered_json;

namespace {

/// The text of `source` rendered with `vars`, or "ERROR: <message>".
std::string render(const std::string &source, ojson vars = ojson::object()) {
  StatusOr<chat::ChatTemplate> t = chat::ChatTemplate::parse(source, "t");
  if (!t)
    return "ERROR: " + t.message();
  StatusOr<std::string> out = t->render(vars);
  return out ? *out : "ERROR: " + out.message();
}

// Parse errors ---------------------------------------------------------------

TEST(ChatTemplateParse, ErrorsNameTheTemplateAndLine) {
  EXPECT_EQ(render("a\n{% if x %}\n{% endfor %}"),
            "ERROR: t: chat template line 3: unknown tag 'endfor'");
  EXPECT_EQ(render("ok\n\n{{ x"),
            "ERROR: t: chat template line 3: unexpected end of template: the "
            "'{{' tag is not closed");
  EXPECT_THAT(render("{{ 'abc }}"), HasSubstr("line 1: unterminated string"));
  EXPECT_THAT(render("{{ (1 }}"), HasSubstr("line 1: unexpected '}'"));
  EXPECT_THAT(render("{% for x in y %}\nno end"),
              HasSubstr("line 2: unexpected end of template: Jinja was "
                        "looking for 'endfor' or 'else'"));
  EXPECT_THAT(render("{# never closed"),
              HasSubstr("line 1: Missing end of comment tag"));
  EXPECT_THAT(render("{{ 1 + }}"),
              HasSubstr("line 1: unexpected 'end of print statement'"));
  EXPECT_THAT(render("{% set 1 = 2 %}"), HasSubstr("can't assign"));
  EXPECT_THAT(render("{{ x is string is defined }}"),
              HasSubstr("cannot chain multiple tests"));
  EXPECT_THAT(render("{% macro m(a=1, b) %}{% endmacro %}"),
              HasSubstr("non-default argument follows default argument"));
  EXPECT_THAT(render("\n\n{{ 99999999999999999999 }}"),
              HasSubstr("line 3: integer literal 99999999999999999999 is too "
                        "large"));
}

TEST(ChatTemplateParse, UnsupportedTagsAreErrors) {
  EXPECT_EQ(render("x\n{% include 'other.jinja' %}"),
            "ERROR: t: chat template line 2: unsupported tag 'include'");
  for (const char *tag : {"extends 'a'", "import 'a' as b", "block b",
                          "from 'a' import b", "call m()"})
    EXPECT_THAT(render(std::string("{% ") + tag + " %}"),
                HasSubstr("unsupported tag"))
        << tag;
  EXPECT_THAT(render("{% for x in xs recursive %}{% endfor %}"),
              HasSubstr("recursive loops are not supported"));
  EXPECT_THAT(render("{{ f(*xs) }}"),
              HasSubstr("*args and **kwargs in calls are not supported"));
  EXPECT_THAT(render("{% break %}"), HasSubstr("'break' outside of a loop"));
  EXPECT_THAT(render("{% for x in xs %}{% macro m() %}{% continue %}"
                     "{% endmacro %}{% endfor %}"),
              HasSubstr("'continue' outside of a loop"));
  EXPECT_THAT(render("{{ '\\N{BULLET}' }}"),
              HasSubstr("\\N{...} escapes are not supported"));
}

TEST(ChatTemplateParse, RejectsInvalidUtf8AndDeepNesting) {
  EXPECT_THAT(render("caf\xe9"), HasSubstr("line 1: the template is not "
                                           "valid UTF-8"));
  // Parentheses, `not` and unary minus chains, nested blocks: bounded
  // recursion instead of a stack overflow.
  EXPECT_THAT(render("{{ " + std::string(5000, '(') + "1" +
                     std::string(5000, ')') + " }}"),
              HasSubstr("nests more than 100 levels deep"));
  std::string nots;
  for (int i = 0; i < 5000; ++i)
    nots += "not ";
  EXPECT_THAT(render("{{ " + nots + "x }}"), HasSubstr("nests more than"));
  EXPECT_THAT(render("{{ " + std::string(5000, '-') + "1 }}"),
              HasSubstr("nests more than"));
  std::string ifs;
  for (int i = 0; i < 5000; ++i)
    ifs += "{% if true %}";
  EXPECT_THAT(render(ifs), HasSubstr("nests more than"));
  // Within the bound, deep templates work.
  std::string deep =
      "{{ " + std::string(30, '(') + "1" + std::string(30, ')') + " }}";
  EXPECT_EQ(render(deep), "1");
}

// Rendering ------------------------------------------------------------------

TEST(ChatTemplateRender, UnsupportedConstructsAreErrorsWithTheLine) {
  EXPECT_EQ(render("a\n\n{{ x|xmlattr }}", {{"x", {{"a", 1}}}}),
            "ERROR: t: chat template line 3: unsupported filter 'xmlattr'");
  EXPECT_EQ(render("{{ x|no_such_filter }}"),
            "ERROR: t: chat template line 1: no filter named "
            "'no_such_filter'");
  EXPECT_THAT(render("{{ 1 is no_such_test }}"),
              HasSubstr("no test named 'no_such_test'"));
  // As in jinja2, an unknown filter in a branch not taken is no error.
  EXPECT_EQ(render("{% if false %}{{ x|xmlattr }}{% endif %}ok"), "ok");
  EXPECT_THAT(render("{{ '%s!' % 'x' }}"),
              HasSubstr("printf-style string formatting"));
  EXPECT_THAT(render("{{ 'x'.zfill(3) }}"),
              HasSubstr("unsupported method str.zfill()"));
  EXPECT_THAT(render("{{ '{:>5}'.format(1) }}"),
              HasSubstr("format spec ':>5' is not supported"));
  EXPECT_THAT(render("{{ 'é'.isalpha() }}"),
              HasSubstr("str.isalpha() of non-ASCII text is not supported"));
  EXPECT_THAT(render("{{ cycler(1, 2) }}"),
              HasSubstr("unsupported function 'cycler'"));
  // 64-bit ints: overflow is an error, not a wrapped number.
  EXPECT_THAT(render("{{ 2 ** 70 }}"), HasSubstr("integer overflow"));
  EXPECT_THAT(render("{{ 9223372036854775807 + 1 }}"),
              HasSubstr("integer overflow"));
  // Python prints generators and functions with their address.
  EXPECT_THAT(render("{{ [1, 2]|map('string') }}"),
              HasSubstr("cannot print a generator"));
  EXPECT_THAT(render("{{ 'a'.upper }}"),
              HasSubstr("cannot print the function 'str.upper'"));
}

TEST(ChatTemplateRender, UndefinedBehavesAsJinja2DefaultUndefined) {
  const ojson vars = {{"d", {{"a", 1}}}};
  // Printing, truth, iteration, length, defaults, concatenation: harmless.
  EXPECT_EQ(render("[{{ x }}]", vars), "[]");
  EXPECT_EQ(render("{% if x %}yes{% else %}no{% endif %}", vars), "no");
  EXPECT_EQ(render("{% for i in x %}{{ i }}{% else %}empty{% endfor %}", vars),
            "empty");
  EXPECT_EQ(
      render("{{ x|length }} {{ x|default('dflt') }} {{ x ~ '!' }}", vars),
      "0 dflt !");
  EXPECT_EQ(render("{{ x is defined }} {{ x is undefined }} {{ x is none }} "
                   "{{ x == y }}",
                   vars),
            "False True False True");
  // A missing key of a dict is undefined too.
  EXPECT_EQ(render("[{{ d.b }}{{ d['b'] }}] {{ d.b is defined }}", vars),
            "[] False");
  // Using an undefined value as a value is an error naming it.
  EXPECT_EQ(render("\n{{ x.y }}", vars),
            "ERROR: t: chat template line 2: 'x' is undefined");
  EXPECT_EQ(render("{{ d.b.c }}", vars),
            "ERROR: t: chat template line 1: 'dict object' has no attribute "
            "'b'");
  EXPECT_THAT(render("{{ x + 1 }}", vars), HasSubstr("'x' is undefined"));
  EXPECT_THAT(render("{{ x() }}", vars), HasSubstr("'x' is undefined"));
  EXPECT_THAT(render("{{ x[0] }}", vars), HasSubstr("'x' is undefined"));
  EXPECT_THAT(render("{{ x|tojson }}", vars),
              HasSubstr("Object of type Undefined is not JSON serializable"));
  // Missing macro arguments are undefined, with their own message.
  EXPECT_EQ(render("{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}"), "[]");
  EXPECT_THAT(render("{% macro m(a) %}{{ a.b }}{% endmacro %}{{ m() }}"),
              HasSubstr("parameter 'a' was not provided"));
}

TEST(ChatTemplateRender, WhitespaceControl) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the
  // indentation before it too. Not for {{ }}.
  EXPECT_EQ(render("{% if true %}\n  a\n  {% endif %}\nb"), "  a\nb");
  EXPECT_EQ(render("  {{ 'v' }}\nx"), "  v\nx");
  // - strips every kind of whitespace, newlines included, on its side.
  EXPECT_EQ(render("a  \n\n  {%- if true -%}  \n\n  b  {%- endif %}"), "ab");
  EXPECT_EQ(render("a \n {{- 'b' -}} \n c"), "abc");
  // + keeps the indentation (lstrip_blocks off) or the newline (trim_blocks
  // off).
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");
  // Comments take part as blocks do.
  EXPECT_EQ(render("a\n  {# note #}\nb"), "a\nb");
  EXPECT_EQ(render("a {#- note -#} b"), "ab");
  // Newlines are normalised, and one at the end of the template dropped.
  EXPECT_EQ(render("a\r\nb\rc\n"), "a\nb\nc");
  EXPECT_EQ(render("a\n\n"), "a\n");
  // Raw blocks are text.
  EXPECT_EQ(render("{% raw %}{{ x }} {% if %}{% endraw %}"),
            "{{ x }} {% if %}");
}

TEST(ChatTemplateRender, RaiseException) {
  const std::string source =
      "{% for m in messages %}\n"
      "{% if m.role not in ['user', 'assistant'] %}\n"
      "{{ raise_exception('Unknown role: ' ~ m.role) }}\n"
      "{% endif %}\n"
      "{% endfor %}";
  EXPECT_EQ(render(source, {{"messages", {{{"role", "narrator"}}}}}),
            "ERROR: t: chat template line 3: Unknown role: narrator");
  EXPECT_EQ(render(source, {{"messages", {{{"role", "user"}}}}}), "");
}

TEST(ChatTemplateRender, StrftimeNowIsLocalTime) {
  auto year = [] {
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[16];
    std::strftime(buf, sizeof buf, "%Y", &local);
    return std::string(buf);
  };
  const std::string before = year();
  const std::string got = render("{{ strftime_now('%Y') }}");
  EXPECT_TRUE(got == before || got == year()) << got;
  EXPECT_EQ(render("[{{ strftime_now('') }}]"), "[]");
}

TEST(ChatTemplateRender, HostileTemplatesHitTheLimits) {
  // Output size.
  EXPECT_THAT(render("{% for i in range(100000) %}{{ 'x' * 1000 }}"
                     "{% endfor %}"),
              HasSubstr("longer than 16777216 bytes"));
  // A string doubled until it is huge, never printed.
  EXPECT_THAT(render("{% set ns = namespace(s='ab') %}{% for i in range(40) "
                     "%}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
              HasSubstr("longer than"));
  EXPECT_THAT(render("{{ 'ab' * 100000000 }}"), HasSubstr("longer than"));
  EXPECT_THAT(render("{{ ([0] * 10000000)|length }}"),
              HasSubstr("more than 1048576 items"));
  // Loops that would run for hours.
  EXPECT_THAT(render("{% for i in range(100000) %}{% for j in range(100000) "
                     "%}{% endfor %}{% endfor %}"),
              HasSubstr("more than 5000000 loop iterations"));
  // jinja2's sandbox limit on range().
  EXPECT_THAT(render("{{ range(100001)|length }}"), HasSubstr("Range too big"));
  // Unbounded recursion.
  EXPECT_THAT(
      render("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}\n{{ r(0) }}"),
      HasSubstr("macro calls nest more than 100 deep"));
  // Cycles (a namespace holding itself, a macro in its own scope) are
  // broken when the render ends (the sanitizer builds would see leaks).
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}"
                   "{% set ns.l = [ns] %}{% macro m() %}{% endmacro %}"
                   "{% set ns.m = m %}{% for x in [1, 2] %}"
                   "{{ loop.changed(loop) }}{% endfor %}"),
            "TrueTrue");
  // A macro outliving the loop iteration that defined it is refused
  // (jinja2 would keep the iteration alive).
  EXPECT_THAT(render("{% set ns = namespace(f=none) %}{% for x in [1] %}"
                     "{% macro m() %}in{% endmacro %}{% set ns.f = m %}"
                     "{% endfor %}{{ ns.f() }}"),
              HasSubstr("macro 'm' is called after the block that defined it "
                        "has ended (not supported)"));
  // The sandbox: nothing mutates.
  EXPECT_THAT(render("{% set l = [1] %}{{ l.append(2) }}"),
              HasSubstr("access to attribute 'append' of 'list' object is "
                        "unsafe"));
}

TEST(ChatTemplateRender, ContextMustBeAnObject) {
  auto t = chat::ChatTemplate::parse("x", "t");
  ASSERT_TRUE(t.ok());
  auto out = t->render(ojson::array());
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.message(), HasSubstr("must be a JSON object"));
}

// Loading
// ----------------------------------------------------------------------

TEST(ChatConfig, TemplateFileWinsOverTokenizerConfig) {
  TempDir dir;
  writeFile(dir.file("chat_template.jinja"),
            "{{ bos_token }}{% for m in messages %}[{{ m.role }}] "
            "{{ m.content }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}\n");
  writeFile(dir.file("tokenizer_config.json"),
            R"({"chat_template": "not this one",
                "bos_token": "<|begin|>",
                "eos_token": {"content": "<|end|>", "lstrip": false},
                "pad_token": null})");
  StatusOr<chat::ChatConfig> cfg = chat::loadChatConfig(dir.path(), "");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  ASSERT_TRUE(cfg->chatTemplate.has_value());
  EXPECT_EQ(cfg->chatTemplate->sourceName(), dir.file("chat_template.jinja"));
  using Tokens = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(cfg->specialTokens,
            (Tokens{{"bos_token", "<|begin|>"}, {"eos_token", "<|end|>"}}));
  StatusOr<std::string> text =
      cfg->apply({{"system", "Be nice."}, {"user", "Hi"}}, true);
  ASSERT_TRUE(text.ok()) << text.message();
  EXPECT_EQ(*text, "<|begin|>[system] Be nice.<|end|>[user] Hi<|end|>"
                   "[assistant] ");
  // What transformers passes besides the messages.
  const ojson ctx = cfg->context({{"user", "x"}}, false);
  EXPECT_TRUE(ctx["tools"].is_null());
  EXPECT_TRUE(ctx["documents"].is_null());
  EXPECT_EQ(ctx["add_generation_prompt"], false);
  EXPECT_EQ(ctx["messages"][0], (ojson{{"role", "user"}, {"content", "x"}}));
}

TEST(ChatConfig, TemplateFromTokenizerConfig) {
  TempDir dir;
  writeFile(dir.file("tokenizer_config.json"),
            R"({"chat_template": "{{ messages[0].content }}!"})");
  auto cfg = chat::loadChatConfig(dir.path(), "");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  ASSERT_TRUE(cfg->chatTemplate.has_value());
  EXPECT_EQ(cfg->chatTemplate->sourceName(), dir.file("tokenizer_config.json"));
  EXPECT_EQ(*cfg->apply({{"user", "hey"}}, false), "hey!");

  // A list of named templates: "default" is the one.
  writeFile(dir.file("tokenizer_config.json"),
            R"({"chat_template": [
                  {"name": "tool_use", "template": "tools"},
                  {"name": "default", "template": "default {{ 1 + 1 }}"}]})");
  cfg = chat::loadChatConfig(dir.path(), "");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  EXPECT_EQ(*cfg->apply({}, false), "default 2");

  writeFile(dir.file("tokenizer_config.json"),
            R"({"chat_template": [{"name": "tool_use", "template": "x"}]})");
  cfg = chat::loadChatConfig(dir.path(), "");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.message(), dir.file("tokenizer_config.json") +
                               ": 'chat_template' has no template named "
                               "'default'");
}

TEST(ChatConfig, NoTemplateIsNotAnError) {
  TempDir dir;
  auto cfg = chat::loadChatConfig(dir.path(), "");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  EXPECT_FALSE(cfg->chatTemplate.has_value());
  EXPECT_TRUE(cfg->specialTokens.empty());
  auto text = cfg->apply({{"user", "x"}}, true);
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(text.message(), HasSubstr("no chat template"));
}

TEST(ChatConfig, MalformedFilesAreErrorsNamingThem) {
  TempDir dir;
  const std::string config = dir.file("tokenizer_config.json");
  writeFile(config, "{\"chat_template\": ");
  auto cfg = chat::loadChatConfig(dir.path(), "");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.message(), config + ": not a JSON object");

  writeFile(config, R"({"chat_template": 42})");
  cfg = chat::loadChatConfig(dir.path(), "");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.message(),
              StartsWith(config + ": 'chat_template' must be a string"));

  writeFile(config, R"({"bos_token": ["<s>"]})");
  cfg = chat::loadChatConfig(dir.path(), "");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.message(),
              StartsWith(config + ": 'bos_token' must be a string"));

  writeFile(config, R"({"chat_template": "line 1\n{% if %}"})");
  cfg = chat::loadChatConfig(dir.path(), "");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.message(), StartsWith(config + ": chat template line 2: "));
}

TEST(ChatConfig, ExplicitTemplatePath) {
  TempDir dir;
  writeFile(dir.file("tokenizer_config.json"),
            R"({"chat_template": "{% broken", "bos_token": "<s>"})");
  writeFile(dir.file("mine.jinja"), "{{ bos_token }}mine\n");
  // The explicit file replaces a template that would not even parse.
  auto cfg = chat::loadChatConfig(dir.path(), dir.file("mine.jinja"));
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  EXPECT_EQ(*cfg->apply({}, true), "<s>mine");

  cfg = chat::loadChatConfig(dir.path(), dir.file("missing.jinja"));
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.message(), dir.file("missing.jinja") + ": cannot open");
}

TEST(ChatConfig, MessagesMustBeUtf8) {
  TempDir dir;
  writeFile(dir.file("chat_template.jinja"), "{{ messages[0].content }}");
  auto cfg = chat::loadChatConfig(dir.path(), "");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  auto text = cfg->apply({{"user", "caf\xe9"}}, false);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.message(), "message 0: role and content must be UTF-8 text");
}

} // namespace
