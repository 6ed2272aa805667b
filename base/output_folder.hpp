// Where a command may write: the checks every writer of an output folder shares (train's
// output_dir, convert's and merge's OUT_DIR), so that no run replaces its own inputs or a
// folder that holds the user's other work.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace rp {

/// `p` absolute, with symbolic links, "." and ".." resolved as far as it exists, and no
/// trailing separator: two spellings of one folder compare equal.
std::filesystem::path resolved_path(const std::string& p);

/// Whether `inner` is `outer` or lies inside it (both resolved_path).
bool path_within(const std::filesystem::path& inner, const std::filesystem::path& outer);

/// Why `out` must not be an output folder, "" when it may be: "is the root folder", "is the
/// home folder ($HOME)", "is the working directory", "contains the working directory",
/// "starts with '~', ..." (a tilde only a shell expands).
std::string unsafe_output_folder(const std::string& out);

/// Why an output file may not be written at `path`, "" when it may: a folder ("is a folder;
/// expected a file name") or a link, device or pipe is never replaced (the write puts a new file
/// in its place), and an existing file only when `replace` (a --force, or a writer that appends)
/// ("a file is already there; choose another name or add --force to replace it"); a new file
/// needs its folder to exist ("the folder '<dir>' does not exist; ...").
std::string output_file_problem(const std::string& path, bool replace);

/// The first of `inputs` (empty ones skipped) that `out` is, contains or lies inside; ""
/// when none.
std::string overlapping_input(const std::string& out, const std::vector<std::string>& inputs);

/// The file a roundpipe writer leaves in every folder it writes as a whole (a checkpoint, its
/// trainer state, a merged model, a convert or merge output): {"written_by": "roundpipe
/// <command>", "files": [{"name": ..., "bytes": ..., "xxh3": ...}, ...]}, every file it wrote
/// there with its size and, for files up to kManifestHashBytes, the XXH3-64 of its content (16
/// hex digits). What it does not list, or lists with another size or content, is not
/// roundpipe's: a later write of the folder keeps it (replace_folder).
inline constexpr const char* kManifestFile = "roundpipe_manifest.json";
/// Files up to this size get their content's XXH3 in the manifest (configs, tokenizer files,
/// the model card, the trainer state): an edit that keeps the size still shows.
inline constexpr uint64_t kManifestHashBytes = uint64_t(16) << 20;

/// The names of folder `dir`'s entries, sorted (none when it cannot be read).
std::vector<std::string> entries_of(const std::filesystem::path& dir);

/// The entries of folder `dir` (their paths), sorted. A folder that cannot be listed (no read
/// permission, not a folder, gone) throws std::runtime_error "<dir>: cannot open the folder
/// (<reason>)", e.g. "(Permission denied)".
std::vector<std::filesystem::path> folder_entries(const std::string& dir);

/// One file a manifest lists: its size and, when recorded, the XXH3-64 of its content.
struct ManifestEntry {
  uint64_t bytes = 0;
  std::optional<uint64_t> xxh3;
};

/// The files the manifest of `dir` lists; nullopt when there is none or it is not one a
/// roundpipe writer wrote ("written_by" "roundpipe ...", every entry a plain file name with
/// its size, an "xxh3" of 16 hex digits where there is one).
std::optional<std::map<std::string, ManifestEntry>> manifest_files(const std::filesystem::path& dir);

/// Writes kManifestFile into folder `dir` (a writer's temporary, before it is put in place):
/// every regular file in it with its size (and XXH3 up to kManifestHashBytes), `written_by`
/// "roundpipe <command>". Throws std::runtime_error("<file>: <what>").
void write_manifest(const std::string& dir, const std::string& command);

/// An entry of a folder that nothing proves roundpipe's, and why.
struct ForeignEntry {
  std::string name;
  std::string
      why;  ///< "not written by roundpipe (roundpipe_manifest.json does not list it)", "changed since ..."
};

/// The entries of `dir` that are not provably roundpipe's, sorted: without a manifest (or with
/// one no roundpipe writer wrote) every entry; else every entry its manifest does not list as
/// a regular file of the recorded size and content (the manifest itself excluded).
std::vector<ForeignEntry> foreign_entries(const std::filesystem::path& dir);

/// The names of foreign_entries(dir).
std::vector<std::string> foreign_names(const std::filesystem::path& dir);

/// Why no folder can be made at `path`: its first folder (a parent, or the path itself) that is
/// a symbolic link to a missing target ("'out' is a symbolic link to 'gone', which does not
/// exist"; create_folders would stop there with "File exists"); "" when there is none.
std::string dangling_link_text(const std::string& path);

/// Why nothing can be reached at `path` (a file there, or with `folder` a folder), "" when
/// nothing stands in the way (it is there, or the part of it that is missing can be made):
/// "'a/f' is a file, not a folder" (the path itself, with `folder`), "'a/f/b/x' lies under
/// 'a/f', which is a file, not a folder", or "'<path>': cannot reach (<strerror>)" when the
/// system refuses to look it up (a folder on the way that cannot be entered, a loop of
/// symbolic links, a name too long). Paths are quoted as excerpt() quotes input, up to
/// kPathQuoteBytes. Never throws but std::bad_alloc.
/// Why `path` cannot be read as a file, "" when it is a regular file or missing (the reader's
/// own error names that): "a folder, not a file", or "not a regular file (a device, FIFO or
/// socket)" (a FIFO blocks the open forever, a device is read without end).
std::string not_a_file_text(const std::string& path);

inline constexpr size_t kPathQuoteBytes = 256;
std::string path_blocker_text(const std::string& path, bool folder = false);

/// Makes the folder `path` and the parents it lacks, one at a time in the order the path names
/// them ("a/../b" makes a, then b); returns the folders it made, deepest first, also when it
/// stops part way with `ec` set: exactly the folders a caller may take back. `on_made`, when
/// given, hears each folder the moment it is made (a caller recording them for a stop signal's
/// cleanup leaves no window in which one exists unrecorded).
std::vector<std::string> create_folders(const std::string& path, std::error_code& ec,
                                        const std::function<void(const std::string&)>& on_made = {});

/// Removes `folders` in order (deepest first) while each is empty; stops at the first that is
/// not (or cannot be removed), so nothing holding an entry is touched.
void remove_empty_folders(const std::vector<std::string>& folders);

/// Records `folders` (deepest first; an empty list clears the record) for
/// remove_recorded_folders: the folders a run made that a stop signal ending the process before
/// the run writes anything takes back. At most the 16 deepest are kept, each under 4096 bytes
/// (a longer name ends the list there).
void record_folders_made(const std::vector<std::string>& folders);

/// Removes the recorded folders in order while each is empty (rmdir), for a process about to end
/// at once on a signal (std::_Exit). Async-signal-safe.
void remove_recorded_folders() noexcept;

/// What a special file is called in an error line ("a named pipe", "a socket", "a block device",
/// "a character device", "a special file"); nullptr for a regular file, a folder, a symbolic link
/// and a missing entry.
const char* special_file_kind(std::filesystem::file_type t);

/// "a, b, c, ... (N in all)": at most `shown` of `names`, for a log or error line.
std::string name_list(const std::vector<std::string>& names, size_t shown = 5);

}  // namespace rp
