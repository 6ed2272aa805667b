#include "trainer/checkpoint_bundle.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "base/atomic_file.hpp"
#include "base/checksum.hpp"
#include "base/counted.hpp"
#include "base/json_text.hpp"
#include "base/output_folder.hpp"
#include "formats/optimizer_state.hpp"
#include "model/config.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/model_source.hpp"
#include "trainer/run_setup.hpp"

namespace fs = std::filesystem;

namespace rp {

std::string state_dir_of(const std::string& dir) {
  fs::path d(dir);
  // "runs/x/final/" -> "runs/x/final"; "/" is its own parent, where this stops
  while (d.has_parent_path() && !d.has_filename() && d.parent_path() != d) d = d.parent_path();
  return (d.parent_path() / "state" / d.filename()).string();
}

namespace {
/// Makes the state/ folder above trainer-state folder `sd` (and its missing parents), recorded
/// for a signal's cleanup while the returned object lives. Throws std::runtime_error
/// "<folder>: cannot create the folder (<reason>)".
RecordedFolders make_state_parent(const std::string& sd) {
  const std::string parent = fs::path(sd).parent_path().string();
  std::error_code ec;
  RecordedFolders made(parent, ec);
  if (ec) throw std::runtime_error(fmt::format("{}: cannot create the folder ({})", parent, ec.message()));
  return made;
}
}  // namespace

std::string weights_checksum(const std::string& dir) {
  std::vector<fs::path> files;
  const auto ours = manifest_files(dir);  // a user's *.safetensors kept in the folder is not the checkpoint's
  for (const fs::path& p : folder_entries(dir)) {
    std::error_code ec;
    if (p.extension() == ".safetensors" && fs::is_regular_file(p, ec) &&
        (!ours || ours->count(p.filename().string())))
      files.push_back(p);
  }
  Checksum c;
  std::vector<char> buf(size_t(8) << 20);
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw std::runtime_error(fmt::format("{}: cannot open ({})", f.string(), std::strerror(errno)));
    while (in) {
      in.read(buf.data(), std::streamsize(buf.size()));
      c.update(buf.data(), size_t(in.gcount()));
    }
  }
  return fmt::format("{:016x}", c.digest());
}

void save_checkpoint_bundle(Session& session, const std::string& dir, const LoadedModel& model,
                            DType save_dtype, const TrainerState& state, const BaseModelRef& base,
                            const std::function<void(const std::string& tmp_dir)>& extra) {
  session.synchronize();
  std::vector<const float*> ptrs;
  for (auto& g : session.master_weights()) ptrs.push_back(g.empty() ? nullptr : g.data());  // frozen: empty
  // The trainer state goes first and the weights last: the state folder is put in place
  // while the new weights wait in their temporary folder; only then do they replace
  // `dir`. A save killed in between leaves state/<name> without (matching) weights, which
  // resumable_checkpoint treats as no checkpoint, never weights that look resumable without
  // their state.
  const std::string sd = state_dir_of(dir);
  auto write_state = [&](const std::string& weights_tmp) {
    write_manifest(weights_tmp, "train");  // what the run wrote: a re-save keeps everything else
    // a file of the user's in `dir` that the new weights folder would replace fails the save
    // before its state is replaced (the pair stays whole)
    std::error_code ec;
    if (fs::is_directory(dir, ec))
      if (const auto c = keep_conflict(dir, weights_tmp))
        throw folder_conflict(dir, *c, "the save of " + dir);
    TrainerState st = state;
    st.weights_xxh3 = weights_checksum(weights_tmp);  // the files keep their bytes through the rename
    st.model_config = architecture_of(model.config);
    st.model_numerics = numerics_of(model.config);
    // a second stop signal during the first save takes back the state/ folder it made (empty
    // once the unfinished state/<name>.tmp-<pid> has gone)
    const RecordedFolders state_parent = make_state_parent(sd);
    replace_folder(sd, [&](const std::string& tmp) {
      // model.safetensors holds the fp32 master exactly only when saved in f32
      session.save_optimizer_state(tmp + "/" + kOptimizerStateFile, save_dtype != DType::f32);
      write_trainer_state(tmp + "/" + kRunStateFile, st);
      write_manifest(tmp, "train");
    });
  };
  if (session.layout().lora) {  // a PEFT adapter folder: the adapters and the trained base modules
    save_peft_adapter(dir, session.layout(), ptrs, base.portable(), save_dtype, [&](const std::string& tmp) {
      write_adapter_base_record(tmp, base);
      if (extra) extra(tmp);
      write_state(tmp);
    });
  } else {
    save_hf_checkpoint(dir, session.layout(), ptrs, model.tokenizer_json, model.chat_template, save_dtype,
                       [&](const std::string& tmp) {
                         if (extra) extra(tmp);
                         write_state(tmp);
                       });
  }
}

namespace {
/// The files of checkpoint folder `src` a copy into `dst` takes: what the save of `src` wrote
/// (its manifest lists it, unchanged; every regular file of a folder without one), but not the
/// card when `dst` holds a README.md of the user's, which the copy keeps.
std::vector<std::string> names_to_copy(const std::string& src, const std::string& dst) {
  const std::vector<std::string> foreign =
      manifest_files(src) ? foreign_names(src) : std::vector<std::string>{};
  std::error_code ec;
  const std::vector<std::string> users =
      fs::is_directory(dst, ec) ? foreign_names(dst) : std::vector<std::string>{};
  auto has = [](const std::vector<std::string>& v, const std::string& n) {
    return std::find(v.begin(), v.end(), n) != v.end();
  };
  std::vector<std::string> out;
  for (const auto& name : entries_of(src)) {
    if (!fs::is_regular_file(fs::symlink_status(fs::path(src) / name, ec)) || has(foreign, name)) continue;
    if (name == "README.md" && has(users, name)) continue;
    out.push_back(name);
  }
  return out;
}

void copy_folder(const std::string& src, const std::string& dst) {
  const std::vector<std::string> names = names_to_copy(src, dst);
  std::error_code ec;
  if (fs::is_directory(dst, ec))
    for (const auto& e : entries_to_keep(dst, src))
      if (std::find(names.begin(), names.end(), e.name) != names.end())
        throw folder_conflict(dst, e, "the copy of " + src);
  replace_folder(dst, [&](const std::string& tmp) {
    for (const auto& name : names) {
      fs::copy_file(fs::path(src) / name, fs::path(tmp) / name, ec);
      if (ec) throw std::runtime_error(fmt::format("{}/{}: cannot copy ({})", src, name, ec.message()));
    }
  });
}
}  // namespace

void copy_checkpoint_bundle(const std::string& from, const std::string& to) {
  if (!resumable_checkpoint(from))
    throw std::runtime_error(
        fmt::format("{}: not a complete checkpoint (its weights or trainer state are missing)", from));
  // the weights folder's conflicts are found before the state is replaced (the pair stays whole)
  std::error_code ec;
  const std::vector<std::string> weights = names_to_copy(from, to);
  if (fs::is_directory(to, ec))
    for (const auto& e : entries_to_keep(to, from))
      if (std::find(weights.begin(), weights.end(), e.name) != weights.end())
        throw folder_conflict(to, e, "the copy of " + from);
  const std::string sd = state_dir_of(to);
  const RecordedFolders state_parent = make_state_parent(sd);
  copy_folder(state_dir_of(from), sd);
  copy_folder(from, to);
}

bool looks_like_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && (fs::exists(state_dir_of(dir) + "/" + kRunStateFile, ec) ||
                                       fs::exists(fs::path(dir) / "trainer_state.json", ec));
}

bool resumable_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  const std::string sd = state_dir_of(dir);
  if (fs::exists(fs::path(dir) / "trainer_state.json", ec))  // earlier releases: the state inside
    return fs::exists(fs::path(dir) / "optimizer.bin", ec);
  if (!fs::exists(sd + "/" + kRunStateFile, ec) || !fs::exists(sd + "/" + kOptimizerStateFile, ec))
    return false;
  try {
    const TrainerState saved = read_trainer_state(sd + "/" + kRunStateFile);
    if (!saved.weights_xxh3.empty() && saved.weights_xxh3 != weights_checksum(dir)) return false;
    OptimizerStateReader(sd + "/" + kOptimizerStateFile)
        .check_extent();  // truncated or extended: not this one
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

int64_t checkpoint_number(const std::string& name) {
  constexpr size_t prefix = 11;  // "checkpoint-"
  if (name.rfind("checkpoint-", 0) != 0 || name.size() <= prefix || name.size() > prefix + 18 ||
      name.find_first_not_of("0123456789", prefix) != std::string::npos)
    return -1;
  return std::stoll(name.substr(prefix));
}

std::vector<std::string> checkpoints_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (fs::path(dir).lexically_normal().filename() == "state")
    return out;  // the trainer's state, not checkpoints
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_directory(ec) && (name == "final" || checkpoint_number(name) >= 0)) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string newest_checkpoint(const std::vector<std::string>& names) {
  std::string best;
  int64_t n = -1;
  for (const auto& s : names) {
    if (s == "final") return s;
    if (checkpoint_number(s) > n) n = checkpoint_number(s), best = s;
  }
  return best;
}

std::string newest_resumable_checkpoint(const std::string& dir, std::vector<std::string> names) {
  while (!names.empty()) {
    const std::string n = newest_checkpoint(names);
    if (resumable_checkpoint((fs::path(dir) / n).string())) return n;
    names.erase(std::find(names.begin(), names.end(), n));
  }
  return "";
}

namespace {
/// What --resume expects, as its refusals say it.
constexpr const char* kCheckpointExpected =
    "expected a checkpoint folder of a roundpipe train run, <out>/checkpoint-<k>/ or <out>/final/ (its "
    "weights), with its trainer state in <out>/state/<name>/";
}  // namespace

std::optional<ResumePoint> check_resume(const TrainSpec& spec) {
  if (spec.resume_from.empty()) return std::nullopt;
  ResumePoint r;
  r.dir = spec.resume_from;
  while (r.dir.size() > 1 && r.dir.back() == '/') r.dir.pop_back();
  std::error_code ec;
  if (!fs::is_directory(r.dir, ec))
    throw std::invalid_argument(fmt::format("{}: cannot resume: not a checkpoint folder ({}); {}", r.dir,
                                            fs::exists(r.dir, ec) ? "a file" : "it does not exist",
                                            kCheckpointExpected));
  const std::string sd = state_dir_of(r.dir);
  if ((void)fs::status(sd + "/" + kRunStateFile, ec);
      ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
    throw std::runtime_error(fmt::format("{}/{}: cannot reach ({})", sd, kRunStateFile, ec.message()));
  if (fs::exists(sd + "/" + kRunStateFile, ec)) {
    r.saved = read_trainer_state(sd + "/" + kRunStateFile);
    r.optimizer_file = sd + "/" + kOptimizerStateFile;
    if (!r.saved.weights_xxh3.empty() && r.saved.weights_xxh3 != weights_checksum(r.dir))
      throw std::runtime_error(
          fmt::format("{}/{}: belongs to other weights than {}/model.safetensors (a save was "
                      "interrupted between the two); resume from another checkpoint",
                      sd, kRunStateFile, r.dir));
  } else if (fs::exists(r.dir + "/trainer_state.json", ec)) {  // earlier releases: the state inside
    r.saved = read_trainer_state(r.dir + "/trainer_state.json");
    r.optimizer_file = r.dir + "/optimizer.bin";
  } else if (const fs::path p(r.dir); p.parent_path().filename() == "state" &&
                                      fs::is_directory(p.parent_path().parent_path() / p.filename(), ec)) {
    const std::string ckpt = (p.parent_path().parent_path() / p.filename()).string();
    std::string damaged;  // a state file here that cannot be read is named with what is wrong
    if (const std::string f = r.dir + "/" + kRunStateFile; fs::exists(f, ec)) try {
        read_trainer_state(f);
      } catch (const std::exception& e) {
        damaged = fmt::format(" (and {}, which cannot resume the run)", e.what());
      }
    throw std::invalid_argument(
        fmt::format("{}: the trainer state of checkpoint {}; resume from {}{}", r.dir, ckpt, ckpt, damaged));
  } else if (const fs::path p(r.dir);
             p.parent_path().filename() == "state" && fs::exists(p / kRunStateFile, ec)) {
    // <out>/state/<name> without <out>/<name>: the weights it belongs to are gone
    throw std::invalid_argument(
        fmt::format("{}: the trainer state of checkpoint {}, which is missing (nothing to "
                    "resume there)",
                    r.dir, (p.parent_path().parent_path() / p.filename()).string()));
  } else if (const fs::path p(r.dir);
             p.filename() == "state" && !checkpoints_in(p.parent_path().string()).empty()) {
    // <out>/state: the trainer states of a run's checkpoints, which resume from <out>/<checkpoint>
    const std::string out = p.parent_path().string();
    const std::string n = newest_resumable_checkpoint(out, checkpoints_in(out));
    throw std::invalid_argument(
        n.empty()
            ? fmt::format("{}: the trainer states of the run in {}, none of whose checkpoints can be resumed",
                          r.dir, out)
            : fmt::format("{}: the trainer states of the run in {}; resume from {}/{}", r.dir, out, out, n));
  } else if (const auto inside = checkpoints_in(r.dir); !inside.empty()) {
    const std::string n = newest_resumable_checkpoint(r.dir, inside);
    throw std::invalid_argument(
        n.empty()
            ? fmt::format(
                  "{}: a run's output folder, not a checkpoint, and none of its checkpoints ({}) can be "
                  "resumed (their trainer state is missing or belongs to other weights, or their optimizer "
                  "state is damaged)",
                  r.dir, fmt::join(inside, ", "))
            : fmt::format("{}: a run's output folder, not a checkpoint; resume from {}/{}", r.dir, r.dir, n));
  } else if (fs::exists(fs::path(r.dir) / kRunMarkerFile, ec)) {
    throw std::invalid_argument(
        fmt::format("{}: a run's output folder with no checkpoint in it (nothing to resume)", r.dir));
  } else if (fs::exists(fs::path(r.dir) / "config.json", ec) ||
             fs::exists(fs::path(r.dir) / kAdapterConfigFile, ec)) {
    // weights without their trainer state: a model folder, or a checkpoint moved away from its run
    throw std::runtime_error(fmt::format(
        "{}: cannot resume: a model folder without the trainer state of a checkpoint ({}/{} is missing; "
        "roundpipe train keeps the state of <out>/<checkpoint> in <out>/state/<checkpoint>); to train from "
        "these weights give the folder as \"model\" (--model) instead",
        r.dir, sd, kRunStateFile));
  } else {
    // named as given: the state's path beside it ("/state/tmp" for /tmp) would only confuse
    throw std::invalid_argument(
        fmt::format("{}: cannot resume: not a checkpoint folder; {}", r.dir, kCheckpointExpected));
  }
  if (!fs::exists(r.optimizer_file, ec))
    throw std::runtime_error(fmt::format("{}: missing (expected the optimizer state next to {})",
                                         r.optimizer_file, kRunStateFile));
  // a truncated or extended file is refused here, before the model loads for it
  OptimizerStateReader(r.optimizer_file).check_extent();
  if (!spec.epochs && r.saved.step >= spec.steps)  // with epochs the run checks once the data gives its steps
    throw std::invalid_argument(
        fmt::format("{}: the checkpoint is at step {} and the spec trains {}; nothing "
                    "is left to do (raise 'steps' or pass --steps)",
                    r.dir, r.saved.step, counted(spec.steps, "step")));
  return r;
}

namespace {

/// The LoRA settings in the adapter_config.json of checkpoint `dir`. A file that cannot be read is
/// std::invalid_argument naming it: "<file>:<line>:<column>: invalid JSON: <reason>", "<file>: key
/// '<k>': expected ...", with what it means for the resume.
LoraConfig checkpoint_lora(const std::string& dir) {
  const std::string file = (fs::path(dir) / kAdapterConfigFile).string();
  try {
    return peft_adapter_from_config(parse_json_text(read_json_file(file), file), file).lora;
  } catch (const std::exception& e) {
    throw std::invalid_argument(
        fmt::format("{} (checkpoint {} cannot be resumed without its adapter settings)", e.what(), dir));
  }
}

/// The LoRA run `l` describes: "r=<r> on <targets>" and the spec's "lora" key that trains the
/// same adapters, as JSON.
std::pair<std::string, std::string> lora_run_of(const LoraConfig& l) {
  std::vector<std::string> targets = l.target_modules;
  targets.insert(targets.end(), l.target_parameters.begin(), l.target_parameters.end());
  nlohmann::ordered_json key = {{"r", l.r}, {"alpha", l.alpha}};
  if (l.alpha == std::floor(l.alpha) && std::fabs(l.alpha) < 1e15)
    key["alpha"] = int64_t(l.alpha);  // 16, not 16.0
  if (!l.target_modules.empty()) key["target_modules"] = l.target_modules;
  if (!l.target_parameters.empty()) key["target_parameters"] = l.target_parameters;
  if (l.dropout != 0) key["dropout"] = l.dropout;
  if (l.use_rslora) key["use_rslora"] = true;
  if (!l.modules_to_save.empty()) key["modules_to_save"] = l.modules_to_save;
  return {fmt::format("r={} on {}", l.r, fmt::join(targets, ",")), key.dump()};
}

const char* kStartFresh = "a new output folder without --resume or \"resume_from\"";

/// A LoRA checkpoint of `dir` resumed by `spec`: refused when the spec trains no adapters or
/// adapters of another rank (the adapters' shapes), naming the change that resumes it.
void check_lora_resume(const TrainSpec& spec, const std::string& dir, bool lora_spec) {
  const LoraConfig saved = checkpoint_lora(dir);  // a corrupt file is named before anything else
  const auto [run, key] = lora_run_of(saved);
  if (!lora_spec)
    throw std::invalid_argument(
        fmt::format("checkpoint {} was written by a LoRA run ({}); {} asks for full fine-tuning (no \"lora\" "
                    "key): add \"lora\": {} to resume it, or start {}",
                    dir, run, spec.source, key, kStartFresh));
  if (spec.lora && spec.lora->r != saved.r) {
    const std::string origin = setting_origin(spec, "lora.r");
    throw std::invalid_argument(fmt::format(
        "checkpoint {} was written by a LoRA run of rank {} ({}); {} asks for rank {}: {} to resume it, or "
        "start {}",
        dir, saved.r, run, origin, spec.lora->r,
        origin.rfind("--", 0) == 0 ? fmt::format("pass --set lora.r={}", saved.r)
                                   : fmt::format("set \"r\": {} in its \"lora\" key", saved.r),
        kStartFresh));
  }
}

}  // namespace

void check_resume_kind(const TrainSpec& spec) {
  if (spec.resume_from.empty()) return;
  std::error_code ec;
  std::string d = spec.resume_from;
  while (d.size() > 1 && d.back() == '/')
    d.pop_back();  // "runs/x/checkpoint-2/" names it as typed, less the '/'
  const fs::path dir(d);
  const bool lora_checkpoint = fs::is_regular_file(dir / kAdapterConfigFile, ec);
  const bool full_checkpoint = !lora_checkpoint && fs::is_regular_file(dir / "config.json", ec);
  const bool lora_spec = spec.lora.has_value() || !spec.adapter.empty();
  if (lora_checkpoint) check_lora_resume(spec, dir.string(), lora_spec);
  if (full_checkpoint && lora_spec) {
    const std::string k = spec.lora ? "lora" : "adapter";
    throw std::invalid_argument(fmt::format(
        "checkpoint {} was written by a full fine-tuning run (config.json and all weights, no {}); {} asks "
        "for LoRA (the \"{}\" key): remove the \"{}\" key to resume it, or train adapters on its weights "
        "with \"model\": \"{}\" in {}",
        dir.string(), kAdapterConfigFile, spec.source, k, k, dir.string(), kStartFresh));
  }
}

namespace {

/// check_resume_model's refusal alone: no warnings.
void refuse_other_architecture(const ResumePoint& r, const TrainSpec& spec, const ModelConfig& model) {
  nlohmann::json saved = r.saved.model_config;
  std::error_code ec;
  if (!saved.is_object() && !spec.lora && fs::exists(r.dir + "/config.json", ec))
    saved = architecture_of(load_config_file(r.dir + "/config.json"));
  const std::string diff = architecture_difference(saved, architecture_of(model));
  if (!diff.empty())
    throw std::invalid_argument(
        fmt::format("{}: key 'model': {} is not the architecture of checkpoint {}: {}; resume with the model "
                    "it was trained "
                    "from",
                    setting_origin(spec, "model"), spec.model, r.dir, diff));
}

}  // namespace

void check_resume_state_fits(const ResumePoint& r, const TrainSpec& spec) {
  const bool lora = spec.lora || !spec.adapter.empty();
  std::optional<ModelConfig> model;  // the model the spec names (for LoRA, the base trained on)
  std::vector<ModelLayout> layouts;  // what the run may train: the state must fit one of them
  try {
    std::error_code ec;
    if (lora || fs::exists(spec.model, ec)) model = ModelSource::open(spec.model).config();
    if (lora) {
      const LoraConfig l = spec.lora ? *spec.lora : checkpoint_lora(r.dir);
      layouts.push_back(make_layout(*model, l));
      if (model->tie_word_embeddings) {  // an adapter that trains one end of the pair unties them
        ModelConfig untied = *model;
        untied.tie_word_embeddings = false;
        layouts.push_back(make_layout(untied, l));
      }
    } else {
      // a full fine-tuning resume trains the checkpoint's own weights
      layouts.push_back(make_layout(ModelSource::open(r.dir).config()));
    }
  } catch (const std::exception&) {
    return;  // the model's load names what is wrong there, in its own words
  }
  if (model) refuse_other_architecture(r, spec, *model);
  const OptimizerStateReader state(r.optimizer_file);
  const auto fits = [&](const ModelLayout& layout) {
    try {
      state.check_groups(layout);
      return true;
    } catch (const std::runtime_error&) {
      return false;
    }
  };
  if (std::any_of(layouts.begin(), layouts.end(), fits)) return;
  state.check_groups(layouts.front());  // the refusal names the groups of the layout as configured
}

void check_resume_model(const ResumePoint& r, const TrainSpec& spec, const ModelConfig& model) {
  refuse_other_architecture(r, spec, model);
  // LoRA trains on spec.model's base; a full fine-tuning resume on the checkpoint's own config
  const bool base_from_model = spec.lora || !spec.adapter.empty();
  for (const auto& d : numerics_differences(r.saved.model_numerics, numerics_of(model)))
    if (base_from_model)
      spdlog::warn("resuming with {}: model '{}' computes differently from the run that saved {}", d,
                   spec.model, r.dir);
    else
      spdlog::warn("model '{}' has {}; the resumed run keeps the checkpoint's value (its config.json)",
                   spec.model, d);
}

int64_t restore_checkpoint(const ResumePoint& r, const TrainSpec& spec, Session& session, TokenStream& data) {
  const std::string& state = r.optimizer_file;
  const OptimizerStateInfo info = session.load_optimizer_state(state);
  if (info.steps != r.saved.step)
    throw std::runtime_error(
        fmt::format("{}: holds the state after step {}, roundpipe_state.json says step {}", state, info.steps,
                    r.saved.step));
  if (!info.has_master && r.saved.save_dtype != "f32")
    throw std::runtime_error(
        fmt::format("{}: holds no fp32 master weights and model.safetensors is {} (expected "
                    "the master in one of them)",
                    state, r.saved.save_dtype));
  for (const auto& d : resume_differences(r.saved, spec, &session.layout().config))
    spdlog::warn("resuming with {}; the run will not reproduce an uninterrupted one", d);
  data.seek(r.saved.data_position);
  spdlog::info("resuming {} at step {} (data position {})", r.dir, r.saved.step, r.saved.data_position);
  return r.saved.step;
}

namespace {
/// The weights checksum the trainer state in folder `sd` records; "" when none can be read.
std::string recorded_weights(const fs::path& sd) {
  std::error_code ec;
  if (!fs::is_regular_file(sd / kRunStateFile, ec)) return "";
  try {
    return read_trainer_state((sd / kRunStateFile).string()).weights_xxh3;
  } catch (const std::exception&) {
    return "";
  }
}

/// weights_checksum of folder `dir`; "" when it is no folder or cannot be read.
std::string checksum_or_empty(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  try {
    return weights_checksum(dir.string());
  } catch (const std::exception&) {
    return "";
  }
}

/// "<name>" of a leftover named "<name><tag><pid>" (tag ".tmp-" or ".old-"); "" otherwise.
std::string leftover_target(const std::string& leftover, const char* tag) {
  const auto pos = leftover.rfind(tag);
  if (pos == std::string::npos || pos == 0) return "";
  const std::string pid = leftover.substr(pos + std::string(tag).size());
  if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) return "";
  return leftover.substr(0, pos);
}

std::vector<fs::path> sorted_entries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) out.push_back(it->path());
  std::sort(out.begin(), out.end());
  return out;
}

/// Replaces the folder `now` by the leftover `from` (a dead writer's) and drops its marker;
/// what `now` holds that is not roundpipe's (the user's files) is carried into `from` first.
bool put_in_place(const fs::path& from, const fs::path& now) {
  std::error_code ec;
  try {
    if (fs::is_directory(now, ec)) carry_unlisted_entries(now.string(), from.string());
  } catch (const std::exception&) {
    return false;  // a user's file in the way: left as it is, resume refuses the pair
  }
  fs::remove_all(now, ec);  // a killed run here: `now` is missing and the next start does the rename
  if (ec) return false;
  fs::rename(from, now, ec);
  if (ec) return false;
  fs::remove(owner_marker_path(from.string()), ec);
  return true;
}
}  // namespace

std::vector<std::string> mend_interrupted_saves(const std::string& output_dir) {
  std::vector<std::string> mended;
  const fs::path out(output_dir), state = out / "state";
  std::error_code ec;
  // forward: complete weights waiting in <name>.tmp-<pid> for the state already in place
  for (const fs::path& w : sorted_entries(out)) {
    const std::string name = leftover_target(w.filename().string(), ".tmp-");
    if (name.empty() || !fs::is_directory(w, ec) || !dead_writers_leftover(w.string())) continue;
    const std::string want = recorded_weights(state / name);
    if (want.empty() || checksum_or_empty(w) != want || checksum_or_empty(out / name) == want) continue;
    if (put_in_place(w, out / name))
      mended.push_back(fmt::format("completed the interrupted save of {} (its weights waited complete in {})",
                                   (out / name).string(), w.filename().string()));
  }
  // back: the weights in place are the previous save's; put that save's state back
  for (const fs::path& s : sorted_entries(state)) {
    const std::string name = leftover_target(s.filename().string(), ".old-");
    if (name.empty() || !fs::is_directory(s, ec) || !dead_writers_leftover(s.string())) continue;
    const std::string have = checksum_or_empty(out / name);
    if (have.empty() || recorded_weights(s) != have || recorded_weights(state / name) == have) continue;
    if (put_in_place(s, state / name))
      mended.push_back(
          fmt::format("put back the trainer state of {} (a save was interrupted before its new weights "
                      "were complete)",
                      (out / name).string()));
  }
  return mended;
}

}  // namespace rp
