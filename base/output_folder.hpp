// Where a command may write: the checks every writer of an output folder shares (train's
// output_dir, convert's and merge's OUT_DIR), so that no run replaces its own inputs or a
// folder that holds the user's other work.
#pragma once
#include <filesystem>
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

}  // namespace rp
