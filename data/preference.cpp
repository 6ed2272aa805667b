#include "data/preference.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "base/error_text.hpp"
#include "data/pretokenizer.hpp"  // RegexWorkExceeded

namespace rp {
namespace {
using Json = nlohmann::ordered_json;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(one_line(fmt::format("{}: {}", where, what)));
}

/// The record with an explicit prompt: an implicit one (no "prompt", two conversations) gets
/// the messages both start with as its prompt and the rest as its completions, as TRL does.
Json with_prompt(const Json& j, const std::string& where) {
  if (j.contains("prompt")) return j;
  const Json &c = j.at("chosen"), &r = j.at("rejected");
  if (!c.is_array() || !r.is_array())
    fail(
        where,
        "missing key \"prompt\" (only conversations, lists of messages at \"chosen\" and \"rejected\", carry "
        "their prompt)");
  size_t n = 0;
  while (n < c.size() && n < r.size() && c[n] == r[n]) ++n;
  if (n == 0)
    fail(where,
         "\"chosen\" and \"rejected\" share no leading message (no implicit prompt); give a \"prompt\"");
  if (n == c.size() || n == r.size())
    fail(where,
         "\"chosen\" and \"rejected\" differ only after one of them ends (an empty completion); give a "
         "\"prompt\"");
  Json out = j;
  out["prompt"] = Json(c.begin(), c.begin() + long(n));
  out["chosen"] = Json(c.begin() + long(n), c.end());
  out["rejected"] = Json(r.begin() + long(n), r.end());
  return out;
}

PreferencePair pair_of(const Json& record, const std::string& where, const Tokenizer& tok,
                       const ChatFormat& chat) {
  Json kept;
  const Json& j = record_without_nulls(record, kept);
  if (!j.is_object()) fail(where, fmt::format("expected a JSON object, got {}", j.type_name()));
  if (!j.contains("chosen") || !j.contains("rejected"))
    fail(where,
         fmt::format("expected the keys \"prompt\", \"chosen\" and \"rejected\" of preference data (missing "
                     "\"{}\")",
                     j.contains("chosen") ? "rejected" : "chosen"));
  const Json rec = with_prompt(j, where);
  if (rec.at("chosen") == rec.at("rejected"))
    fail(where, "\"chosen\" and \"rejected\" are the same (nothing to prefer)");
  PreferencePair p;
  p.chosen = prompt_completion_example(rec, "chosen", where, tok, chat);
  p.rejected = prompt_completion_example(rec, "rejected", where, tok, chat);
  for (const auto& [ex, key] :
       {std::pair<const Example*, const char*>{&p.chosen, "chosen"}, {&p.rejected, "rejected"}})
    if (std::find(ex->loss_mask.begin(), ex->loss_mask.end(), 1) == ex->loss_mask.end())
      fail(where, fmt::format("\"{}\" gives no token to train on", key));
  const auto& a = p.chosen.ids;
  const auto& b = p.rejected.ids;
  p.shared_prefix = size_t(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
  return p;
}
}  // namespace

std::vector<PreferencePair> load_preference_records(const std::string& path, const Tokenizer& tok,
                                                    const ChatFormat& chat) {
  std::vector<PreferencePair> pairs;
  for_each_record(path, [&](const Json& j, const std::string& where) {
    try {
      pairs.push_back(pair_of(j, where, tok, chat));
    } catch (const RegexWorkExceeded& e) {
      fail(where, e.what());
    }
  });
  if (pairs.empty()) throw std::runtime_error(path + ": no preference pairs");
  return pairs;
}

}  // namespace rp
