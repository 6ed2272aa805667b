#include "base/output_folder.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/checksum.hpp"
#include "base/error_text.hpp"

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
  // a shell expands "~" before a program sees it; in a spec or a quoted flag it would become a
  // folder named "~" in the working directory
  if (!out.empty() && out[0] == '~')
    return "starts with '~', which only a shell expands (write the full path)";
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

std::string output_file_problem(const std::string& path, bool replace) {
  std::error_code ec;
  const auto st = fs::symlink_status(path, ec);
  if (ec || st.type() == fs::file_type::not_found) {
    // checked before the work that writes it: a missing folder was found only at the end
    const fs::path parent = fs::path(path).parent_path();
    if (!parent.empty() && !fs::is_directory(parent, ec))
      return fmt::format("the folder '{}' does not exist; expected a file name in an existing folder",
                         parent.string());
    return "";
  }
  if (st.type() == fs::file_type::directory) return "is a folder; expected a file name";
  if (st.type() != fs::file_type::regular)
    return "something other than a regular file is there (a link, device or pipe); expected a file name";
  return replace ? "" : "a file is already there; choose another name or add --force to replace it";
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

std::vector<fs::path> folder_entries(const std::string& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) out.push_back(it->path());
  if (ec) throw std::runtime_error(fmt::format("{}: cannot open the folder ({})", dir, ec.message()));
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

/// XXH3-64 of the file at `p`; nullopt when it cannot be read.
std::optional<uint64_t> file_xxh3(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  Checksum c;
  std::vector<char> buf(size_t(1) << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    c.update(buf.data(), size_t(in.gcount()));
  }
  if (in.bad()) return std::nullopt;
  return c.digest();
}

std::optional<uint64_t> parse_hex64(const std::string& s) {
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos) return std::nullopt;
  return std::stoull(s, nullptr, 16);
}

}  // namespace

std::optional<std::map<std::string, ManifestEntry>> manifest_files(const fs::path& dir) {
  using nlohmann::json;
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(dir / kManifestFile, ec))) return std::nullopt;
  std::ifstream in(dir / kManifestFile, std::ios::binary);
  if (!in) return std::nullopt;
  try {
    const json j = json::parse(in);
    if (!j.is_object() || !j.contains("files") || !j["files"].is_array() || !j.contains("written_by") ||
        !j["written_by"].is_string() || j["written_by"].get<std::string>().rfind("roundpipe ", 0) != 0)
      return std::nullopt;
    std::map<std::string, ManifestEntry> files;
    for (const auto& f : j["files"]) {
      if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("bytes") ||
          !f["bytes"].is_number_unsigned())
        return std::nullopt;
      const std::string name = f["name"].get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
          name == kManifestFile)
        return std::nullopt;
      ManifestEntry e;
      e.bytes = f["bytes"].get<uint64_t>();
      if (f.contains("xxh3")) {
        if (!f["xxh3"].is_string()) return std::nullopt;
        e.xxh3 = parse_hex64(f["xxh3"].get<std::string>());
        if (!e.xxh3) return std::nullopt;
      }
      files[name] = e;
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
    const fs::path f = fs::path(dir) / name;
    if (name == kManifestFile || !fs::is_regular_file(fs::symlink_status(f, ec))) continue;
    const auto bytes = fs::file_size(f, ec);
    if (ec) continue;
    json e = {{"name", name}, {"bytes", uint64_t(bytes)}};
    if (bytes <= kManifestHashBytes) {
      const auto h = file_xxh3(f);
      if (!h) throw std::runtime_error(fmt::format("{}: cannot read back", f.string()));
      e["xxh3"] = fmt::format("{:016x}", *h);
    }
    files.push_back(std::move(e));
  }
  const fs::path p = fs::path(dir) / kManifestFile;
  std::ofstream o(p, std::ios::binary | std::ios::trunc);
  o << json{{"written_by", "roundpipe " + command}, {"files", files}}.dump(2) << "\n";
  o.close();
  if (!o) throw std::runtime_error(fmt::format("{}: write failed", p.string()));
}

std::vector<ForeignEntry> foreign_entries(const fs::path& dir) {
  std::vector<ForeignEntry> foreign;
  const auto ours = manifest_files(dir);
  std::error_code ec;
  const bool has_file = fs::exists(fs::symlink_status(dir / kManifestFile, ec));
  for (const auto& name : entries_of(dir)) {
    if (!ours) {
      foreign.push_back(
          {name, has_file ? fmt::format("not written by roundpipe (the {} there is not one roundpipe wrote)",
                                        kManifestFile)
                          : fmt::format("not written by roundpipe (no {} there lists it)", kManifestFile)});
      continue;
    }
    if (name == kManifestFile) continue;
    const fs::path f = dir / name;
    const auto it = ours->find(name);
    if (it == ours->end()) {
      foreign.push_back({name, fmt::format("not written by roundpipe ({} does not list it)", kManifestFile)});
      continue;
    }
    const bool same = fs::is_regular_file(fs::symlink_status(f, ec)) &&
                      fs::file_size(f, ec) == it->second.bytes && !ec &&
                      (!it->second.xxh3 || file_xxh3(f) == it->second.xxh3);
    if (!same)
      foreign.push_back(
          {name, fmt::format("changed since roundpipe wrote it (not the file {} records)", kManifestFile)});
  }
  return foreign;
}

std::vector<std::string> foreign_names(const fs::path& dir) {
  std::vector<std::string> out;
  for (auto& e : foreign_entries(dir)) out.push_back(std::move(e.name));
  return out;
}

const char* special_file_kind(fs::file_type t) {
  switch (t) {
    case fs::file_type::regular:
    case fs::file_type::directory:
    case fs::file_type::symlink:
    case fs::file_type::not_found:
    case fs::file_type::none: return nullptr;
    case fs::file_type::fifo: return "a named pipe";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::block: return "a block device";
    case fs::file_type::character: return "a character device";
    default: return "a special file";
  }
}

std::string name_list(const std::vector<std::string>& names, size_t shown) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > shown) out += fmt::format(", ... ({} in all)", names.size());
  return out;
}

std::string dangling_link_text(const std::string& path) {
  const auto normal = [](const fs::path& q) {
    const fs::path n = q.lexically_normal();
    return n.has_filename() ? n : n.parent_path();  // "out/" names "out"
  };
  fs::path p;
  for (const fs::path& part : fs::path(path)) {
    p /= part;
    if (part.empty() || part == "." || part == ".." || !p.has_relative_path()) continue;
    std::error_code ec;
    const fs::file_status s = fs::symlink_status(p, ec);
    if (ec || !fs::exists(s)) return "";  // nothing further along exists
    if (!fs::is_symlink(s) || fs::exists(p, ec) || ec) continue;
    const fs::path target = fs::read_symlink(p, ec);
    const std::string link = fmt::format("is a symbolic link to '{}', which does not exist",
                                         ec ? std::string("?") : target.string());
    return normal(p) == normal(path) ? fmt::format("'{}' {}", path, link)
                                     : fmt::format("'{}' lies under '{}', which {}", path, p.string(), link);
  }
  return "";
}

std::string path_blocker_text(const std::string& path, bool folder) {
  // a path is quoted whole up to a length no real one reaches (a file name has at most 255 bytes)
  const auto excerpt = [](const std::string& p) { return rp::excerpt(p, kPathQuoteBytes); };
  struct stat st {};
  const int err = ::stat(path.c_str(), &st) == 0 ? 0 : errno;
  if ((err == 0 && (!folder || S_ISDIR(st.st_mode))) || err == ENOENT) return "";  // missing: made later
  const auto normal = [](const fs::path& q) {
    const fs::path n = q.lexically_normal();
    return n.has_filename() ? n : n.parent_path();  // "out/" names "out"
  };
  const fs::path whole = normal(path);
  fs::path p;
  for (const fs::path& part : fs::path(path)) {  // the first part that is there and not a folder
    p /= part;
    if (part.empty() || part == "." || part == ".." || !p.has_relative_path()) continue;
    struct stat s {};
    if (::stat(p.c_str(), &s) != 0) break;
    const bool last = normal(p) == whole;
    if (S_ISDIR(s.st_mode) || (last && !folder)) continue;
    const std::string what = S_ISREG(s.st_mode) ? "a file, not a folder" : "not a folder";
    return last ? fmt::format("'{}' is {}", excerpt(path), what)
                : fmt::format("'{}' lies under '{}', which is {}", excerpt(path), excerpt(p.string()), what);
  }
  return fmt::format("'{}': cannot reach ({})", excerpt(path), std::strerror(err));
}

std::vector<std::string> create_folders(const std::string& path, std::error_code& ec,
                                        const std::function<void(const std::string&)>& on_made) {
  ec.clear();
  std::vector<std::string> made;
  fs::path p;
  for (const fs::path& part : fs::path(path)) {
    p /= part;
    // the root, "." and ".." (folders that exist once their parent does), a trailing separator
    if (part.empty() || part == "." || part == ".." || !p.has_relative_path()) continue;
    if (fs::is_directory(p, ec)) continue;  // there before (a link to a folder too)
    if (!fs::create_directory(p, ec)) {
      if (ec) break;
      continue;  // made by someone else meanwhile: not ours to take back
    }
    made.push_back(p.string());
    if (on_made) on_made(made.back());
  }
  std::reverse(made.begin(), made.end());
  return made;
}

void remove_empty_folders(const std::vector<std::string>& folders) {
  std::error_code ec;
  for (const std::string& dir : folders)
    if (!fs::remove(dir, ec)) break;
}

namespace {

// The folders remove_recorded_folders takes back: a fixed table a signal handler can read;
// g_made_count is 0 while the table is being written.
constexpr size_t kMadeSlots = 16;
constexpr size_t kMadePathMax = 4096;
char g_made[kMadeSlots][kMadePathMax];
std::atomic<size_t> g_made_count{0};

}  // namespace

void record_folders_made(const std::vector<std::string>& folders) {
  g_made_count.store(0);
  size_t n = 0;
  for (; n < folders.size() && n < kMadeSlots && folders[n].size() < kMadePathMax; ++n)
    std::memcpy(g_made[n], folders[n].c_str(), folders[n].size() + 1);
  g_made_count.store(n);
}

std::string not_a_file_text(const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st) || fs::is_regular_file(st)) return "";
  return fs::is_directory(st) ? "a folder, not a file" : "not a regular file (a device, FIFO or socket)";
}

void remove_recorded_folders() noexcept {
  const size_t n = g_made_count.load();
  for (size_t i = 0; i < n; ++i)
    if (::rmdir(g_made[i]) != 0) break;
}

}  // namespace rp
