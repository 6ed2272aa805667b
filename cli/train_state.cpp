#include "cli/train_state.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace rp {
namespace {

constexpr const char* kFormat = "roundpipe-trainer-state";
constexpr int kVersion = 1;

nlohmann::json schedule_json(const LrSchedule& s) {
  return {{"kind", s.kind},
          {"lr", s.lr},
          {"min_lr", s.min_lr},
          {"warmup_steps", s.warmup_steps},
          {"total_steps", s.total_steps}};
}

}  // namespace

TrainerState trainer_state_of(const TrainSpec& spec, int64_t step, int64_t data_position) {
  TrainerState s;
  s.step = step;
  s.data_position = data_position;
  s.seed = spec.seed;
  s.sequences_per_step = spec.sequences_per_step;
  s.seq_len = spec.seq_len;
  s.async = spec.async;
  s.save_dtype = spec.save_dtype;
  s.compute_dtype = spec.compute_dtype;
  s.model = spec.model;
  s.data = spec.data;
  s.lr_schedule = schedule_json(spec.lr_schedule);
  return s;
}

void write_trainer_state(const std::string& path, const TrainerState& s) {
  const nlohmann::json j = {{"format", kFormat},
                            {"version", kVersion},
                            {"step", s.step},
                            {"data_position", s.data_position},
                            {"seed", s.seed},
                            {"sequences_per_step", s.sequences_per_step},
                            {"seq_len", s.seq_len},
                            {"async", s.async},
                            {"save_dtype", s.save_dtype},
                            {"compute_dtype", s.compute_dtype},
                            {"model", s.model},
                            {"data", s.data},
                            {"lr_schedule", s.lr_schedule},
                            {"optimizer_state", "optimizer.bin"}};
  std::ofstream f(path, std::ios::trunc);
  if (!f) throw std::runtime_error(fmt::format("{}: cannot write ({})", path, std::strerror(errno)));
  f << j.dump(2) << "\n";
  f.flush();
  if (!f) throw std::runtime_error(path + ": write failed (disk full?)");
}

TrainerState read_trainer_state(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    const std::string dir = std::filesystem::path(path).parent_path().string();
    throw std::runtime_error(fmt::format(
        "{}: missing; {} is not a resumable checkpoint (resume from a checkpoint-<k>/ or final/ folder written by "
        "roundpipe train)",
        path, dir.empty() ? std::string(".") : dir));
  }
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    for (auto& c : what)
      if (c == '\n') c = ' ';
    throw std::runtime_error(fmt::format("{}: invalid JSON ({})", path, what));
  }
  auto fail = [&](const std::string& key, const std::string& expected) -> std::runtime_error {
    return std::runtime_error(fmt::format("{}: key '{}': expected {}, got {}", path, key, expected,
                                          j.is_object() && j.contains(key) ? j[key].dump() : "nothing"));
  };
  if (!j.is_object()) throw std::runtime_error(path + ": expected a JSON object");
  if (!j.contains("format") || j["format"] != kFormat) throw fail("format", fmt::format("\"{}\"", kFormat));
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() != kVersion)
    throw fail("version", std::to_string(kVersion));
  auto integer = [&](const char* key, int64_t min) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < min)
      throw fail(key, fmt::format("an integer >= {}", min));
    return j[key].get<int64_t>();
  };
  auto string = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_string()) throw fail(key, "a string");
    return j[key].get<std::string>();
  };
  TrainerState s;
  s.step = integer("step", 1);
  s.data_position = integer("data_position", 0);
  if (!j.contains("seed") || !j["seed"].is_number_unsigned()) throw fail("seed", "an integer >= 0");
  s.seed = j["seed"].get<uint64_t>();
  s.sequences_per_step = integer("sequences_per_step", 1);
  s.seq_len = integer("seq_len", 2);
  if (!j.contains("async") || !j["async"].is_boolean()) throw fail("async", "true or false");
  s.async = j["async"].get<bool>();
  s.save_dtype = string("save_dtype");
  if (s.save_dtype != "f32" && s.save_dtype != "bf16" && s.save_dtype != "f16")
    throw fail("save_dtype", "\"f32\", \"bf16\" or \"f16\"");
  s.compute_dtype = string("compute_dtype");
  s.model = string("model");
  s.data = string("data");
  if (!j.contains("lr_schedule") || !j["lr_schedule"].is_object()) throw fail("lr_schedule", "an object");
  s.lr_schedule = j["lr_schedule"];
  return s;
}

std::vector<std::string> resume_differences(const TrainerState& saved, const TrainSpec& spec) {
  std::vector<std::string> out;
  const TrainerState now = trainer_state_of(spec, saved.step, saved.data_position);
  if (saved.seed != now.seed)
    out.push_back(fmt::format("seed {} (saved run {}): the data order differs", now.seed, saved.seed));
  if (saved.sequences_per_step != now.sequences_per_step)
    out.push_back(fmt::format("sequences_per_step {} (saved run {})", now.sequences_per_step, saved.sequences_per_step));
  if (saved.seq_len != now.seq_len)
    out.push_back(fmt::format("seq_len {} (saved run {}): the sequences differ", now.seq_len, saved.seq_len));
  if (saved.async != now.async)
    out.push_back(fmt::format("the {} optimizer (saved run: {})", now.async ? "async" : "sync",
                              saved.async ? "async" : "sync"));
  if (saved.lr_schedule != now.lr_schedule)
    out.push_back(fmt::format("lr_schedule {} (saved run {})", now.lr_schedule.dump(), saved.lr_schedule.dump()));
  if (saved.data != now.data) out.push_back(fmt::format("data '{}' (saved run '{}')", now.data, saved.data));
  if (saved.compute_dtype != now.compute_dtype)
    out.push_back(fmt::format("compute_dtype {} (saved run {})", now.compute_dtype, saved.compute_dtype));
  return out;
}

void truncate_metrics(const std::string& path, int64_t step, const std::string& header) {
  std::vector<std::string> keep;
  {
    std::ifstream f(path);
    std::string line;
    bool first = true;
    while (f && std::getline(f, line)) {
      if (first) {
        first = false;
        continue;  // the header is rewritten below
      }
      int64_t s = -1;
      try {
        s = std::stoll(line.substr(0, line.find(',')));
      } catch (const std::exception&) {
        continue;  // a torn last line of a killed run
      }
      if (s >= 1 && s <= step) keep.push_back(line);
    }
  }
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  {
    std::ofstream o(tmp, std::ios::trunc);
    if (!o) throw std::runtime_error(fmt::format("{}: cannot write ({})", tmp, std::strerror(errno)));
    o << header;
    for (auto& l : keep) o << l << "\n";
    if (!o.flush()) throw std::runtime_error(tmp + ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw std::runtime_error(fmt::format("{}: cannot replace: {}", path, ec.message()));
}

}  // namespace rp
