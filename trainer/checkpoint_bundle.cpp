#include "trainer/checkpoint_bundle.hpp"

#include <filesystem>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace fs = std::filesystem;

namespace rp {

void save_checkpoint_bundle(Session& session, const std::string& dir, const LoadedModel& model, DType save_dtype,
                            const TrainerState& state) {
  session.synchronize();
  std::vector<const float*> ptrs;
  for (auto& g : session.master_weights()) ptrs.push_back(g.data());
  save_hf_checkpoint(dir, session.layout(), ptrs, model.tokenizer_json, model.chat_template, save_dtype,
                     [&](const std::string& tmp) {
                       // model.safetensors holds the fp32 master exactly only when saved in f32
                       session.save_optimizer_state(tmp + "/optimizer.bin", save_dtype != DType::f32);
                       write_trainer_state(tmp + "/trainer_state.json", state);
                     });
}

std::optional<ResumePoint> check_resume(const TrainSpec& spec) {
  if (spec.resume_from.empty()) return std::nullopt;
  ResumePoint r;
  r.dir = spec.resume_from;
  while (r.dir.size() > 1 && r.dir.back() == '/') r.dir.pop_back();
  std::error_code ec;
  if (!fs::is_directory(r.dir, ec))
    throw std::invalid_argument(fmt::format("{}: cannot resume: not a checkpoint folder", r.dir));
  r.saved = read_trainer_state(r.dir + "/trainer_state.json");
  if (!fs::exists(r.dir + "/optimizer.bin", ec))
    throw std::runtime_error(
        fmt::format("{}/optimizer.bin: missing (expected the optimizer state next to trainer_state.json)", r.dir));
  if (r.saved.step >= spec.steps)
    throw std::invalid_argument(fmt::format("{}: the checkpoint is at step {} and the spec trains {} steps; nothing "
                                            "is left to do (raise 'steps' or pass --steps)",
                                            r.dir, r.saved.step, spec.steps));
  return r;
}

int64_t restore_checkpoint(const ResumePoint& r, const TrainSpec& spec, Session& session, TokenStream& data) {
  const std::string state = r.dir + "/optimizer.bin";
  const OptimizerStateInfo info = session.load_optimizer_state(state);
  if (info.steps != r.saved.step)
    throw std::runtime_error(fmt::format("{}: holds the state after step {}, trainer_state.json says step {}", state,
                                         info.steps, r.saved.step));
  if (!info.has_master && r.saved.save_dtype != "f32")
    throw std::runtime_error(fmt::format("{}: holds no fp32 master weights and model.safetensors is {} (expected "
                                         "the master in one of them)",
                                         state, r.saved.save_dtype));
  for (const auto& d : resume_differences(r.saved, spec))
    spdlog::warn("resuming with {}; the run will not reproduce an uninterrupted one", d);
  data.seek(r.saved.data_position);
  spdlog::info("resuming {} at step {} (data position {})", r.dir, r.saved.step, r.saved.data_position);
  return r.saved.step;
}

}  // namespace rp
