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

#include <langinfo.h>
#include <locale.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>

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

/// `n` copies of `item` joined by `sep`.
std::string chain(const std::string &item, const std::string &sep, int n) {
  std::string out = item;
  for (int i = 1; i < n; ++i)
    out += sep + item;
  return out;
}

TEST(ChatTemplateParse, LongOperatorChainsAreBoundedNotStackOverflows) {
  // Chains parsed in loops build trees as deep as they are long, which
  // evaluation, name searches and destruction walk recursively: beyond 256
  // levels a parse error, at load time, even in a branch never taken (a
  // tokenizer_config.json must not crash the model load).
  const std::string tooDeep = "t: chat template line 1: expression nested "
                              "too deeply (more than 256 levels";
  EXPECT_THAT(render("{{ " + chain("1", "+", 20000) + " }}"),
              HasSubstr(tooDeep));
  EXPECT_THAT(render("{% if false %}{{ " + chain("1", " + ", 1000000) +
                     " }}{% endif %}"),
              HasSubstr(tooDeep));
  EXPECT_THAT(render("{% for x in [1] %}{% if " + chain("x", " or ", 300000) +
                     " %}{% endif %}{% endfor %}"),
              HasSubstr(tooDeep));
  EXPECT_THAT(render("{{ x" + chain("|string", "", 100000) + " }}"),
              HasSubstr(tooDeep));
  EXPECT_THAT(render("{{ x" + chain(".a", "", 100000) + " }}"),
              HasSubstr(tooDeep));
  EXPECT_THAT(render("{{ x" + chain("()", "", 100000) + " }}"),
              HasSubstr(tooDeep));
  EXPECT_THAT(render("{{ x" + chain("[0]", "", 100000) + " }}"),
              HasSubstr(tooDeep));
  EXPECT_THAT(render("{% set y = " + chain("x", " and ", 100000) + " %}"),
              HasSubstr(tooDeep));
  EXPECT_THAT(render("{% filter " + chain("upper", "|", 100000) +
                     " %}x{% endfilter %}"),
              HasSubstr(tooDeep));
  // Real chains are short, and long ~ concatenations and comparisons are
  // flat (one node).
  EXPECT_EQ(render("{{ " + chain("1", "+", 200) + " }}"), "200");
  EXPECT_EQ(render("{{ (" + chain("'a'", " ~ ", 100000) + ")|length }}"),
            "100000");
  EXPECT_EQ(render("{{ " + chain("1", " <= ", 100000) + " }}"), "True");
  EXPECT_EQ(render("{{ " + chain("1 < 2", " and ", 200) + " }}"), "True");
}

TEST(ChatTemplateRender, RecursionThroughMacrosIsBounded) {
  // Each expression is shallow enough, but macro calls stack them: the
  // render's nesting as a whole is bounded too.
  EXPECT_THAT(render("{% macro r(n) %}{{ ((((((((((r(n + 1)" +
                     chain("|string", "", 200) +
                     ")))))))))) }}{% endmacro %}{{ r(0) }}"),
              HasSubstr("nests more than 1000 levels deep when rendered"));
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

// Errors quote strings computed while rendering: control characters in them
// are escaped, so an error stays one line (found by the chat_template fuzz
// target: a test name with newlines in select()).
TEST(ChatTemplateRender, ErrorsStayOneLine) {
  EXPECT_EQ(render("{{ [1] | select('no\\ntest') | list }}"),
            "ERROR: t: chat template line 1: no test named 'no\\ntest'");
  EXPECT_EQ(render("{{ raise_exception('a\\nb\\tc') }}"),
            "ERROR: t: chat template line 1: a\\nb\\x09c");
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
              HasSubstr("does too much work: more than 5000000 steps"));
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

TEST(ChatTemplateRender, SelfContainingValuesPrintAsPython) {
  // A namespace can come to hold itself (lists and dicts cannot change):
  // repr writes [...] / {...} where a container recurs, as Python does.
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.a = [ns] %}"
                   "{{ ns.a }}"),
            "[<Namespace {'a': [...]}>]");
  EXPECT_EQ(render("{% set a = namespace() %}{% set a.x = a %}"
                   "{{ a|string }} {{ [a, a] }}"),
            "<Namespace {'x': <Namespace {...}>}> [<Namespace {'x': "
            "<Namespace {...}>}>, <Namespace {'x': <Namespace {...}>}>]");
  EXPECT_EQ(render("{% set ns = namespace(l=[1]) %}"
                   "{% set ns.d = {'k': ns, 't': (ns,)} %}{{ ns }}"),
            "<Namespace {'l': [1], 'd': {'k': <Namespace {...}>, 't': "
            "(<Namespace {...}>,)}}>");
  EXPECT_EQ(render("{% set a = namespace() %}{% set a.x = {'y': a} %}"
                   "{{ a.x }} {{ a.x ~ '' == a.x|string }}"),
            "{'y': <Namespace {'x': {...}}>} True");
  // Comparisons, `in` and tojson do not walk into namespaces.
  EXPECT_EQ(render("{% set a = namespace() %}{% set a.x = [a] %}"
                   "{{ a.x == a.x }} {{ a in a.x }}"),
            "True True");
  EXPECT_THAT(render("{% set a = namespace() %}{% set a.x = [a] %}"
                     "{{ a.x|tojson }}"),
              HasSubstr("Object of type Namespace is not JSON serializable"));
}

TEST(ChatTemplateRender, DeeplyNestedValuesAreErrorsNotCrashes) {
  // Lists nested 10,000 deep: printing, comparing, sorting, tojson and
  // `in` stop at 512 levels; freeing them (and a million nested
  // namespaces) does not recurse.
  const std::string nest =
      "{% set h = namespace(x=[], y=[]) %}{% for i in range(10000) %}"
      "{% set h.x = [h.x] %}{% set h.y = [h.y] %}{% endfor %}";
  const std::string tooDeep = "the value is nested too deeply (more than 512";
  EXPECT_THAT(render(nest + "{{ h.x }}"), HasSubstr(tooDeep));
  EXPECT_THAT(render(nest + "{{ h.x|string }}"), HasSubstr(tooDeep));
  EXPECT_THAT(render(nest + "{{ h.x|tojson }}"), HasSubstr(tooDeep));
  EXPECT_THAT(render(nest + "{{ h.x == h.y }}"), HasSubstr(tooDeep));
  EXPECT_THAT(render(nest + "{{ h.x < h.y }}"), HasSubstr(tooDeep));
  EXPECT_THAT(render(nest + "{{ h.x in [h.y] }}"), HasSubstr(tooDeep));
  EXPECT_THAT(render(nest + "{{ [h.x, h.y]|sort }}"), HasSubstr(tooDeep));
  EXPECT_EQ(render(nest + "{{ h.x|length }}"), "1");
  EXPECT_EQ(render("{% set h = namespace(x=none) %}{% for i in range(100000) "
                   "%}{% for j in range(3) %}{% set h.x = namespace(x=[h.x]) "
                   "%}{% endfor %}{% endfor %}done"),
            "done");
}

TEST(ChatTemplateRender, LimitsHoldWhileResultsAreBuilt) {
  // Each of these used to build gigabytes (or a terabyte) before the size
  // was checked, or to run for many seconds: now a clean error, early.
  const std::string tooLong = "longer than 16777216 bytes";
  const std::string tooMany = "more than 1048576 items";
  const std::string tooMuch = "does too much work";
  auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(render("{{ ['x' * 1000000] * 1000000 }}"), HasSubstr(tooLong));
  EXPECT_THAT(render("{{ (['x' * 1000000] * 1000000)|string }}"),
              HasSubstr(tooLong));
  EXPECT_THAT(render("{{ (['x' * 1000000] * 1000000)|tojson }}"),
              HasSubstr(tooLong));
  EXPECT_THAT(render("{{ (['x' * 1000000] * 1000000)|join }}"),
              HasSubstr(tooLong));
  EXPECT_THAT(render("{% set h = namespace(l=[]) %}{% for i in range(100000) "
                     "%}{% set h.l = [h.l] %}{% endfor %}"
                     "{{ h.l|tojson(indent=1024) }}"),
              HasSubstr(tooLong));
  EXPECT_THAT(render("{{ ('<' * 16000000)|e }}"), HasSubstr(tooLong));
  EXPECT_THAT(render("{{ 'a'|indent(1000000000000) }}"), HasSubstr(tooLong));
  EXPECT_THAT(render("{{ ('x' * 16000000)|list|length }}"), HasSubstr(tooMany));
  EXPECT_THAT(render("{{ (' x' * 8000000).split()|length }}"),
              HasSubstr(tooMany));
  EXPECT_THAT(render("{{ ('\n' * 8000000).splitlines()|length }}"),
              HasSubstr(tooMany));
  // Work, not loop steps: quadratic concatenation, big strings over and
  // over, comparisons.
  EXPECT_THAT(render("{% set ns = namespace(s='') %}{% for i in range(8000) "
                     "%}{% set ns.s = ns.s ~ ('x' * 800) %}{% endfor %}"),
              HasSubstr(tooMuch));
  EXPECT_THAT(render("{% set s = 'x' * 16000000 %}{% for i in range(200) %}"
                     "{% set t = s.upper() %}{% endfor %}"),
              HasSubstr(tooMuch));
  EXPECT_THAT(render("{% set s = 'x' * 16000000 %}{% set u = 'x' * 16000000 "
                     "%}{% for i in range(100000) %}{% if s == u %}{% endif "
                     "%}{% endfor %}"),
              HasSubstr(tooMuch));
  EXPECT_THAT(render("{% set l = range(100000)|list %}{% for i in "
                     "range(100000) %}{% if -1 in l %}{% endif %}{% endfor %}"),
              HasSubstr(tooMuch));
  EXPECT_THAT(render("{{ {" + chain("1: 1", ", ", 1) +
                     [] {
                       std::string d;
                       for (int i = 2; i < 100000; ++i)
                         d += ", " + std::to_string(i) + ": 1";
                       return d;
                     }() +
                     "}|length }}"),
              HasSubstr(tooMuch));
  // Retaining what loops make is bounded too (here: loop objects).
  EXPECT_THAT(render("{% set h = namespace(l=none) %}{% for i in range(100000) "
                     "%}{% for j in range(100) %}{% set h.l = [loop, h.l] %}"
                     "{% endfor %}{% endfor %}"),
              HasSubstr(tooMuch));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_LT(seconds, 60.0); // a few seconds; before: minutes, or no memory
}

/// Renders a template that needs some 150 MB with little address space
/// left; exits 0 when that is an "out of memory" error.
void renderOutOfMemory() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  statm >> pages;
  const rlim_t limit = static_cast<rlim_t>(pages) * 4096 + (rlim_t{48} << 20);
  const rlimit rl = {limit, limit};
  setrlimit(RLIMIT_AS, &rl);
  const std::string out =
      render("{% set s = 'x' * 16000000 %}{{ s[::-1]|length }}");
  std::exit(out.find("out of memory") != std::string::npos ? 0 : 1);
}

TEST(ChatTemplateRender, OutOfMemoryIsAnError) {
  // std::bad_alloc (or any other exception) from inside the renderer is an
  // error of the render, not an exception out of it.
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer reports a failed allocation and aborts: no bad_alloc.
  GTEST_SKIP() << "AddressSanitizer aborts on a failed allocation";
#endif
  EXPECT_EXIT(renderOutOfMemory(), ::testing::ExitedWithCode(0), "");
}

TEST(ChatTemplateRender, RoundAsPython) {
  // round(x, -400): 10**400 is no double (was: NaN, then an undefined
  // cast); Python gives 0 / 0.0, ints are rounded exactly, ties to even.
  EXPECT_EQ(render("{{ 12345|round(-400) }} {{ 12345.0|round(-400) }} "
                   "{{ -1.5|round(-400) }}"),
            "0 0.0 -0.0");
  EXPECT_EQ(render("{{ 25|round(-1) }} {{ 35|round(-1) }} {{ -25|round(-1) }} "
                   "{{ 9223372036854775807|round(-18) }} "
                   "{{ 12345|round(-19) }} {{ 1.23456789|round(400) }}"),
            "20 40 -20 9000000000000000000 0 1.23456789");
  EXPECT_THAT(render("{{ 9223372036854775807|round(-1) }}"),
              HasSubstr("integer overflow"));
  EXPECT_EQ(render("{{ 2.675|round(2) }} {{ 1.5e300|round(2) }} "
                   "{{ 0.125|round(2) }} {{ 1234.5|round(-2) }}"),
            "2.67 1.5e+300 0.12 1200.0");
  EXPECT_THAT(render("{{ 1.5|round(400, 'ceil') }}"),
              HasSubstr("int too large to convert to float"));
  EXPECT_THAT(render("{{ 1.5|round(-400, 'floor') }}"),
              HasSubstr("float division by zero"));
}

/// A locale with a comma for its decimal point (LC_ALL), or (locale_t)0:
/// an installed one, else one built with glibc's localedef in `dir`.
locale_t commaLocale(const TempDir &dir) {
  auto comma = [](locale_t l) {
    return l && std::string(nl_langinfo_l(RADIXCHAR, l)) == ",";
  };
  for (const char *name :
       {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8"}) {
    locale_t l = newlocale(LC_ALL_MASK, name, static_cast<locale_t>(nullptr));
    if (comma(l))
      return l;
    if (l)
      freelocale(l);
  }
  const std::string cmd = "localedef -i de_DE -f UTF-8 '" +
                          dir.file("de_DE.UTF-8") + "' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0)
    return static_cast<locale_t>(nullptr);
  const char *old = std::getenv("LOCPATH");
  const std::string saved = old ? old : "";
  setenv("LOCPATH", dir.path().c_str(), 1);
  locale_t l =
      newlocale(LC_ALL_MASK, "de_DE.UTF-8", static_cast<locale_t>(nullptr));
  if (old)
    setenv("LOCPATH", saved.c_str(), 1);
  else
    unsetenv("LOCPATH");
  if (comma(l))
    return l;
  if (l)
    freelocale(l);
  return static_cast<locale_t>(nullptr);
}

TEST(ChatTemplateRender, NumbersDoNotDependOnTheLocale) {
  // A host application running with a comma decimal point (LC_NUMERIC)
  // renders exactly as in the C locale: float literals, |float, round,
  // printing; and strftime_now writes English names, as Python does.
  TempDir dir;
  locale_t comma = commaLocale(dir);
  if (!comma)
    GTEST_SKIP() << "no locale with a comma decimal point (and no localedef)";
  const std::string numbers =
      "{{ 1.5 }} {{ 2.5e3 }} {{ '2.5'|float }} {{ ' -0.25 '|float }} "
      "{{ '1e400'|float }} {{ '3.5'|int }} {{ 2.675|round(2) }} "
      "{{ 3.14159|round(3) }} {{ 1.5 * 2 }} {{ [0.5, 1e-7]|tojson }} "
      "{{ 0.1 + 0.2 }} {{ '{}'.format(0.5) }}";
  const std::string want = "1.5 2500.0 2.5 -0.25 inf 3 2.67 3.142 3.0 [0.5, "
                           "1e-07] 0.30000000000000004 0.5";
  const std::string day = "{{ strftime_now('%A %B') }}";
  auto cDay = [] {
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[64];
    std::strftime(buf, sizeof buf, "%A %B", &local);
    return std::string(buf);
  };
  ASSERT_EQ(render(numbers), want);
  const std::string before = cDay();
  const locale_t previous = uselocale(comma);
  const std::string got = render(numbers);
  const std::string gotDay = render(day);
  uselocale(previous);
  const std::string after = cDay();
  freelocale(comma);
  EXPECT_EQ(got, want);
  EXPECT_TRUE(gotDay == before || gotDay == after) << gotDay;
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

  // A list without a "default": no template (the reason noted), not a
  // failed load.
  writeFile(dir.file("tokenizer_config.json"),
            R"({"chat_template": [{"name": "tool_use", "template": "x"}]})");
  cfg = chat::loadChatConfig(dir.path(), "");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  EXPECT_FALSE(cfg->chatTemplate.has_value());
  EXPECT_EQ(cfg->templateError, dir.file("tokenizer_config.json") +
                                    ": 'chat_template' has no template named "
                                    "'default'");

  // A "name" that is not a string is not "default" (not a JSON type error).
  writeFile(dir.file("tokenizer_config.json"),
            R"({"chat_template": [{"name": 7, "template": "seven"},
                                  {"name": null},
                                  {"name": "default", "template": "d"}]})");
  cfg = chat::loadChatConfig(dir.path(), "");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  ASSERT_TRUE(cfg->chatTemplate.has_value()) << cfg->templateError;
  EXPECT_EQ(*cfg->apply({}, false), "d");
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

/// The reason a template found in `dir` cannot be used, checking that
/// it does not fail the load.
std::string unusableReason(const std::string &dir) {
  auto cfg = chat::loadChatConfig(dir, "");
  if (!cfg.ok())
    return "LOAD FAILED: " + cfg.message();
  if (cfg->chatTemplate)
    return "HAS A TEMPLATE";
  auto text = cfg->apply({{"user", "x"}}, true);
  if (text.ok() || text.message() != "the chat template cannot be used: " +
                                         cfg->templateError)
    return "APPLY: " + (text.ok() ? *text : text.message());
  return cfg->templateError;
}

TEST(ChatConfig, UnusableFoundTemplatesAreNotedNotFatal) {
  // A template found next to the tokenizer that cannot be used leaves the
  // model without one (the reason kept, naming the file and line): the
  // rest of the model must keep working.
  TempDir dir;
  const std::string config = dir.file("tokenizer_config.json");
  writeFile(config, "{\"chat_template\": ");
  EXPECT_EQ(unusableReason(dir.path()), config + ": not a JSON object");

  writeFile(config, R"({"chat_template": 42})");
  EXPECT_THAT(unusableReason(dir.path()),
              StartsWith(config + ": 'chat_template' must be a string"));

  writeFile(config, R"({"bos_token": ["<s>"], "chat_template": "x"})");
  EXPECT_THAT(unusableReason(dir.path()),
              StartsWith(config + ": 'bos_token' must be a string"));

  writeFile(config, R"({"chat_template": "line 1\n{% if %}"})");
  EXPECT_THAT(unusableReason(dir.path()),
              StartsWith(config + ": chat template line 2: "));

  writeFile(config, R"({"chat_template": "{% include 'x' %}"})");
  EXPECT_EQ(unusableReason(dir.path()),
            config + ": chat template line 1: unsupported tag 'include'");

  // chat_template.jinja too (it wins over tokenizer_config.json).
  writeFile(config, R"({"chat_template": "fine"})");
  writeFile(dir.file("chat_template.jinja"), "a\n\n{{ x }");
  EXPECT_THAT(
      unusableReason(dir.path()),
      StartsWith(dir.file("chat_template.jinja") + ": chat template line 3: "));

  // An explicit template still fails the load: it was asked for.
  auto cfg = chat::loadChatConfig(dir.path(), dir.file("chat_template.jinja"));
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.message(), StartsWith(dir.file("chat_template.jinja") +
                                        ": chat template line 3: "));
  // As does a malformed tokenizer_config.json beside it (its special
  // tokens would be missing).
  writeFile(dir.file("mine.jinja"), "{{ bos_token }}");
  writeFile(config, R"({"bos_token": 1})");
  cfg = chat::loadChatConfig(dir.path(), dir.file("mine.jinja"));
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.message(), StartsWith(config + ": 'bos_token' must be"));
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
  EXPECT_EQ(cfg.message(), dir.file("missing.jinja") +
                               ": cannot open: No such file or directory");
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
