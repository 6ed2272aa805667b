// The spec's data keys: "data" (a file, or a weighted mixture of files) and "eval_data" (a
// file or a list of files), and the paths they name.
#include "trainer/spec_data.hpp"

#include <cmath>

#include <fmt/format.h>

#include "base/utf8.hpp"

namespace rp {

std::vector<std::string> eval_data_paths(const TrainSpec& spec) {
  if (!spec.eval_files.empty()) return spec.eval_files;
  if (spec.eval_data.empty()) return {};
  return {spec.eval_data};
}

std::vector<std::string> data_paths(const TrainSpec& spec) {
  if (spec.data_mixture.empty()) return {spec.data};
  std::vector<std::string> out;
  for (const auto& d : spec.data_mixture) out.push_back(d.path);
  return out;
}

/// "data": a file, or a list of files and {"path", "weight"} objects (a mixture; one entry is
/// that file alone).
void read_data_key(const JsonFields& f, TrainSpec& s) {
  if (!f.has("data") || !f.at("data").is_array()) {
    f.optional("data", s.data);
    return;
  }
  const nlohmann::json& list = f.at("data");
  if (list.empty())
    f.fail("data", "a file, or a non-empty list of files or {\"path\", \"weight\"} objects", list);
  std::vector<DataSource> sources;
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& e = list[i];
    DataSource d;
    if (e.is_string()) {
      d.path = e.get<std::string>();
    } else if (e.is_object()) {
      const JsonFields o(e, f.where(), fmt::format("data[{}].", i));
      o.allow_only({"path", "weight"});
      d.path = o.string("path");
      o.optional("weight", d.weight);
      if (!(std::isfinite(d.weight) && d.weight > 0)) o.fail("weight", "a number > 0", d.weight);
    } else {
      f.fail(fmt::format("data[{}]", i), "a file name or a {\"path\", \"weight\"} object", e);
    }
    if (d.path.empty()) f.fail(fmt::format("data[{}]", i), "a file name", e);
    sources.push_back(std::move(d));
  }
  if (sources.size() == 1) {
    s.data = sources[0].path;
    return;
  }
  s.data.clear();
  for (const auto& d : sources)
    s.data += fmt::format("{}{} (weight {:g})", s.data.empty() ? "" : " + ", d.path, d.weight);
  s.data_mixture = std::move(sources);
}

void check_recorded_paths(const JsonFields& f, const TrainSpec& s) {
  auto check = [&](const std::string& key, const std::string& path) {
    if (const size_t ok = valid_utf8_prefix(path); ok != path.size())
      f.fail(
          key,
          fmt::format("a UTF-8 file name (byte 0x{:02x} at offset {} is not; checkpoints record the name in "
                      "JSON, which holds only UTF-8): rename the file",
                      static_cast<unsigned char>(path[ok]), ok),
          path);
  };
  check("model", s.model);
  if (s.data_mixture.empty()) check("data", s.data);
  for (size_t i = 0; i < s.data_mixture.size(); ++i)
    check(fmt::format("data[{}]", i), s.data_mixture[i].path);
}

/// "eval_data": a file, or a list of files (or {"path"} objects; every file is evaluated whole,
/// so a weight means nothing there and is refused).
void read_eval_data_key(const JsonFields& f, TrainSpec& s) {
  if (!f.has("eval_data") || !f.at("eval_data").is_array()) {
    f.optional("eval_data", s.eval_data);
    return;
  }
  const nlohmann::json& list = f.at("eval_data");
  if (list.empty()) f.fail("eval_data", "a file, or a non-empty list of files", list);
  std::vector<std::string> files;
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& e = list[i];
    std::string path;
    if (e.is_string()) {
      path = e.get<std::string>();
    } else if (e.is_object()) {
      const JsonFields o(e, f.where(), fmt::format("eval_data[{}].", i));
      if (o.has("weight"))
        o.fail("weight", "nothing: every evaluation file is evaluated whole (weights mix training data only)",
               o.at("weight"));
      o.allow_only({"path"});
      path = o.string("path");
    }
    if (path.empty()) f.fail(fmt::format("eval_data[{}]", i), "a file name or a {\"path\"} object", e);
    files.push_back(std::move(path));
  }
  s.eval_data.clear();
  for (const auto& p : files) s.eval_data += (s.eval_data.empty() ? "" : " + ") + p;
  if (files.size() > 1) s.eval_files = std::move(files);
}

}  // namespace rp
