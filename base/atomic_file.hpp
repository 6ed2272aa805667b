// Atomic replacement of files and folders: the one policy every writer of the project uses.
//
// A writer fills a temporary "<target>.tmp-<pid>" in the target's own folder (same file
// system, so the rename is atomic); the temporary is fsynced (a folder: every file in it,
// then the folder itself), renamed over the target, and the parent folder is fsynced, so
// after a crash or a power cut the target is the old version or the new one, never a mix.
// A folder that already exists is moved aside to "<target>.old-<pid>" first and removed
// once the new one is in place (a folder cannot be renamed over a non-empty one).
//
// Ownership: before a writer creates a "<target>.tmp-<pid>" or moves a folder aside to
// "<target>.old-<pid>", it writes the marker "<that name>.roundpipe-owner" beside it, naming
// the writing process (pid and start time), the kind (tmp or old) and the target; the
// marker goes once the name is gone. A name of that form that already exists and carries no
// marker of a dead writer is never removed, renamed or reused: the write fails instead.
//
// A killed writer leaves these names behind. clean_stale_temporaries() acts only on names
// whose marker names a writer that is no longer alive (no process with that pid and start
// time): a .tmp-<pid> is removed, an .old-<pid> is put back when the kill came before the
// new version was in place (else removed), so a finished version is never lost. Names that
// look like leftovers but carry no such marker are reported and left alone. A previous version
// that cannot be removed once the new one is in place (a folder the user made read-only) keeps
// its marker and is reported (set_leftover_reporter), and so is it by each later clean until it
// can be removed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "base/output_folder.hpp"

namespace rp {

/// "<path>.tmp-<pid of this process>": where replace_file / replace_folder write first.
std::string temporary_path(const std::string& path);

/// "<leftover>.roundpipe-owner": the marker that proves `leftover` (a .tmp-<pid> or
/// .old-<pid> name) was made by a roundpipe writer.
std::string owner_marker_path(const std::string& leftover);

/// Replaces the file `path`: `write(tmp)` creates and fills the file `tmp` (any I/O library;
/// it must close it), which is then fsynced, renamed over `path`, and the folder fsynced.
/// On any failure (an exception from `write` propagates unchanged) the temporary is removed
/// and `path` is left as it was. I/O failures throw std::runtime_error("<path>: <what>"); a
/// temporary name that exists without our marker throws
/// std::runtime_error("<tmp>: exists and was not made by roundpipe; ...") before anything is written.
/// A std::runtime_error from `write` that names the temporary is rethrown naming `path` ("<path>:
/// write failed ... (nothing was replaced)"): the temporary is gone by then.
void replace_file(const std::string& path, const std::function<void(const std::string& tmp)>& write);

/// Removes the temporaries (and their owner markers) of every replace_file of this process that
/// has not finished: for a process about to end at once on a signal (std::_Exit), so that a
/// large half-written file (a disk tier's cache) is not left until the next run cleans it.
/// Async-signal-safe (unlink over a fixed table); a replace_file whose temporary it removed
/// fails if it ever resumes. Folders of replace_folder are not covered (remove_unfinished_folders
/// removes them, outside the handler; else the next run's clean_stale_temporaries, as after a kill).
/// Returns how many temporaries and recorded folders it removed.
size_t remove_unfinished_temporaries() noexcept;

/// Removes the temporary folders (and their owner markers) of every replace_folder of this
/// process that has not finished, for a process about to end on a signal: a half-written
/// checkpoint is not left until the next run cleans it. From then on no replace_folder swaps
/// a folder into place (one swapping right now finishes first: its folder is complete, no
/// longer a temporary); the caller ends the process (std::_Exit) right after. Not
/// async-signal-safe: a thread that the signal handler wakes calls it.
/// Returns how many it removed (0 on every call after the first).
size_t remove_unfinished_folders() noexcept;

/// How many replace_file / replace_folder calls of this process have moved their new version
/// into place so far (a stop signal's exit tells an output finished before it from one it cut
/// short). Lock-free.
uint64_t replacements_done() noexcept;

/// Adds a file this process made and removes itself when done (a builders' lock file it
/// created), or a folder it made for one (removed only while empty, after the files), to what
/// remove_unfinished_temporaries removes, until forget_unfinished_file(handle). Returns the
/// handle, -1 when the table is full or the name too long (it then stays after a signal, as
/// after a kill).
int record_unfinished_file(const std::string& path) noexcept;
void forget_unfinished_file(int handle) noexcept;

/// Makes folder `path` and its missing parents as create_folders does, recording each folder it
/// makes with record_unfinished_file from the moment it exists until this object goes: a
/// process ended on a signal meanwhile (remove_unfinished_temporaries) takes back those still
/// empty. made() and `ec` are create_folders'. Movable, not copyable.
class RecordedFolders {
 public:
  RecordedFolders(const std::string& path, std::error_code& ec);
  ~RecordedFolders();
  RecordedFolders(RecordedFolders&& o) noexcept;
  RecordedFolders& operator=(RecordedFolders&&) = delete;
  const std::vector<std::string>& made() const { return made_; }

 private:
  std::vector<int> handles_;
  std::vector<std::string> made_;
};

/// replace_file with a binary std::ostream opened on the temporary: `write(os)` writes the
/// content; a stream that cannot be opened throws "<path>: cannot write (<reason>)", a failed
/// stream after `write` "<path>: write failed (disk full?)".
void write_file_atomically(const std::string& path, const std::function<void(std::ostream& os)>& write);

/// A rewrite of a folder that would replace a file roundpipe did not write there (a user's
/// file, or one of roundpipe's that the user changed): what() is one line naming the file and
/// what to do. Nothing was replaced.
struct FolderConflict : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Replaces the folder `dir`: `fill(tmp)` writes the new content into the (fresh, empty)
/// folder `tmp`; what the existing `dir` holds that is not roundpipe's is carried into `tmp`
/// (carry_unlisted_entries); every file in it and the folder are fsynced, an existing `dir` is moved
/// aside to "<dir>.old-<pid>", `tmp` renamed to `dir`, the old one removed and the parent
/// fsynced. A trailing '/' of `dir` is ignored. On failure the temporary is removed and a
/// previous `dir` is kept (put back if it had been moved aside). `dir` existing as a file
/// or a symbolic link throws std::runtime_error("<dir>: exists and is not a directory" / "is a
/// symbolic link ..."); a temporary or aside name that exists without our marker throws (as
/// replace_file); a file of the user's that the new version would replace throws
/// FolderConflict; I/O failures throw std::runtime_error("<dir or file>: <what>"); an
/// exception from `fill` propagates, a std::runtime_error naming a file of the temporary
/// ("<dir>.tmp-<pid>/x: write failed ...") renamed to name it in `dir` ("<dir>/x: write failed
/// ... (nothing was replaced)"), since the temporary is gone by then. replace_file does the same.
void replace_folder(const std::string& dir, const std::function<void(const std::string& tmp)>& fill);

/// The entries of folder `from` (the version a rewrite replaces) that the rewrite must keep:
/// when `from` or the new version `to` holds a roundpipe_manifest.json (a writer that records
/// what it writes), every entry of `from` not provably roundpipe's (foreign_entries: all of
/// them when `from` has no manifest); else none (a folder no writer recorded is replaced as a
/// whole, as save_hf_checkpoint without a manifest does).
std::vector<ForeignEntry> entries_to_keep(const std::string& from, const std::string& to);

/// The first of entries_to_keep(from, to) whose name `to` already holds (or `also` names):
/// the new version would replace it. nullopt when none.
std::optional<ForeignEntry> keep_conflict(const std::string& from, const std::string& to,
                                          const std::vector<std::string>& also = {});

/// The FolderConflict for `e` in folder `dir` ("<dir>/<name>: <e.why>, and <what> would replace
/// it; move it away (nothing was replaced)").
FolderConflict folder_conflict(const std::string& dir, const ForeignEntry& e, const std::string& what);

/// Keeps the user's files across a rewrite of a folder: every entry of entries_to_keep(from,
/// to) is hard-linked into folder `to` (a sub-folder is recreated with its files hard-linked,
/// symbolic links copied as links), so that it is in both until `from` goes and a kill at any
/// moment loses none of it. One whose name `to` already holds throws FolderConflict before
/// anything is linked; I/O failures throw std::runtime_error("<path>: <what>"). Returns the
/// names carried.
std::vector<std::string> carry_unlisted_entries(const std::string& from, const std::string& to);

/// What clean_stale_temporaries found for one leftover.
struct StaleTemporary {
  std::string path;         ///< the leftover, e.g. "runs/a/final.tmp-4242"
  std::string target;       ///< what it was written for, e.g. "runs/a/final"
  bool restored = false;    ///< true: an .old-<pid> put back as `target`
  bool left_alone = false;  ///< true: no marker of a dead roundpipe writer; nothing was done
  /// Not empty: a dead roundpipe writer's leftover (its marker proves it) that could not be
  /// removed or put back, and why ("cannot remove it (Permission denied)"); it and its marker stay.
  std::string error;
};

/// Cleans the leftovers of roundpipe writers that are no longer alive directly in folder
/// `dir` (not recursive; a missing folder is fine): "<name>.tmp-<pid>" and
/// "<name>.old-<pid>" with a marker naming a dead writer (removed, or restored) and their
/// markers; one of those that cannot be removed or restored is returned with `error` set and
/// kept with its marker. Names of that form with a dead pid but no such marker are returned with
/// left_alone set and not touched. Returns what was found, in directory order; failures to
/// remove are skipped silently (the next run tries again). `only_target` (a name in `dir`):
/// only the leftovers written for it ("<only_target>.tmp-<pid>", ".old-<pid>") are looked at,
/// as a writer of one folder (convert's OUT_DIR) does before it writes that folder again.
std::vector<StaleTemporary> clean_stale_temporaries(const std::string& dir,
                                                    const std::string& only_target = "");

/// Whether `path` ("<dir>/<name>.tmp-<pid>" or ".old-<pid>") is the leftover of a roundpipe
/// writer that is no longer alive: its marker parses, names it and names a dead process.
/// What clean_stale_temporaries would act on; a caller that knows more about a pair of
/// leftovers (a checkpoint's weights and state) may act on them first.
bool dead_writers_leftover(const std::string& path);

/// Where replace_folder reports a previous version it moved aside ("<dir>.old-<pid>") but could
/// not remove once the new version was in place (a folder the user made read-only): one line
/// naming it, why, and what to do; the aside folder keeps its marker, so a later run removes it
/// once it can. Unset (the default): "roundpipe: warning: <line>" on stderr. Not thread-safe:
/// set it before any writer runs.
void set_leftover_reporter(std::function<void(const std::string& line)> report);

/// Test hook: when set, called with ("marker-created", folder) right after an owner marker was
/// created and recorded for a stop signal (before its text is written), with ("folder-aside",
/// dir) right after an existing folder was moved aside and with ("folder-replaced", dir) once
/// replace_folder put the new `dir` in place; an exception from it propagates like one from `fill`. Not
/// thread-safe: set it only while no writer runs.
void set_atomic_write_hook(std::function<void(const std::string& event, const std::string& dir)> hook);

}  // namespace rp
