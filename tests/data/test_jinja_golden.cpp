// The Jinja interpreter against transformers: every case in
// tests/fixtures/chat_templates/{cases,snippets}.json was rendered by transformers' own
// chat-template environment (scripts/make_chat_template_goldens.py); the interpreter must
// produce the same bytes, or refuse where transformers raised.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "common.hpp"
#include "data/jinja/chat_context.hpp"
#include "data/jinja/template.hpp"

namespace rp::jinja {
namespace {

using ojson = nlohmann::ordered_json;

ojson load(const std::string& file) {
  return ojson::parse(test::read_file(test::fixture("chat_templates/" + file)));
}

RenderOptions fixed_clock(const ojson& doc) {
  // the generator pins strftime_now to this local time
  RenderOptions o;
  std::tm tm{};
  const std::string iso = doc.at("strftime_now");
  EXPECT_EQ(sscanf(iso.c_str(), "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                   &tm.tm_min, &tm.tm_sec),
            6);
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  std::mktime(&tm);  // fills tm_wday / tm_yday for %a, %j
  o.now = tm;
  return o;
}

/// Renders and compares one case; returns "" when it matches, else what differs.
std::string check(const Template& t, const Dict& vars, const ojson& c, const RenderOptions& o) {
  std::string got;
  try {
    got = t.render(vars, o);
  } catch (const RaisedException& e) {
    if (!c.contains("error")) return std::string("unexpected error: ") + e.what();
    if (!c["error"].get<std::string>().empty() && e.message != c["error"].get<std::string>())
      return "raised '" + e.message + "', transformers raised '" + c["error"].get<std::string>() + "'";
    return "";
  } catch (const TemplateError& e) {
    if (!c.contains("error")) return std::string("unexpected error: ") + e.what();
    if (!c["error"].get<std::string>().empty())
      return std::string("failed with '") + e.what() + "', transformers raised '" +
             c["error"].get<std::string>() + "'";
    return "";
  }
  if (c.contains("error")) return "rendered, but transformers failed: " + c.dump();
  const std::string want = c.at("expected");
  if (got == want) return "";
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  return "differs at byte " + std::to_string(i) + "\n  got:  ..." + got.substr(i > 40 ? i - 40 : 0, 120) +
         "\n  want: ..." + want.substr(i > 40 ? i - 40 : 0, 120);
}

TEST(JinjaGolden, RealChatTemplatesMatchTransformers) {
  const ojson doc = load("cases.json");
  const RenderOptions o = fixed_clock(doc);
  std::map<std::string, std::unique_ptr<Template>> templates;
  size_t rendered = 0, refused = 0;
  for (const auto& c : doc.at("cases")) {
    const std::string file = c.at("template");
    auto& t = templates[file];
    if (!t) t = std::make_unique<Template>(test::read_file(test::fixture("chat_templates/" + file)), file);
    const Dict vars =
        chat_variables(c.at("messages"), c.at("tools"), c.at("add_generation_prompt"), c.at("variables"));
    const std::string diff = check(*t, vars, c, o);
    EXPECT_EQ(diff, "") << file << " / " << c.at("case").get<std::string>();
    (c.contains("error") ? refused : rendered) += 1;
  }
  // every fixture template is exercised (a case file that lost templates or cases fails here)
  EXPECT_GE(templates.size(), 22u);
  EXPECT_GE(rendered, 150u);
  EXPECT_GE(refused, 20u);
}

TEST(JinjaGolden, ConstructsMatchTransformers) {
  const ojson doc = load("snippets.json");
  const RenderOptions o = fixed_clock(doc);
  for (const auto& c : doc.at("snippets")) {
    const std::string name = c.at("name");
    const Dict vars = from_json(c.at("variables")).dict();
    std::string diff;
    try {
      Template t(c.at("template").get<std::string>(), name + ".jinja");
      diff = check(t, vars, c, o);
    } catch (const TemplateError& e) {
      diff = std::string("parse error: ") + e.what();
    }
    EXPECT_EQ(diff, "") << name;
  }
}

}  // namespace
}  // namespace rp::jinja
