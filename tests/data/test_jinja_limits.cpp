// The Jinja interpreter's refusals: one line naming the template, the line and the construct,
// and bounded work on hostile templates (runaway loops, recursion, huge output, deep nesting).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "data/jinja/builtins.hpp"
#include "data/jinja/template.hpp"

namespace rp::jinja {
namespace {

/// The error text of parsing + rendering `src`, or "" when it renders.
std::string error_of(const std::string& src, const RenderOptions& o = {}, const Dict& vars = {}) {
  try {
    Template("{}", "t.jinja");  // a trivial template parses
    Template t(src, "t.jinja");
    t.render(vars, o);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "";
}

TEST(JinjaErrors, NameTheFileLineAndConstruct) {
  EXPECT_EQ(error_of("a\nb\n{{ x | xyz }}"), "t.jinja:3: unsupported filter 'xyz'");
  EXPECT_EQ(error_of("\n{{ 1 is prime }}"), "t.jinja:2: unsupported test 'prime'");
  EXPECT_EQ(error_of("{% include 'other.jinja' %}"), "t.jinja:1: unsupported statement 'include'");
  EXPECT_EQ(error_of("x\n{% if true %}never closed"), "t.jinja:2: missing '{% elif %}'");
  EXPECT_EQ(error_of("{{ 'open"), "t.jinja:1: unclosed string literal");
  EXPECT_EQ(error_of("line1\n{{ 1 +"), "t.jinja:2: unclosed '{{'");
  EXPECT_EQ(error_of("{# never closed"), "t.jinja:1: unclosed comment");
  EXPECT_EQ(error_of("{% set x = 1 %}{% set x.a = 2 %}"),
            "t.jinja:1: cannot assign attribute 'a' on a int (only on a namespace())");
  EXPECT_EQ(error_of("\n\n{{ raise_exception('bad role') }}"), "t.jinja:3: bad role");
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"), "t.jinja:1: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(error_of("{{ m.content + 'x' }}", {}, Dict{{{"m", Value(Dict{})}}}),
            "t.jinja:1: '.content' is undefined (operand of '+')");
}

/// The output of parsing + rendering `src`.
std::string render_of(const std::string& src) { return Template(src, "t.jinja").render({}, {}); }

// Numbers past what a double or an int64 holds read as Python reads them (a float literal past
// a double is inf, below its range 0.0; an index past int64 reaches no item), where std::stod and
// std::stoll threw their own one-word errors ("stod") out of the template.
TEST(JinjaNumbers, LiteralsPastTheirTypeReadAsPythonReadsThem) {
  EXPECT_EQ(render_of("{{ 1e999 }} {{ -1e999 }} {{ 1e-999 }} {{ 2.5e999 > 1 }}"), "inf -inf 0.0 True");
  EXPECT_EQ(render_of("{{ 99999999999999999999 > 9223372036854775807 }}"), "True");
  EXPECT_EQ(render_of("{% set x = [1, 2] %}{{ x.99999999999999999999 is defined }}"), "False");
  EXPECT_EQ(render_of("{{ [1, 2] | map(attribute='99999999999999999999') | list | length }}"), "2");
  EXPECT_EQ(render_of("{{ 1e999 | int }} {{ '1e999' | int(7) }} {{ 1e300 | int(3) }} {{ 2.7 | int }}"),
            "0 7 3 2");
}

// Integer arithmetic at int64's ends: INT64_MIN // -1 trapped (SIGFPE) and a range whose last
// step passes int64 wrapped around and never ended (memory without bound).
TEST(JinjaNumbers, ArithmeticAndRangesAtInt64sEndsStayBounded) {
  EXPECT_EQ(error_of("{{ (-9223372036854775807 - 1) // -1 }}"), "t.jinja:1: integer overflow in '//'");
  EXPECT_EQ(render_of("{{ (-9223372036854775807 - 1) % -1 }} {{ -7 // 2 }} {{ -7 % 2 }}"), "0 -4 1");
  EXPECT_EQ(render_of("{{ range(2, 9223372036854775807, 9223372036854775806) | list }}"), "[2]");
  EXPECT_EQ(render_of("{{ range(9223372036854775806, 9223372036854775807, 2) | list }}"),
            "[9223372036854775806]");
  EXPECT_EQ(render_of("{{ range(0, -9223372036854775807 - 1, -9223372036854775807) | list }}"),
            "[0, -9223372036854775807]");
  // counts past what a double holds exactly: len(range(0, 2**62 + 1, 2**61)) is 3
  EXPECT_EQ(render_of("{{ range(0, 4611686018427387905, 2305843009213693952) | list | length }}"), "3");
  EXPECT_EQ(render_of("{{ range(5, 0, -2) | list }} {{ range(0) | list }} {{ range(3, 1) | list }}"),
            "[5, 3, 1] [] []");
  // -INT64_MIN and abs(INT64_MIN) are past int64 too: refused as the binary operators are
  EXPECT_EQ(error_of("{{ -(-9223372036854775807 - 1) }}"), "t.jinja:1: integer overflow in unary -");
  EXPECT_EQ(error_of("{{ (-9223372036854775807 - 1) | abs }}"), "t.jinja:1: integer overflow in abs()");
  EXPECT_EQ(
      render_of(
          "{{ -5 | abs }} {{ -(-3) }} {{ '1e999' | float }} {{ ' 2.5 ' | float }} {{ 'x' | float(1.5) }}"),
      "5 3 inf 2.5 1.5");
}

TEST(JinjaErrors, RaiseExceptionKeepsTheTemplatesMessage) {
  Template t(
      "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}",
      "g.jinja");
  Dict vars;
  vars.set("messages", Value(List{Value(Dict{{{"role", Value("system")}}})}));
  try {
    t.render(vars);
    FAIL() << "rendered";
  } catch (const RaisedException& e) {
    EXPECT_EQ(e.message, "System role not supported");
    EXPECT_STREQ(e.what(), "g.jinja:1: System role not supported");
  }
}

TEST(JinjaLimits, RunawayLoopsStopAtTheStepLimit) {
  RenderOptions o;
  o.limits.max_steps = 100000;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e =
      error_of("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", o);
  EXPECT_NE(e.find("t.jinja:1: rendering took more than 100000 steps"), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  // the default limit holds too (2M steps: a few seconds at most)
  EXPECT_NE(error_of("{% for a in range(1000000) %}{% for b in range(1000000) %}{% endfor %}{% endfor %}")
                .find("steps"),
            std::string::npos);
}

TEST(JinjaLimits, OutputAndValuesAreBounded) {
  RenderOptions o;
  o.limits.max_output_bytes = 1 << 20;
  EXPECT_EQ(error_of("{% for a in range(1000) %}{{ 'x' * 10000 }}{% endfor %}", o),
            "t.jinja:1: output over 1048576 bytes");
  EXPECT_EQ(error_of("{{ 'x' * 1000000000000 }}"),
            "t.jinja:1: string repetition '*' makes a string over the size limit (64 MiB)");
  EXPECT_EQ(error_of("{{ 'xx' * 9223372036854775807 }}"),  // size x n overflows 64 bits
            "t.jinja:1: string repetition '*' makes a string over the size limit (64 MiB)");
  EXPECT_EQ(error_of("{{ range(1000000000000) | length }}"), "t.jinja:1: range() too long");
  EXPECT_EQ(error_of("{% set s = namespace(v='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set s.v = s.v "
                     "~ s.v %}{% endfor %}"),
            "t.jinja:1: string concatenation '~' makes a string over the size limit (64 MiB)");
}

// Every construct that grows a value checks its size before it builds it (no test here
// allocates more than ~100 MB): lists doubled by '+', strings grown by filters and methods,
// lists made from strings, and what printing a list that holds itself many times would write.
TEST(JinjaLimits, ListsDictsAndStringsCannotGrowPastTheLimit) {
  const std::string items = std::to_string(kMaxBuiltItems);
  EXPECT_EQ(error_of("{% set ns = namespace(a=[1]) %}\n{% for i in range(40) %}{% set ns.a = ns.a + ns.a "
                     "%}{% endfor %}"),
            "t.jinja:2: list concatenation '+' makes a list over the size limit (" + items + " items)");
  EXPECT_EQ(error_of("{{ [1, 2] * 9223372036854775807 }}"),
            "t.jinja:1: list repetition '*' makes a list over the size limit (" + items + " items)");
  EXPECT_EQ(error_of("{{ ('a,' * 3000000).split(',') | length }}"),
            "t.jinja:1: str.split() makes a list over the size limit (" + items + " items)");
  EXPECT_EQ(error_of("{{ ('a' * 3000000) | list | length }}"),
            "t.jinja:1: iterating over a string makes a list over the size limit (" + items + " items)");
  EXPECT_EQ(error_of("{{ ('x' * 1000000).replace('x', "
                     "'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') }}"),
            "t.jinja:1: replace makes a string over the size limit (64 MiB)");
  EXPECT_EQ(error_of("{{ ('x' * 1000000) | replace('', "
                     "'abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrst') }}"),
            "t.jinja:1: replace makes a string over the size limit (64 MiB)");
  EXPECT_EQ(error_of("{{ ('\\n' * 1000000) | indent(100) }}"),
            "t.jinja:1: filter 'indent' makes a string over the size limit (64 MiB)");
  EXPECT_EQ(error_of("{{ 'a' | indent(1000000000000) }}"),
            "t.jinja:1: filter 'indent' makes a string over the size limit (64 MiB)");
  EXPECT_EQ(error_of("{{ ('<' * 20000000) | e }}"),
            "t.jinja:1: filter 'escape' makes a string over the size limit (64 MiB)");
  // a list holding one list twice, 40 levels deep: 2^40 leaves to print
  const std::string dag =
      "{% set ns = namespace(a=[1]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}";
  EXPECT_EQ(error_of(dag + "{{ ns.a }}"),
            "t.jinja:1: printing a value makes a string over the size limit (64 MiB)");
  EXPECT_EQ(error_of(dag + "{{ ns.a | tojson }}"),
            "t.jinja:1: tojson makes a string over the size limit (64 MiB)");
  EXPECT_EQ(error_of(dag + "{{ ns.a == ns.a }}"), "");  // one shared list: equal at once
  // a namespace that holds itself
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"),
            "t.jinja:1: printing a value nested deeper than 512");
}

// Values kept while the template goes on building (each within the limit of one value) add up
// to RenderLimits::max_built_bytes at most; captures nested in macro calls share the output limit.
TEST(JinjaLimits, WhatATemplateBuildsAddsUpToALimit) {
  RenderOptions o;
  o.limits.max_built_bytes = 1 << 20;
  EXPECT_EQ(
      error_of(
          "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = ns.l + ['x' * 10000 ~ i] %}"
          "{% endfor %}",
          o)
          .find("t.jinja:1: "),
      0u);
  EXPECT_NE(
      error_of(
          "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = ns.l + ['x' * 10000 ~ i] %}"
          "{% endfor %}",
          o)
          .find("the values this template built add up to more than 1 MiB"),
      std::string::npos);
  EXPECT_EQ(error_of("{% for i in range(100) %}{{ 'x' * 1000 }}{% endfor %}", o), "")
      << "output is not a built value";
  RenderOptions small;
  small.limits.max_output_bytes = 1 << 20;
  // each level holds 600 kB while it calls the next: the second level is over the limit
  EXPECT_EQ(
      error_of("{% macro f(n) %}{{ 'x' * 600000 }}{% if n == 0 %}{{ raise_exception('reached') }}{% endif %}"
               "{{ f(n - 1) if n > 0 }}{% endmacro %}{{ f(3) }}",
               small),
      "t.jinja:1: output over 1048576 bytes");
}

TEST(JinjaLimits, RecursionAndNestingAreBounded) {
  EXPECT_EQ(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
            "t.jinja:1: macro calls nested deeper than 64");
  const std::string nested = "expressions and statements nested deeper than 256";
  EXPECT_EQ(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}"),
            "t.jinja:1: " + nested);
  std::string deep;
  for (int i = 0; i < 1000; ++i) deep += "{% if true %}";
  EXPECT_EQ(error_of(deep), "t.jinja:1: " + nested);
  EXPECT_EQ(error_of("{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}"),
            "t.jinja:1: " + nested);
}

}  // namespace
}  // namespace rp::jinja
