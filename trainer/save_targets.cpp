#include "trainer/save_targets.hpp"

#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "base/atomic_file.hpp"
#include "base/output_folder.hpp"
#include "roundpipe/adapter.hpp"
#include "trainer/checkpoint_bundle.hpp"

namespace fs = std::filesystem;

namespace rp {

bool save_may_write(SavedFolder kind, const std::string& name) {
  if (name == kManifestFile) return true;
  switch (kind) {
    case SavedFolder::trainer_state: return name == kOptimizerStateFile || name == kRunStateFile;
    case SavedFolder::adapter:
      return name == kAdapterConfigFile || name == kAdapterWeightsFile || name == kAdapterBaseFile;
    case SavedFolder::hf_weights: {
      const bool shard = name.rfind("model-", 0) == 0 && name.size() > 18 &&
                         name.compare(name.size() - 12, 12, ".safetensors") == 0;
      return shard || name == "config.json" || name == "generation_config.json" ||
             name == "model.safetensors" || name == "model.safetensors.index.json" ||
             name == "tokenizer.json" || name == "tokenizer_config.json";
    }
  }
  return false;
}

namespace {

/// What a save cannot keep in the new version of a folder (carry_unlisted_entries keeps regular
/// files, folders and symbolic links): `p` itself, or the first such file inside it when it is a
/// folder (links not followed), with its kind ("a named pipe"); nullopt when there is none.
std::optional<std::pair<fs::path, std::string>> special_file_in(const fs::path& p) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(p, ec);
  if (const char* k = special_file_kind(st.type())) return std::pair{p, std::string(k)};
  if (st.type() != fs::file_type::directory) return std::nullopt;
  for (fs::recursive_directory_iterator it(p, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec))
    if (const char* k = special_file_kind(it->symlink_status(ec).type()))
      return std::pair{it->path(), std::string(k)};
  return std::nullopt;
}

/// Throws FolderConflict when folder `dir` cannot take a save of kind `kind`.
void check_target(const fs::path& dir, SavedFolder kind) {
  std::error_code ec;
  const auto st = fs::symlink_status(dir, ec);
  if (!fs::exists(st)) return;
  if (fs::is_symlink(st))
    throw FolderConflict(
        fmt::format("{}: is a symbolic link, and the run saves a folder of its own there; move it "
                    "away or choose another output_dir (nothing was trained)",
                    dir.string()));
  if (!fs::is_directory(st))
    throw FolderConflict(
        fmt::format("{}: exists and is not a folder, and the run saves a folder there; move it "
                    "away or choose another output_dir (nothing was trained)",
                    dir.string()));
  for (const ForeignEntry& e : foreign_entries(dir)) {
    if (save_may_write(kind, e.name))
      throw FolderConflict(
          fmt::format("{}: {}, and the run's save of {} would replace it; move it away or choose "
                      "another output_dir (nothing was trained)",
                      (dir / e.name).string(), e.why, dir.string()));
    // the save keeps the user's files in the new version of the folder, which it cannot do for
    // these: found now, not after the training at the save
    if (const auto special = special_file_in(dir / e.name))
      throw FolderConflict(fmt::format(
          "{}: is {}, which the run's save of {} cannot keep beside its files; move it away or choose "
          "another output_dir (nothing was trained)",
          special->first.string(), special->second, dir.string()));
  }
}

}  // namespace

void check_save_targets(const TrainSpec& spec, bool lora, int64_t start) {
  const fs::path out(spec.output_dir);
  std::error_code ec;
  const auto state = fs::symlink_status(out / "state", ec);
  if (fs::exists(state) && !fs::is_directory(state))
    throw FolderConflict(
        fmt::format("{}: is {}, and the run keeps its checkpoints' trainer state in a folder of its "
                    "own there; move it away or choose another output_dir (nothing was trained)",
                    (out / "state").string(), fs::is_symlink(state) ? "a symbolic link" : "not a folder"));
  const SavedFolder weights = lora ? SavedFolder::adapter : SavedFolder::hf_weights;
  std::vector<std::string> names = {"final"};
  if (spec.save_every > 0)
    for (const auto& name : entries_of(out)) {
      const int64_t n = checkpoint_number(name);
      if (n > start && n % spec.save_every == 0 && (spec.epochs || n < spec.steps)) names.push_back(name);
    }
  for (const auto& name : names) {
    check_target(out / "state" / name, SavedFolder::trainer_state);
    check_target(out / name, weights);
  }
  if (lora && spec.merge_adapters) check_target(out / "final-merged", SavedFolder::hf_weights);
}

}  // namespace rp
