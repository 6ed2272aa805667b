// The Jinja interpreter's refusals: one line naming the template, the line and the construct,
// and bounded work on hostile templates (runaway loops, recursion, huge output, deep nesting).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

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
  EXPECT_EQ(error_of("{% set x = 1 %}{% set x.a = 2 %}"), "t.jinja:1: cannot assign attribute 'a' on a int (only on a namespace())");
  EXPECT_EQ(error_of("\n\n{{ raise_exception('bad role') }}"), "t.jinja:3: bad role");
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"), "t.jinja:1: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(error_of("{{ m.content + 'x' }}", {}, Dict{{{"m", Value(Dict{})}}}),
            "t.jinja:1: '.content' is undefined (operand of '+')");
}

TEST(JinjaErrors, RaiseExceptionKeepsTheTemplatesMessage) {
  Template t("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}", "g.jinja");
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
  const std::string e = error_of("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", o);
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
  EXPECT_EQ(error_of("{% for a in range(1000) %}{{ 'x' * 10000 }}{% endfor %}", o), "t.jinja:1: output over 1048576 bytes");
  EXPECT_EQ(error_of("{{ 'x' * 1000000000000 }}"), "t.jinja:1: string repetition over the size limit");
  EXPECT_EQ(error_of("{{ range(1000000000000) | length }}"), "t.jinja:1: range() too long");
  EXPECT_EQ(error_of("{% set s = namespace(v='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set s.v = s.v ~ s.v %}{% endfor %}"),
            "t.jinja:1: string over the size limit");
}

TEST(JinjaLimits, RecursionAndNestingAreBounded) {
  EXPECT_EQ(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), "t.jinja:1: macro calls nested deeper than 64");
  const std::string nested = "expressions and statements nested deeper than 256";
  EXPECT_EQ(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}"), "t.jinja:1: " + nested);
  std::string deep;
  for (int i = 0; i < 1000; ++i) deep += "{% if true %}";
  EXPECT_EQ(error_of(deep), "t.jinja:1: " + nested);
  EXPECT_EQ(error_of("{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}"), "t.jinja:1: " + nested);
}

}  // namespace
}  // namespace rp::jinja
