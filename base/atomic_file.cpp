#include "base/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <typeinfo>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/output_folder.hpp"

namespace fs = std::filesystem;

namespace rp {
namespace {

// The temporaries of the replace_file calls in progress (and the files record_unfinished_file
// names, without a marker), for remove_unfinished_temporaries: a fixed table a signal handler
// can walk (a slot is 0 free, 1 being filled, 2 ready).
constexpr int kTempSlots = 32;
constexpr size_t kTempPathMax = 4096;
struct TempSlot {
  std::atomic<int> state{0};
  char tmp[kTempPathMax];
  char marker[kTempPathMax + 32];
};
TempSlot g_temp_slots[kTempSlots];

// The temporary folders of the replace_folder calls in progress, for remove_unfinished_folders
// (a thread's work, never a signal handler's: removing a tree allocates).
std::mutex g_folders_mutex;
std::vector<std::string> g_unfinished_folders;
// replace_file / replace_folder calls that put their new version in place (replacements_done).
std::atomic<uint64_t> g_replacements{0};

// Held by a swap into place; remove_unfinished_folders takes it for good, so no swap starts
// (nor moves a folder it is removing into place) while the process ends.
std::mutex g_swap_mutex;

/// Records `tmp` (and its marker) as unfinished; -1 when the table is full or the names too
/// long (the temporary is then only cleaned by a later run, as after a kill).
int register_temporary(const std::string& tmp, const std::string& marker) {
  if (tmp.size() >= kTempPathMax || marker.size() >= kTempPathMax + 32) return -1;
  for (int i = 0; i < kTempSlots; ++i) {
    int free_slot = 0;
    if (!g_temp_slots[i].state.compare_exchange_strong(free_slot, 1)) continue;
    std::memcpy(g_temp_slots[i].tmp, tmp.c_str(), tmp.size() + 1);
    std::memcpy(g_temp_slots[i].marker, marker.c_str(), marker.size() + 1);
    g_temp_slots[i].state.store(2);
    return i;
  }
  return -1;
}

void unregister_temporary(int slot) {
  if (slot >= 0) g_temp_slots[slot].state.store(0);
}

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
    if (pid.empty() || pid.size() > 18 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    return {pos, tag[1] == 'o', pid};
  }
  return {};
}

constexpr const char* kMarkerSuffix = ".roundpipe-owner";
constexpr const char* kMarkerHeader = "roundpipe leftover v1";

/// Start time of process `pid` (clock ticks after boot, /proc/<pid>/stat field 22); "" when
/// there is no such process. With the pid it names one process over the machine's uptime.
std::string start_time_of(const std::string& pid) {
  std::ifstream f("/proc/" + pid + "/stat");
  std::string stat;
  if (!f || !std::getline(f, stat)) return "";
  const auto paren = stat.rfind(')');  // the command name may hold spaces and ')'
  if (paren == std::string::npos) return "";
  std::istringstream rest(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && (rest >> field); ++i)
    if (i == 22) return field;
  return "";
}

// not cached once for all: a forked child is another writer
std::string self_pid() { return std::to_string(::getpid()); }
std::string self_start() {
  thread_local std::string pid, start;
  if (pid != self_pid()) pid = self_pid(), start = start_time_of(pid);
  return start;
}

/// What a marker says; valid only when it parsed and names the leftover it sits beside.
struct Marker {
  bool valid = false;
  std::string pid, start, kind, target;
};

Marker read_marker(const fs::path& marker, const Leftover& l, const std::string& leftover_name) {
  std::ifstream f(marker, std::ios::binary);
  std::string header;
  Marker m;
  if (!f || !std::getline(f, header) || header != kMarkerHeader) return {};
  for (std::string line; std::getline(f, line);) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) return {};
    const std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "pid") m.pid = v;
    else if (k == "start") m.start = v;
    else if (k == "kind") m.kind = v;
    else if (k == "target") m.target = v;
  }
  m.valid =
      m.pid == l.pid && m.kind == (l.old ? "old" : "tmp") && m.target == leftover_name.substr(0, l.tag_at);
  return m;
}

bool writer_alive(const Marker& m) { return !m.start.empty() && start_time_of(m.pid) == m.start; }

std::string marker_text(const std::string& kind, const std::string& target_name) {
  return fmt::format("{}\npid={}\nstart={}\nkind={}\ntarget={}\n", kMarkerHeader, self_pid(), self_start(),
                     kind, target_name);
}

std::function<void(const std::string&)>& leftover_reporter() {
  static std::function<void(const std::string&)> report;
  return report;
}

void report_leftover(const std::string& line) {
  if (leftover_reporter()) leftover_reporter()(line);
  else std::fprintf(stderr, "roundpipe: warning: %s\n", line.c_str());
}

std::function<void(const std::string&, const std::string&)>& write_hook() {
  static std::function<void(const std::string&, const std::string&)> hook;
  return hook;
}

void call_hook(const char* event, const std::string& dir) {
  if (write_hook()) write_hook()(event, dir);
}

/// Cleans one leftover `p` (in folder `dir`) when its marker names a dead writer. Returns
/// true when it did something (or the marker was an orphan it removed), `restored` when an
/// .old-<pid> was put back; false when the name is not provably a dead writer's, or when it is
/// but could not be removed or put back: then `error` says why (the leftover and its marker stay).
bool clean_marked(const fs::path& dir, const std::string& name, bool& restored, std::string& error) {
  const Leftover l = parse_leftover(name);
  if (l.tag_at == std::string::npos) return false;
  const fs::path p = dir / name;
  const fs::path marker = fs::path(owner_marker_path(p.string()));
  std::error_code ec;
  if (!fs::is_regular_file(marker, ec)) return false;
  const Marker m = read_marker(marker, l, name);
  if (!m.valid || writer_alive(m)) return false;
  const fs::path target = dir / m.target;
  restored = false;
  if (fs::exists(fs::symlink_status(p, ec))) {
    if (l.old && !fs::exists(target, ec)) {
      fs::rename(p, target, ec);
      if (ec) {
        error = fmt::format("cannot put it back as {} ({})", target.string(), ec.message());
        return false;
      }
      restored = true;
    } else {
      fs::remove_all(p, ec);
      if (ec) {
        error = fmt::format("cannot remove it ({})", ec.message());
        return false;
      }
    }
  }
  fs::remove(marker, ec);
  return true;
}

/// Makes `leftover` (a name beside `target`) ours before it is created: a dead writer's
/// marked leftover of that name is cleaned, a name that still exists (a live writer's, or
/// nobody's we know) fails, and the marker is written. `durable`: the marker and its folder
/// are fsynced (needed before a finished folder is moved aside under that name).
/// The marker is created only where no file is (O_EXCL) and, the moment it exists, recorded for
/// a stop signal's cleanup (remove_unfinished_temporaries): a stop while it is written leaves no
/// empty or half-written marker behind. `cover_leftover` (a file's temporary, which the signal
/// may remove too): the record, returned, names the leftover and its marker and stays for the
/// caller to drop; otherwise (a folder, which only a later run may clean, by its marker) the
/// record goes once the marker is complete and -1 is returned.
int claim(const std::string& leftover, const std::string& target, const char* kind, bool durable,
          bool cover_leftover) {
  const fs::path p(leftover);
  std::error_code ec;
  bool restored = false;
  std::string error;
  clean_marked(p.parent_path().empty() ? fs::path(".") : p.parent_path(), p.filename().string(), restored,
               error);
  if (!error.empty())
    fail(leftover, fmt::format("left by a roundpipe run that ended, but {}; it is left as it is: make it "
                               "removable or move it away to write {}",
                               error, target));
  const std::string marker = owner_marker_path(leftover);
  const bool marker_there = fs::exists(fs::symlink_status(marker, ec));
  if (fs::exists(fs::symlink_status(p, ec)) || marker_there)
    fail(marker_there ? marker : leftover,
         fmt::format("exists and was not made by roundpipe (or by a run still alive); it is left as it "
                     "is: move it away to write {}",
                     target));
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST)
    fail(marker,
         fmt::format("appeared meanwhile (another writer?); it is left as it is: move it away to write {}",
                     target));
  if (fd < 0) fail(target, fmt::format("cannot write ({})", std::strerror(errno)));
  const int slot = cover_leftover ? register_temporary(leftover, marker) : register_temporary(marker, "");
  call_hook("marker-created", parent_of(marker));
  const std::string text = marker_text(kind, fs::path(target).filename().string());
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += size_t(n);
  }
  const int err = done == text.size() ? 0 : (errno != 0 ? errno : EIO);
  if (::close(fd) != 0 || err != 0) {
    unregister_temporary(slot);
    fs::remove(marker, ec);
    fail(target, fmt::format("cannot write ({})", std::strerror(err != 0 ? err : errno)));
  }
  // complete now: a later run can prove it ours, so a folder's marker needs no record (not even when
  // a sync below throws)
  if (!cover_leftover) unregister_temporary(slot);
  if (durable) {
    sync_path(marker, false);
    sync_path(parent_of(marker), true);
  }
  return cover_leftover ? slot : -1;
}

void drop_marker(const std::string& leftover) {
  std::error_code ec;
  fs::remove(owner_marker_path(leftover), ec);
}

}  // namespace

std::string temporary_path(const std::string& path) { return fmt::format("{}.tmp-{}", path, ::getpid()); }

std::string owner_marker_path(const std::string& leftover) { return leftover + kMarkerSuffix; }

void set_leftover_reporter(std::function<void(const std::string& line)> report) {
  leftover_reporter() = std::move(report);
}

void set_atomic_write_hook(std::function<void(const std::string& event, const std::string& dir)> hook) {
  write_hook() = std::move(hook);
}

size_t remove_unfinished_temporaries() noexcept {
  size_t removed = 0;
  for (TempSlot& s : g_temp_slots)
    if (s.state.load() == 2) {
      removed += ::unlink(s.tmp) == 0;
      if (s.marker[0] != '\0') ::unlink(s.marker);
    }
  // then the folders record_unfinished_file named, once empty: a pass per level they may nest
  for (int pass = 0; pass < 16; ++pass)
    for (TempSlot& s : g_temp_slots)
      if (s.state.load() == 2 && s.marker[0] == '\0') removed += ::rmdir(s.tmp) == 0;
  return removed;
}

uint64_t replacements_done() noexcept { return g_replacements.load(); }

size_t remove_unfinished_folders() noexcept {
  static std::atomic<bool> called{false};
  if (called.exchange(true)) return 0;
  size_t removed = 0;
  // never released: the caller ends the process, and no swap may move a folder into place meanwhile
  g_swap_mutex.lock();
  std::vector<std::string> folders;
  {
    const std::lock_guard<std::mutex> lock(g_folders_mutex);
    folders = g_unfinished_folders;
  }
  for (const std::string& tmp : folders) {
    std::error_code ec;
    // a writer still filling it may add a file between two passes
    const bool existed = fs::exists(fs::symlink_status(tmp, ec));
    for (int pass = 0; pass < 3 && fs::exists(fs::symlink_status(tmp, ec)); ++pass) fs::remove_all(tmp, ec);
    if (!fs::exists(fs::symlink_status(tmp, ec))) {
      drop_marker(tmp);
      removed += existed;
    }
  }
  return removed;
}

int record_unfinished_file(const std::string& path) noexcept { return register_temporary(path, ""); }

void forget_unfinished_file(int handle) noexcept { unregister_temporary(handle); }

RecordedFolders::RecordedFolders(const std::string& path, std::error_code& ec)
    : made_(create_folders(
          path, ec, [this](const std::string& f) { handles_.push_back(record_unfinished_file(f)); })) {}

RecordedFolders::RecordedFolders(RecordedFolders&& o) noexcept
    : handles_(std::move(o.handles_)), made_(std::move(o.made_)) {
  o.handles_.clear();
}

RecordedFolders::~RecordedFolders() {
  for (int h : handles_) forget_unfinished_file(h);
}

namespace {

/// Rethrows the exception being handled. A plain std::runtime_error whose message starts with the
/// temporary `tmp` ("out.tmp-42/model.safetensors: write failed: ...") names `target` there
/// instead, and says nothing was replaced: the temporary is removed by the time anyone reads it.
[[noreturn]] void rethrow_naming_target(const std::string& tmp, const std::string& target) {
  try {
    throw;
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    const bool names_tmp = what.size() > tmp.size() && what.compare(0, tmp.size(), tmp) == 0 &&
                           (what[tmp.size()] == '/' || what[tmp.size()] == ':');
    if (typeid(e) != typeid(std::runtime_error) || !names_tmp) throw;
    throw std::runtime_error(target + what.substr(tmp.size()) + " (nothing was replaced)");
  }
}

}  // namespace

void replace_file(const std::string& path, const std::function<void(const std::string& tmp)>& write) {
  const std::string tmp = temporary_path(path);
  const int slot = claim(tmp, path, "tmp", false, /*cover_leftover=*/true);
  std::error_code ec;
  try {
    write(tmp);
    sync_path(tmp, false);
    fs::rename(tmp, path, ec);
    if (ec) fail(path, fmt::format("cannot move into place: {}", ec.message()));
    g_replacements.fetch_add(1);
    unregister_temporary(slot);
    drop_marker(tmp);
    sync_path(parent_of(path), true);
  } catch (...) {
    unregister_temporary(slot);
    fs::remove(tmp, ec);
    drop_marker(tmp);
    rethrow_naming_target(tmp, path);
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

namespace {

/// Records `tmp` in g_unfinished_folders while alive.
class UnfinishedFolder {
 public:
  explicit UnfinishedFolder(std::string tmp) : tmp_(std::move(tmp)) {
    const std::lock_guard<std::mutex> lock(g_folders_mutex);
    g_unfinished_folders.push_back(tmp_);
  }
  ~UnfinishedFolder() {
    const std::lock_guard<std::mutex> lock(g_folders_mutex);
    const auto it = std::find(g_unfinished_folders.begin(), g_unfinished_folders.end(), tmp_);
    if (it != g_unfinished_folders.end()) g_unfinished_folders.erase(it);
  }
  UnfinishedFolder(const UnfinishedFolder&) = delete;
  UnfinishedFolder& operator=(const UnfinishedFolder&) = delete;

 private:
  std::string tmp_;
};

/// replace_folder once `tmp` is claimed and created: fill, keep the user's files, sync, swap
/// into place.
void fill_and_swap(const std::string& d, const std::string& tmp,
                   const std::function<void(const std::string& tmp)>& fill) {
  std::error_code ec;
  fill(tmp);
  if (fs::is_directory(d, ec)) carry_unlisted_entries(d, tmp);
  sync_tree(tmp);
  const std::lock_guard<std::mutex> swapping(g_swap_mutex);
  // Swap into place: the old folder is removed only once the new one is there.
  const bool had_old = fs::exists(d, ec);
  const std::string old = fmt::format("{}.old-{}", d, ::getpid());
  if (had_old) {
    claim(old, d, "old", true, /*cover_leftover=*/false);
    fs::rename(d, old, ec);
    if (ec) {
      drop_marker(old);
      fail(d, fmt::format("cannot move the previous version aside: {}", ec.message()));
    }
    call_hook("folder-aside", d);
  }
  fs::rename(tmp, d, ec);
  if (ec) {
    const std::string msg = ec.message();
    if (had_old) {
      fs::rename(old, d, ec);
      if (!ec) drop_marker(old);
    }
    fail(d, fmt::format("cannot move the new version into place: {}", msg));
  }
  g_replacements.fetch_add(1);
  drop_marker(tmp);
  sync_path(parent_of(d), true);
  if (had_old) {
    fs::remove_all(old, ec);
    if (!ec) drop_marker(old);
    else  // the new version is in place; the old one and its marker stay for a later run or the user
      report_leftover(fmt::format(
          "{}: the previous version of {}, which the new one replaced, cannot be removed ({}); it is kept "
          "with its marker {}: make it writable and remove both, or a later roundpipe run writing into {} "
          "removes them once it can",
          old, d, ec.message(), owner_marker_path(old), parent_of(d)));
  }
  call_hook("folder-replaced", d);
}

}  // namespace

void replace_folder(const std::string& dir_in, const std::function<void(const std::string& tmp)>& fill) {
  const std::string d = strip_slashes(dir_in);
  std::error_code ec;
  if (fs::is_symlink(d, ec))
    fail(d,
         "is a symbolic link, which roundpipe does not replace (it writes a folder of its own there); move "
         "it away");
  if (fs::exists(d, ec) && !fs::is_directory(d, ec)) fail(d, "exists and is not a directory");
  const std::string tmp = temporary_path(d);
  if (const fs::path parent = fs::path(d).parent_path(); !parent.empty()) fs::create_directories(parent, ec);
  claim(tmp, d, "tmp", false, /*cover_leftover=*/false);
  if (!fs::create_directory(tmp, ec)) {
    drop_marker(tmp);
    fail(tmp, fmt::format("cannot create: {}", ec ? ec.message() : std::string("exists")));
  }
  try {
    const UnfinishedFolder unfinished(tmp);
    fill_and_swap(d, tmp, fill);
  } catch (...) {
    if (fs::exists(tmp, ec)) fs::remove_all(tmp, ec);
    if (!fs::exists(tmp, ec)) drop_marker(tmp);
    rethrow_naming_target(tmp, d);
  }
}

std::vector<ForeignEntry> entries_to_keep(const std::string& from, const std::string& to) {
  std::error_code ec;
  const bool recorded = fs::exists(fs::symlink_status(fs::path(from) / kManifestFile, ec)) ||
                        fs::exists(fs::symlink_status(fs::path(to) / kManifestFile, ec));
  if (!recorded) return {};
  return foreign_entries(fs::path(from));
}

std::optional<ForeignEntry> keep_conflict(const std::string& from, const std::string& to,
                                          const std::vector<std::string>& also) {
  std::error_code ec;
  for (auto& e : entries_to_keep(from, to))
    if (fs::exists(fs::symlink_status(fs::path(to) / e.name, ec)) ||
        std::find(also.begin(), also.end(), e.name) != also.end())
      return e;
  return std::nullopt;
}

FolderConflict folder_conflict(const std::string& dir, const ForeignEntry& e, const std::string& what) {
  return FolderConflict(fmt::format("{}: {}, and {} would replace it; move it away (nothing was replaced)",
                                    (fs::path(dir) / e.name).string(), e.why, what));
}

std::vector<std::string> carry_unlisted_entries(const std::string& from, const std::string& to) {
  if (const auto c = keep_conflict(from, to))
    throw folder_conflict(from, *c, fmt::format("the new version of {}", from));
  std::error_code ec;
  std::vector<std::string> carried;
  for (const auto& e : entries_to_keep(from, to)) {
    fs::copy(
        fs::path(from) / e.name, fs::path(to) / e.name,
        fs::copy_options::recursive | fs::copy_options::create_hard_links | fs::copy_options::copy_symlinks,
        ec);
    if (ec)
      fail((fs::path(from) / e.name).string(),
           fmt::format("cannot keep it in the new version: {}", ec.message()));
    carried.push_back(e.name);
  }
  return carried;
}

bool dead_writers_leftover(const std::string& path) {
  const fs::path p(path);
  const std::string name = p.filename().string();
  const Leftover l = parse_leftover(name);
  if (l.tag_at == std::string::npos) return false;
  std::error_code ec;
  const fs::path marker(owner_marker_path(p.string()));
  if (!fs::is_regular_file(marker, ec)) return false;
  const Marker m = read_marker(marker, l, name);
  return m.valid && !writer_alive(m);
}

std::vector<StaleTemporary> clean_stale_temporaries(const std::string& dir, const std::string& only_target) {
  std::vector<StaleTemporary> done;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return done;
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    entries.push_back(it->path());
  std::sort(entries.begin(), entries.end());
  for (const auto& p : entries) {
    const std::string name = p.filename().string();
    if (name.size() > std::strlen(kMarkerSuffix) &&
        name.compare(name.size() - std::strlen(kMarkerSuffix), std::string::npos, kMarkerSuffix) == 0)
      continue;  // a marker: handled with its leftover (an orphan one below)
    const Leftover l = parse_leftover(name);
    if (l.tag_at == std::string::npos) continue;
    if (!only_target.empty() && name.substr(0, l.tag_at) != only_target) continue;
    const std::string target = (fs::path(dir) / name.substr(0, l.tag_at)).string();
    bool restored = false;
    std::string error;
    if (clean_marked(fs::path(dir), name, restored, error)) {
      done.push_back({p.string(), target, restored, false});
    } else if (!error.empty()) {  // a dead roundpipe writer's, which cannot be removed or put back
      done.push_back({p.string(), target, false, false, error});
    } else if (!fs::exists("/proc/" + l.pid, ec)) {  // looks like a dead writer's, but nothing proves it ours
      done.push_back({p.string(), target, false, true});
    }
  }
  // markers whose leftover is gone (a kill between the marker and the name, or after the
  // rename): ours when they parse and name a dead writer
  for (const auto& p : entries) {
    const std::string name = p.filename().string();
    if (name.size() <= std::strlen(kMarkerSuffix) ||
        name.compare(name.size() - std::strlen(kMarkerSuffix), std::string::npos, kMarkerSuffix) != 0)
      continue;
    const std::string leftover = name.substr(0, name.size() - std::strlen(kMarkerSuffix));
    if (fs::exists(fs::symlink_status(fs::path(dir) / leftover, ec))) continue;
    if (const Leftover l = parse_leftover(leftover);
        !only_target.empty() &&
        (l.tag_at == std::string::npos || leftover.substr(0, l.tag_at) != only_target))
      continue;
    bool restored = false;
    std::string error;
    clean_marked(fs::path(dir), leftover, restored, error);
  }
  return done;
}

}  // namespace rp
