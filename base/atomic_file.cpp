#include "base/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

namespace fs = std::filesystem;

namespace rp {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

/// fsync of a file or a folder (folders: makes the names in it durable).
void sync_path(const std::string& path, bool folder) {
  const int fd = ::open(path.c_str(), (folder ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, fmt::format("cannot open to sync ({})", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // some file systems refuse fsync on folders (EINVAL): there is nothing more to make durable
  if (rc != 0 && !(folder && (err == EINVAL || err == EBADF)))
    fail(path, fmt::format("fsync failed ({})", std::strerror(err)));
}

std::string parent_of(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

/// fsync every regular file under `dir`, its sub-folders, then `dir`.
void sync_tree(const std::string& dir) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file(ec)) sync_path(it->path().string(), false);
    else if (it->is_directory(ec)) sync_path(it->path().string(), true);
  }
  if (ec) fail(dir, fmt::format("cannot list ({})", ec.message()));
  sync_path(dir, true);
}

std::string strip_slashes(std::string d) {
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

/// The pid of "<name>.tmp-<pid>" / "<name>.old-<pid>" and where its tag starts; -1 if none.
struct Leftover {
  size_t tag_at = std::string::npos;
  bool old = false;
  std::string pid;
};
Leftover parse_leftover(const std::string& name) {
  for (const char* tag : {".tmp-", ".old-"}) {
    const auto pos = name.rfind(tag);
    if (pos == std::string::npos) continue;
    const std::string pid = name.substr(pos + std::strlen(tag));
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    return {pos, tag[1] == 'o', pid};
  }
  return {};
}

}  // namespace

std::string temporary_path(const std::string& path) { return fmt::format("{}.tmp-{}", path, ::getpid()); }

void replace_file(const std::string& path, const std::function<void(const std::string& tmp)>& write) {
  const std::string tmp = temporary_path(path);
  std::error_code ec;
  try {
    write(tmp);
    sync_path(tmp, false);
    fs::rename(tmp, path, ec);
    if (ec) fail(path, fmt::format("cannot move into place: {}", ec.message()));
    sync_path(parent_of(path), true);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
}

void write_file_atomically(const std::string& path, const std::function<void(std::ostream& os)>& write) {
  replace_file(path, [&](const std::string& tmp) {
    std::ofstream os(tmp, std::ios::binary | std::ios::trunc);
    if (!os) fail(path, fmt::format("cannot write ({})", std::strerror(errno)));
    write(os);
    os.flush();
    if (!os) fail(path, "write failed (disk full?)");
    os.close();
    if (!os) fail(path, "write failed (disk full?)");
  });
}

void replace_folder(const std::string& dir_in, const std::function<void(const std::string& tmp)>& fill) {
  const std::string d = strip_slashes(dir_in);
  std::error_code ec;
  if (fs::exists(d, ec) && !fs::is_directory(d, ec)) fail(d, "exists and is not a directory");
  const std::string tmp = temporary_path(d);
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) fail(tmp, fmt::format("cannot create: {}", ec.message()));
  try {
    fill(tmp);
    sync_tree(tmp);
    // Swap into place: the old folder is removed only once the new one is there.
    const bool had_old = fs::exists(d, ec);
    const std::string old = fmt::format("{}.old-{}", d, ::getpid());
    if (had_old) {
      fs::remove_all(old, ec);
      fs::rename(d, old, ec);
      if (ec) fail(d, fmt::format("cannot move the previous version aside: {}", ec.message()));
    }
    fs::rename(tmp, d, ec);
    if (ec) {
      const std::string msg = ec.message();
      if (had_old) fs::rename(old, d, ec);
      fail(d, fmt::format("cannot move the new version into place: {}", msg));
    }
    sync_path(parent_of(d), true);
    if (had_old) fs::remove_all(old, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

std::vector<StaleTemporary> clean_stale_temporaries(const std::string& dir) {
  std::vector<StaleTemporary> done;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return done;
  std::vector<fs::path> entries;
  for (auto& e : fs::directory_iterator(dir, ec)) entries.push_back(e.path());
  const std::string self = std::to_string(::getpid());
  for (const auto& p : entries) {
    const std::string name = p.filename().string();
    const Leftover l = parse_leftover(name);
    if (l.tag_at == std::string::npos) continue;
    if (l.pid == self || fs::exists("/proc/" + l.pid, ec)) continue;  // a live writer
    const fs::path target = fs::path(dir) / name.substr(0, l.tag_at);
    if (l.old && !fs::exists(target, ec)) {
      fs::rename(p, target, ec);
      if (!ec) done.push_back({p.string(), target.string(), true});
    } else {
      fs::remove_all(p, ec);
      if (!ec) done.push_back({p.string(), target.string(), false});
    }
  }
  return done;
}

}  // namespace rp
