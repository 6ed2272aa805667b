#include "scheduler/plan.hpp"

#include <algorithm>
#include <limits>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error_text.hpp"
#include "base/json_fields.hpp"

namespace rp {

const char* stage_kind_name(StageKind k) {
  switch (k) {
    case StageKind::forward: return "forward";
    case StageKind::tail: return "tail";
    case StageKind::backward: return "backward";
  }
  return "?";
}

std::vector<int> Stage::layers() const {
  std::vector<int> v;
  if (kind == StageKind::backward)
    for (int l = last; l >= first; --l) v.push_back(l);
  else
    for (int l = first; l <= last; ++l) v.push_back(l);
  return v;
}

int IterationPlan::num_forward() const {
  return int(std::count_if(stages.begin(), stages.end(),
                           [](const Stage& s) { return s.kind == StageKind::forward; }));
}
int IterationPlan::num_backward() const {
  return int(std::count_if(stages.begin(), stages.end(),
                           [](const Stage& s) { return s.kind == StageKind::backward; }));
}

std::string Stage::label() const {
  const char c = kind == StageKind::forward ? 'F' : kind == StageKind::tail ? 'T' : 'B';
  return kind == StageKind::backward ? fmt::format("{}[{}-{}]", c, last, first)
                                     : fmt::format("{}[{}-{}]", c, first, last);
}

std::string IterationPlan::summary() const {
  std::string out;
  for (auto& s : stages) out += (out.empty() ? "" : " ") + s.label();
  return out;
}

// Stages are named as `roundpipe plan`'s table and summary line show them: their index from 0 in
// execution order and their label ("stage 3 B[28-23]").
void validate_plan(const IterationPlan& p, const std::string& where) {
  auto fail = [&](const std::string& why) { throw std::invalid_argument(where + ": " + why); };
  auto name = [&](size_t i) { return fmt::format("stage {} {}", i, p.stages[i].label()); };
  if (p.num_layers < 3) fail(fmt::format("a model needs at least 3 layers, got {}", p.num_layers));
  int next = 0;
  size_t i = 0;
  for (; i < p.stages.size() && p.stages[i].kind == StageKind::forward; ++i) {
    const Stage& s = p.stages[i];
    if (s.first != next)
      fail(fmt::format("{} starts at layer {}, expected layer {}", name(i), s.first, next));
    if (s.last < s.first) fail(fmt::format("{} ends before it starts", name(i)));
    if (s.last >= p.num_layers - 1)
      fail(fmt::format("{} runs to layer {}; forward stages end by layer {}, before the tail", name(i),
                       s.last, p.num_layers - 2));
    next = s.last + 1;
  }
  if (next == 0) fail("the first stage must be a forward stage holding the embedding (layer 0)");
  if (i >= p.stages.size()) fail("expected a tail stage after the forward stages");
  if (p.stages[i].kind != StageKind::tail) fail(fmt::format("{}: expected the tail stage here", name(i)));
  const Stage& t = p.stages[i];
  if (t.first != next || t.last != p.num_layers - 1)
    fail(fmt::format("{}, the tail stage, covers layers {}-{}, expected {}-{}", name(i), t.first, t.last,
                     next, p.num_layers - 1));
  int expect = t.first - 1;
  for (++i; i < p.stages.size(); ++i) {
    const Stage& s = p.stages[i];
    if (s.kind != StageKind::backward)
      fail(fmt::format("{}: only backward stages may follow the tail stage", name(i)));
    if (s.last != expect)
      fail(fmt::format("{} starts at layer {}, expected layer {}", name(i), s.last, expect));
    if (s.first > s.last) fail(fmt::format("{} ends before it starts", name(i)));
    expect = s.first - 1;
  }
  if (expect == t.first - 1)
    fail(fmt::format("expected backward stages after the tail stage, from layer {} down to layer 0", expect));
  if (expect != -1)
    fail(fmt::format("{} stops at layer {}, expected the backward stages to reach layer 0", name(i - 1),
                     expect + 1));
}

IterationPlan make_uniform_plan(int num_layers, int fwd_layers, int bwd_layers, int tail_decoders) {
  if (fwd_layers < 1 || bwd_layers < 1)
    throw std::invalid_argument(
        fmt::format("layers per stage must be >= 1 (forward {}, backward {})", fwd_layers, bwd_layers));
  if (tail_decoders < 0 || tail_decoders > num_layers - 2)
    throw std::invalid_argument(
        fmt::format("tail_decoders must be in [0, {}], got {}", num_layers - 2, tail_decoders));
  IterationPlan p;
  p.num_layers = num_layers;
  int tail_first = num_layers - 1 - tail_decoders;
  for (int a = 0; a < tail_first; a += fwd_layers)
    p.stages.push_back({StageKind::forward, a, std::min(a + fwd_layers, tail_first) - 1});
  p.stages.push_back({StageKind::tail, tail_first, num_layers - 1});
  for (int b = tail_first - 1; b >= 0; b -= bwd_layers)
    p.stages.push_back({StageKind::backward, std::max(b - bwd_layers + 1, 0), b});
  validate_plan(p, "uniform plan");
  return p;
}

IterationPlan make_default_plan(int num_layers, int num_workers) {
  if (num_workers < 1) throw std::invalid_argument(fmt::format("workers must be >= 1, got {}", num_workers));
  int body = num_layers - 1;  // layers before the tail
  int bwd = std::max(1, body / std::max(1, 2 * num_workers));
  bwd = std::min(bwd, 4);
  int fwd = std::min(body, 3 * bwd);
  return make_uniform_plan(num_layers, fwd, bwd, 0);
}

namespace {
/// An integer that fits an int (JSON integers beyond it used to wrap around silently).
bool is_int(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max());
  if (!v.is_number_integer()) return false;
  const int64_t x = v.get<int64_t>();
  return x >= std::numeric_limits<int>::min() && x <= std::numeric_limits<int>::max();
}
std::pair<int, int> range_of(const nlohmann::json& v, const std::string& where) {
  if (!v.is_array() || v.size() != 2 || !is_int(v[0]) || !is_int(v[1]))
    throw std::invalid_argument(where + ": expected a pair of layer indices [a, b], got " + v.dump());
  return {v[0].get<int>(), v[1].get<int>()};
}
int int_of(const nlohmann::json& j, const char* key, int dflt, const std::string& where) {
  JsonFields(j, where).optional(key, dflt);
  return dflt;
}
}  // namespace

namespace {
/// check_plan_json but for the uniform form's counts (plan_from_json checks those against the
/// model, with the range in the message).
void check_plan_form(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return;
  if (!j.is_object()) throw std::invalid_argument(where + ": expected an object");
  // {} is no plan anyone gives on purpose (it once meant the uniform default plan)
  if (j.empty())
    throw std::invalid_argument(
        where +
        ": the plan is empty; expected \"forward\", \"tail\" and \"backward\" stages, or one or more of "
        "\"forward_layers\", \"backward_layers\", \"tail_decoders\"");
  static const std::set<std::string> known = {"forward_layers", "backward_layers", "tail_decoders", "forward",
                                              "tail",           "backward"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key()))
      throw std::invalid_argument(
          fmt::format("{}: unknown key '{}'{} (expected forward_layers, backward_layers, tail_decoders, or "
                      "forward/tail/backward)",
                      where, excerpt(it.key()), did_you_mean(it.key(), known)));
  if (j.contains("forward") || j.contains("tail") || j.contains("backward")) {
    for (const char* k : {"forward_layers", "backward_layers", "tail_decoders"})
      if (j.contains(k))
        throw std::invalid_argument(fmt::format(
            "{}: key '{}' does not go with explicit forward/tail/backward stages (give one or the other)",
            where, k));
    for (const char* k : {"forward", "tail", "backward"})
      if (!j.contains(k)) throw std::invalid_argument(fmt::format("{}: missing key '{}'", where, k));
    if (!j["forward"].is_array() || !j["backward"].is_array())
      throw std::invalid_argument(where + ": 'forward' and 'backward' must be arrays of [a, b] pairs");
    for (auto& r : j["forward"]) range_of(r, where + ".forward");
    range_of(j["tail"], where + ".tail");
    for (auto& r : j["backward"]) range_of(r, where + ".backward");
  }
}
}  // namespace

void check_plan_json(const nlohmann::json& j, const std::string& where) {
  check_plan_form(j, where);
  if (j.is_null() || j.contains("forward")) return;
  for (auto [key, least] : {std::pair{"forward_layers", 1}, {"backward_layers", 1}, {"tail_decoders", 0}})
    if (j.contains(key) && int_of(j, key, 0, where) < least)
      throw std::invalid_argument(
          fmt::format("{}: key '{}': expected an integer >= {}, got {}", where, key, least, j[key].dump()));
}

IterationPlan plan_from_json(const nlohmann::json& j, int num_layers, int num_workers,
                             const std::string& where) {
  if (j.is_null()) return make_default_plan(num_layers, num_workers);
  check_plan_form(j, where);
  if (j.contains("forward")) {
    IterationPlan p;
    p.num_layers = num_layers;
    for (auto& r : j["forward"]) {
      auto [a, b] = range_of(r, where + ".forward");
      p.stages.push_back({StageKind::forward, a, b});
    }
    auto [ta, tb] = range_of(j["tail"], where + ".tail");
    p.stages.push_back({StageKind::tail, ta, tb});
    for (auto& r : j["backward"]) {
      auto [b, a] = range_of(r, where + ".backward");
      p.stages.push_back({StageKind::backward, std::min(a, b), std::max(a, b)});
    }
    validate_plan(p, where);
    return p;
  }
  IterationPlan d = make_default_plan(num_layers, num_workers);
  int f = int_of(j, "forward_layers", d.stages[0].num_layers(), where);
  int b = int_of(j, "backward_layers", d.stages.back().num_layers(), where);
  int t = int_of(j, "tail_decoders", 0, where);
  // an explicit plan is run as given, never clamped: a stage longer than the layers before
  // the tail is refused
  const int body = num_layers - 1 - std::clamp(t, 0, std::max(0, num_layers - 2));
  for (auto [key, v] : {std::pair{"forward_layers", f}, {"backward_layers", b}})
    if (j.contains(key) && (v < 1 || v > body))
      throw std::invalid_argument(fmt::format(
          "{}: key '{}': expected 1..{} (the layers before the tail: embedding and {} decoders), got {}",
          where, key, body, body - 1, v));
  try {
    return make_uniform_plan(num_layers, f, b, t);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(where + ": " + e.what());
  }
}

IterationPlan evaluation_plan(const IterationPlan& p) {
  IterationPlan e = p;
  e.stages.clear();
  for (const Stage& s : p.stages)
    if (s.kind != StageKind::backward) e.stages.push_back(s);
  return e;
}

std::vector<int> evaluation_uploads(const ModelLayout& m, const IterationPlan& p) {
  std::vector<int> up(m.groups.size(), 0);
  for (const Stage& s : evaluation_plan(p).stages)
    for (int g : m.groups_uploaded(s.layers(), false))
      if (!m.groups[size_t(g)].frozen) up[size_t(g)]++;  // frozen: never requested
  return up;
}

std::vector<int> deal_round_robin(const IterationPlan& p, int num_workers, int64_t& pointer) {
  std::vector<int> w(p.stages.size());
  for (size_t s = 0; s < w.size(); ++s) w[s] = int((pointer + int64_t(s)) % num_workers);
  pointer += int64_t(w.size());
  return w;
}

}  // namespace rp
