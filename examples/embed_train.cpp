// Embedding RoundPipe in a C++ program with the low-level Session: load a model, drive
// forward_backward / step from our own loop with a cosine learning-rate schedule, and save
// a checkpoint that a later run continues from exactly (weights, optimizer state, data
// position). rp::Trainer (examples/trainer_example.cpp) does all of this from a spec.
//
//   embed_train MODEL DATA OUT_DIR STEPS [RESUME_DIR]
// trains up to step STEPS of a kScheduleSteps-step cosine schedule (from the start, or from
// the checkpoint RESUME_DIR an earlier run wrote) and writes OUT_DIR: a Hugging Face folder
// (model.safetensors in f32, config, tokenizer) with optimizer.bin and example_state.json
// ({"step", "data_position"}). Stopping at k and resuming to n gives the run to n exactly.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <roundpipe/roundpipe.hpp>

namespace {

constexpr int64_t kSeqLen = 32;
constexpr double kLr = 1e-3;
constexpr int64_t kScheduleSteps = 100;  // the learning-rate schedule's length (a run may stop earlier)

/// Writes the checkpoint: the weights (f32: exactly the fp32 master), and, in the same
/// atomic folder, the optimizer state and where the data stream is.
void save(rp::Session& s, const rp::LoadedModel& lm, const rp::TokenStream& data, const std::string& dir) {
  s.synchronize();  // every step applied, none in flight
  std::vector<const float*> ptrs;
  for (const auto& g : s.master_weights()) ptrs.push_back(g.data());
  rp::save_hf_checkpoint(dir, s.layout(), ptrs, lm.tokenizer_json, lm.chat_template, rp::DType::f32,
                         [&](const std::string& tmp) {
                           s.save_optimizer_state(tmp + "/optimizer.bin", /*include_master=*/false);
                           std::ofstream(tmp + "/example_state.json") << nlohmann::json{
                               {"step", s.steps_closed()}, {"data_position", data.position()}};
                         });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s MODEL(.gguf|dir) DATA(.jsonl|.txt) OUT_DIR STEPS [RESUME_DIR]\n",
                 argv[0]);
    return 2;
  }
  try {
    const std::string resume = argc > 5 ? argv[5] : "";
    const int64_t steps = std::atoll(argv[4]);
    // a resumed run takes the weights (and tokenizer) from its checkpoint
    const rp::LoadedModel lm = rp::load_model(resume.empty() ? argv[1] : resume);
    const rp::ModelLayout layout = rp::make_layout(lm.config);
    std::vector<std::vector<float>> weights;
    rp::fill_groups(lm, layout, weights);

    rp::TokenStreamOptions dopt;
    dopt.seq_len = kSeqLen;
    dopt.seed = 1;
    rp::TokenStream data(lm, argv[2], dopt);

    rp::SessionOptions opt;
    opt.backend = "cpu";
    opt.workers = 2;           // two virtual GPUs
    opt.micro_batches = 2;     // M micro-batches per pass
    opt.micro = {1, kSeqLen};  // one sequence of kSeqLen tokens per micro-batch
    opt.adam.lr = kLr;
    rp::Session session(layout, std::move(weights), opt);

    rp::LrSchedule lr;  // warm up for one step, then cosine decay to 10 %
    lr.kind = "cosine";
    lr.lr = kLr;
    lr.min_lr = kLr / 10;
    lr.warmup_steps = 1;
    lr.total_steps = kScheduleSteps;

    int64_t start = 0;
    if (!resume.empty()) {
      start = session.load_optimizer_state(resume + "/optimizer.bin").steps;
      std::ifstream f(resume + "/example_state.json");
      data.seek(nlohmann::json::parse(f).at("data_position").get<int64_t>());
      std::printf("resuming %s at step %lld\n", resume.c_str(), static_cast<long long>(start));
    }
    auto report = [&](int64_t t) {
      const rp::StepResult r = session.wait(t);
      std::printf("step %lld loss %.6f lr %.4e\n", static_cast<long long>(t + 1), r.loss_sum / r.tokens,
                  lr.at(t));
    };
    for (int64_t t = start; t < steps; ++t) {
      const rp::TokenBatch b = data.next(opt.micro_batches * opt.micro.n_seq);
      session.forward_backward(b.ids, b.targets);
      session.step(lr.at(t));
      if (t > start) report(t - 1);  // results arrive one step behind: the next pass is already running
    }
    if (steps > start) report(steps - 1);
    save(session, lm, data, argv[3]);
    std::printf("saved %s\n", argv[3]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embed_train: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
