#include "base/output_folder.hpp"

#include <algorithm>
#include <cstdlib>
#include <iterator>

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

}  // namespace rp
