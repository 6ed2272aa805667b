// Where a command may write: the checks every writer of an output folder shares (train's
// output_dir, convert's and merge's OUT_DIR), so that no run replaces its own inputs or a
// folder that holds the user's other work.
#pragma once
#include <cstdint>
#include <filesystem>
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
/// home folder ($HOME)", "is the working directory", "contains the working directory".
std::string unsafe_output_folder(const std::string& out);

/// The first of `inputs` (empty ones skipped) that `out` is, contains or lies inside; ""
/// when none.
std::string overlapping_input(const std::string& out, const std::vector<std::string>& inputs);

/// The file a roundpipe writer leaves in every folder it writes as a whole (a checkpoint, its
/// trainer state, a convert or merge output): {"written_by": "roundpipe <command>", "files":
/// [{"name": ..., "bytes": ...}, ...]}, every file it wrote there with its size. What it does
/// not list is not roundpipe's: a later write of the folder keeps it (replace_folder).
inline constexpr const char* kManifestFile = "roundpipe_manifest.json";

/// The names of folder `dir`'s entries, sorted (none when it cannot be read).
std::vector<std::string> entries_of(const std::filesystem::path& dir);

/// The files the manifest of `dir` lists, each with its size in bytes; nullopt when there is
/// none or it is not one a roundpipe writer wrote ("written_by" "roundpipe ...", every entry a
/// plain file name with its size).
std::optional<std::map<std::string, uint64_t>> manifest_files(const std::filesystem::path& dir);

/// Writes kManifestFile into folder `dir` (a writer's temporary, before it is put in place):
/// every entry in it with its size, `written_by` "roundpipe <command>". Throws
/// std::runtime_error("<file>: <what>").
void write_manifest(const std::string& dir, const std::string& command);

/// The entries of `dir` that are not roundpipe's: every one its manifest does not list as a
/// regular file of the recorded size (the manifest itself excluded), sorted; nullopt when
/// `dir` has no manifest (nothing in it proves what roundpipe wrote).
std::optional<std::vector<std::string>> unlisted_entries(const std::filesystem::path& dir);

}  // namespace rp
