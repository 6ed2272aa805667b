#include "base/output_folder.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace rp {

fs::path resolved_path(const std::string& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  if (ec) abs = fs::path(p);
  fs::path r = fs::weakly_canonical(abs, ec);
  if (ec) r = abs.lexically_normal();
  return r.has_filename() || r == r.root_path() ? r : r.parent_path();
}

bool path_within(const fs::path& inner, const fs::path& outer) {
  auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end() || (std::next(o) == outer.end() && o->empty());  // "a/" within "a"
}

std::string unsafe_output_folder(const std::string& out) {
  const fs::path o = resolved_path(out);
  if (o == o.root_path()) return "is the root folder";
  if (const char* home = std::getenv("HOME"); home && *home && o == resolved_path(home))
    return "is the home folder ($HOME)";
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (!ec) {
    const fs::path c = resolved_path(cwd.string());
    if (o == c) return "is the working directory";
    if (path_within(c, o)) return "contains the working directory";
  }
  return "";
}

std::string overlapping_input(const std::string& out, const std::vector<std::string>& inputs) {
  const fs::path o = resolved_path(out);
  for (const auto& in : inputs) {
    if (in.empty()) continue;
    const fs::path p = resolved_path(in);
    if (path_within(o, p) || path_within(p, o)) return in;
  }
  return "";
}

std::vector<std::string> entries_of(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    out.push_back(it->path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::map<std::string, uint64_t>> manifest_files(const fs::path& dir) {
  using nlohmann::json;
  std::ifstream in(dir / kManifestFile, std::ios::binary);
  if (!in) return std::nullopt;
  try {
    const json j = json::parse(in);
    if (!j.is_object() || !j.contains("files") || !j["files"].is_array() || !j.contains("written_by") ||
        !j["written_by"].is_string() || j["written_by"].get<std::string>().rfind("roundpipe ", 0) != 0)
      return std::nullopt;
    std::map<std::string, uint64_t> files;
    for (const auto& f : j["files"]) {
      if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("bytes") ||
          !f["bytes"].is_number_unsigned())
        return std::nullopt;
      const std::string name = f["name"].get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") return std::nullopt;
      files[name] = f["bytes"].get<uint64_t>();
    }
    return files;
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

void write_manifest(const std::string& dir, const std::string& command) {
  using nlohmann::json;
  json files = json::array();
  for (const auto& name : entries_of(dir)) {
    std::error_code ec;
    if (name == kManifestFile || !fs::is_regular_file(fs::symlink_status(fs::path(dir) / name, ec))) continue;
    const auto bytes = fs::file_size(fs::path(dir) / name, ec);
    if (!ec) files.push_back({{"name", name}, {"bytes", uint64_t(bytes)}});
  }
  const fs::path p = fs::path(dir) / kManifestFile;
  std::ofstream o(p, std::ios::binary | std::ios::trunc);
  o << json{{"written_by", "roundpipe " + command}, {"files", files}}.dump(2) << "\n";
  o.close();
  if (!o) throw std::runtime_error(fmt::format("{}: write failed", p.string()));
}

std::optional<std::vector<std::string>> unlisted_entries(const fs::path& dir) {
  const auto ours = manifest_files(dir);
  if (!ours) return std::nullopt;
  std::vector<std::string> foreign;
  for (const auto& name : entries_of(dir)) {
    if (name == kManifestFile) continue;
    std::error_code ec;
    const fs::path f = dir / name;
    const auto it = ours->find(name);
    const bool listed = it != ours->end() && fs::is_regular_file(fs::symlink_status(f, ec)) &&
                        fs::file_size(f, ec) == it->second && !ec;
    if (!listed) foreign.push_back(name);
  }
  return foreign;
}

}  // namespace rp
