#include "cli/train.hpp"
#include "cli/train_state.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "data/dataset.hpp"
#include "data/tokenizer.hpp"
#include "kernels/device.hpp"
#include "model/checkpoint.hpp"
#include "roundpipe/session.hpp"

namespace fs = std::filesystem;

namespace rp {
namespace {

std::atomic<bool> g_interrupted{false};
// First Ctrl-C or SIGTERM: stop after the steps in flight and save them as a checkpoint.
// Second: leave now (an unfinished checkpoint stays in a *.tmp-<pid> folder, removed by the
// next run; finished ones are kept).
void on_sigint(int) {
  if (g_interrupted.exchange(true)) {
    static const char msg[] = "\nroundpipe: interrupted twice, exiting now\n";
    [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
    std::_Exit(130);
  }
  static const char first[] =
      "\nroundpipe: interrupted: finishing the steps in flight, then saving a checkpoint (Ctrl-C again to exit now)\n";
  [[maybe_unused]] auto n = ::write(2, first, sizeof first - 1);
}

/// Cleans what a killed run of a process no longer alive left in `dir`: "<name>.tmp-<pid>"
/// (save_hf_checkpoint writes there before its atomic rename) is removed; "<name>.old-<pid>"
/// (the previous checkpoint, moved aside during the swap) is put back as <name> when the
/// kill came before the new one was in place, and removed otherwise, so a finished
/// checkpoint is never lost.
void remove_stale_temporaries(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  std::vector<fs::path> entries;
  for (auto& e : fs::directory_iterator(dir, ec)) entries.push_back(e.path());
  for (const auto& p : entries) {
    const std::string name = p.filename().string();
    for (const char* tag : {".tmp-", ".old-"}) {
      const auto pos = name.rfind(tag);
      if (pos == std::string::npos) continue;
      const std::string pid = name.substr(pos + std::strlen(tag));
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      if (pid == std::to_string(::getpid()) || fs::exists("/proc/" + pid)) continue;  // a live writer
      const fs::path base = dir / name.substr(0, pos);
      if (tag[1] == 'o' && !fs::exists(base, ec)) {
        fs::rename(p, base, ec);
        if (!ec) spdlog::warn("restored {} from {} (a run was killed while replacing it)", base.string(), p.string());
      } else {
        fs::remove_all(p, ec);
        if (!ec) spdlog::info("removed {} left by an interrupted run", p.string());
      }
    }
  }
}

std::string fmt_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "--:--";
  int t = int(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

}  // namespace

int run_train(TrainSpec spec, const TrainOverrides& ov) {
  if (ov.steps > 0) {
    spec.steps = ov.steps;
    if (spec.lr_schedule.kind != "constant")
      spec.lr_schedule.total_steps = std::max(ov.steps, spec.lr_schedule.warmup_steps);
  }
  if (ov.workers > 0) spec.workers = ov.workers;
  if (!ov.backend.empty()) spec.backend = ov.backend;
  if (!ov.output_dir.empty()) spec.output_dir = ov.output_dir;
  if (ov.resume_given && ov.resume.empty())
    throw std::invalid_argument("--resume: expected a checkpoint folder (checkpoint-<k>/ or final/), got \"\"");
  if (!ov.resume.empty()) spec.resume_from = ov.resume;
  if (!ov.dump_batch.empty()) {  // before anything is loaded or written
    std::error_code ec;
    const fs::path parent = fs::absolute(fs::path(ov.dump_batch), ec).parent_path();
    if (ec || !fs::is_directory(parent, ec))
      throw std::invalid_argument(fmt::format("--dump-batch {}: cannot write the file (folder '{}' does not exist)",
                                              ov.dump_batch, parent.string()));
  }
  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(); };

  // ---- output folder: check before loading anything ------------------------------
  {
    std::error_code ec;
    if (fs::exists(spec.output_dir, ec) && !fs::is_directory(spec.output_dir, ec))
      throw std::invalid_argument(fmt::format("{}: key 'output_dir': expected a directory, but '{}' is a file",
                                              spec.source, spec.output_dir));
    const fs::path fin = fs::path(spec.output_dir) / "final";
    if (fs::exists(fin, ec) && !fs::is_directory(fin, ec))
      throw std::invalid_argument(fmt::format("{}: key 'output_dir': '{}' exists and is not a checkpoint folder",
                                              spec.source, fin.string()));
    remove_stale_temporaries(spec.output_dir);
  }

  if (spec.compute_dtype == "f16") {  // fp16 storage exists only on the CUDA backend
    const bool cuda = spec.backend == "cuda" || (spec.backend == "auto" && cuda_device_count() > 0);
    if (!cuda)
      throw std::invalid_argument(fmt::format(
          "{}: key 'compute_dtype': \"f16\" needs the cuda backend (the cpu backend computes in f32){}", spec.source,
          spec.backend == "auto" ? "; no CUDA device is visible" : ""));
  }

  // ---- resume: check the checkpoint's trainer state before loading anything ------
  const bool resuming = !spec.resume_from.empty();
  std::string rdir = spec.resume_from;
  while (rdir.size() > 1 && rdir.back() == '/') rdir.pop_back();
  TrainerState saved;
  if (resuming) {
    std::error_code ec;
    if (!fs::is_directory(rdir, ec))
      throw std::invalid_argument(fmt::format("{}: cannot resume: not a checkpoint folder", rdir));
    saved = read_trainer_state(rdir + "/trainer_state.json");
    if (!fs::exists(rdir + "/optimizer.bin", ec))
      throw std::runtime_error(fmt::format("{}/optimizer.bin: missing (expected the optimizer state next to "
                                           "trainer_state.json)", rdir));
    if (saved.step >= spec.steps)
      throw std::invalid_argument(fmt::format("{}: the checkpoint is at step {} and the spec trains {} steps; nothing "
                                              "is left to do (raise 'steps' or pass --steps)",
                                              rdir, saved.step, spec.steps));
  }

  // ---- model, tokenizer, data ------------------------------------------------
  // a resumed run takes weights, config and tokenizer from the checkpoint
  const std::string model_path = resuming ? rdir : spec.model;
  spdlog::info("loading model {}", model_path);
  LoadedModel lm = load_model(model_path);
  ModelLayout layout = make_layout(lm.config);
  std::vector<std::vector<float>> weights;
  fill_groups(lm, layout, weights);
  lm.tensors.clear();
  const auto& c = lm.config;
  spdlog::info("model: {} layers, hidden {}, {} heads ({} kv), ffn {}, vocab {}, {:.1f} M parameters{}",
               c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
               c.intermediate_size, c.vocab_size, c.num_parameters() / 1e6,
               c.tie_word_embeddings ? ", tied embeddings" : "");
  if (lm.tokenizer_json.is_null())
    throw std::runtime_error(model_path + ": the model carries no tokenizer (tokenizer.json)");
  Tokenizer tok = Tokenizer::from_json(lm.tokenizer_json, model_path + " tokenizer");
  if (c.eos_token_id >= 0) tok.set_eos_id(int32_t(c.eos_token_id));
  ChatTemplate chat = ChatTemplate::chatml;
  if (spec.chat_template == "auto")
    chat = lm.chat_template.empty() ? ChatTemplate::chatml : detect_chat_template(lm.chat_template);
  else
    chat = parse_chat_template_name(spec.chat_template);
  spdlog::info("loading data {} (chat template {})", spec.data, chat_template_name(chat));
  Dataset ds = load_dataset(spec.data, tok, chat);
  if (spec.max_examples > 0 && int64_t(ds.examples.size()) > spec.max_examples)
    ds.examples.resize(size_t(spec.max_examples));
  PackedSequences packed = pack_sequences(ds, spec.seq_len, tok.eos_id());
  spdlog::info("data: {}{} -> {} sequences of {} tokens{}",
               ds.examples.empty() ? std::string() : fmt::format("{} examples", ds.examples.size()),
               ds.text_stream.empty() ? std::string()
                                      : fmt::format("{}{} text tokens", ds.examples.empty() ? "" : ", ",
                                                    ds.text_stream.size()),
               packed.size(), spec.seq_len,
               packed.dropped_examples ? fmt::format(" ({} examples dropped: no target left)", packed.dropped_examples)
                                       : std::string());
  if (packed.size() == 0)
    throw std::invalid_argument(fmt::format(
        "{}: key 'seq_len': {} tokens leave no training target in any of the {} examples of {} (their prompts "
        "are longer); raise seq_len",
        spec.source, spec.seq_len, ds.examples.size(), spec.data));
  if (c.max_position_embeddings > 0 && spec.seq_len > c.max_position_embeddings)
    spdlog::warn("seq_len {} exceeds the model's max_position_embeddings {}", spec.seq_len,
                 c.max_position_embeddings);
  BatchStream stream(std::move(packed), spec.seed);

  // ---- session -----------------------------------------------------------------
  SessionOptions opt;
  opt.backend = spec.backend;
  opt.workers = spec.workers;
  opt.micro_batches = spec.micro_batches;
  const int64_t per_pass = spec.sequences_per_step / spec.accumulation;
  opt.micro.n_seq = per_pass / spec.micro_batches;
  opt.micro.seq_len = spec.seq_len;
  opt.async = spec.async;
  opt.adam = spec.adam;
  opt.max_grad_norm = spec.max_grad_norm;
  opt.device.capacity_bytes = size_t(spec.device_memory_gib * double(1ull << 30));
  opt.device.pcie_bytes_per_s = spec.pcie_gbps * 1e9;
  opt.device.dtype = parse_dtype(spec.compute_dtype);
  opt.loss_scaling = spec.loss_scaling;
  opt.transfer_priorities = spec.transfer_priorities;
  opt.transfer_chunk_bytes = size_t(spec.transfer_chunk_bytes);
  // No "plan" key: automatic (analytic estimate, then re-planned from the profile once it
  // settles). An explicit plan is never changed.
  if (!spec.plan.is_null())
    opt.plan = plan_from_json(spec.plan, layout.num_layers(), spec.workers, spec.source + ": key 'plan'");
  opt.trace = spec.trace;
  Session session(layout, std::move(weights), opt);
  int64_t start = 0;
  if (resuming) {
    const std::string state = rdir + "/optimizer.bin";
    OptimizerStateInfo info = session.load_optimizer_state(state);
    if (info.steps != saved.step)
      throw std::runtime_error(fmt::format("{}: holds the state after step {}, trainer_state.json says step {}", state,
                                           info.steps, saved.step));
    if (!info.has_master && saved.save_dtype != "f32")
      throw std::runtime_error(fmt::format("{}: holds no fp32 master weights and model.safetensors is {} (expected "
                                           "the master in one of them)",
                                           state, saved.save_dtype));
    for (const auto& d : resume_differences(saved, spec))
      spdlog::warn("resuming with {}; the run will not reproduce an uninterrupted one", d);
    stream.seek(saved.data_position);
    start = saved.step;
    spdlog::info("resuming {} at step {} (data position {})", rdir, start, saved.data_position);
  }
  spdlog::info("runtime: {} x {}, {} optimizer, {} plan {} ({} stages), {} micro-batches of {} x {} tokens",
               spec.workers, session.device_name(), spec.async ? "staleness-1 async" : "synchronous",
               opt.plan ? "explicit" : "automatic", session.initial_plan().summary(),
               session.initial_plan().stages.size(), spec.micro_batches, opt.micro.n_seq, spec.seq_len);

  fs::create_directories(spec.output_dir);
  const std::string csv_path = spec.output_dir + "/metrics.csv";
  const std::string csv_header = "step,loss,target_tokens,tokens_per_s,lr,elapsed_s,grad_norm,loss_scale,skipped\n";
  if (resuming) truncate_metrics(csv_path, start, csv_header);  // rows of a later, abandoned attempt go
  std::ofstream csv(csv_path, resuming ? std::ios::app : std::ios::trunc);
  if (!csv) throw std::runtime_error(csv_path + ": cannot write");
  if (!resuming) csv << csv_header;
  const DType save_dtype = parse_dtype(spec.save_dtype);
  // The measured per-layer profile, for `roundpipe plan --profile` (written atomically).
  const std::string profile_path = spec.output_dir + "/profile.json";
  auto save_profile = [&] {
    session.profile().save(profile_path);
    spdlog::info("saved profile {}", profile_path);
  };
  // A checkpoint is a consistent snapshot: every closed step applied, none in flight (the
  // caller has not submitted the next step's passes), so the weights, the optimizer state
  // and the data position all belong to the same step.
  auto save = [&](const std::string& name) {
    session.synchronize();
    const double t0 = elapsed();
    std::vector<const float*> ptrs;
    for (auto& g : session.master_weights()) ptrs.push_back(g.data());
    const std::string dir = spec.output_dir + "/" + name;
    save_hf_checkpoint(dir, layout, ptrs, lm.tokenizer_json, lm.chat_template, save_dtype,
                       [&](const std::string& tmp) {
                         // model.safetensors holds the fp32 master exactly only when saved in f32
                         session.save_optimizer_state(tmp + "/optimizer.bin", save_dtype != DType::f32);
                         write_trainer_state(tmp + "/trainer_state.json",
                                             trainer_state_of(spec, session.steps_closed(), stream.position()));
                       });
    spdlog::info("saved checkpoint {} in {:.1f} s", dir, elapsed() - t0);
    save_profile();
  };

  auto prev = std::signal(SIGINT, on_sigint);
  auto prev_term = std::signal(SIGTERM, on_sigint);  // batch schedulers stop jobs with SIGTERM
  auto restore_signals = [&] {
    std::signal(SIGINT, prev);
    std::signal(SIGTERM, prev_term);
  };
  const int64_t tokens_per_step = spec.sequences_per_step * spec.seq_len;
  double last_report = 0;
  int64_t reported = start - 1;
  auto report = [&](int64_t t) {
    StepResult r = session.wait(t);
    const double now = elapsed();
    const double dt = now - last_report;
    const int64_t nsteps = t - reported;
    last_report = now;
    reported = t;
    const double tps = dt > 0 ? double(tokens_per_step * nsteps) / dt : 0;
    const double loss = r.tokens > 0 ? r.loss_sum / r.tokens : 0;
    const double lr = spec.lr_schedule.at(t);
    const double eta = (now / double(t + 1 - start)) * double(spec.steps - t - 1);
    csv << fmt::format("{},{:.6f},{},{:.1f},{:.6g},{:.3f},{:.6g},{:.6g},{}\n", t + 1, loss, int64_t(r.tokens), tps, lr,
                       now, r.grad_norm, r.loss_scale, r.skipped ? 1 : 0);
    csv.flush();
    if ((t + 1) % spec.log_every == 0 || t + 1 == spec.steps)
      fmt::print("step {:>5}/{} | loss {:.4f} | {:>8.1f} tokens/s | lr {:.3e}{} | elapsed {} | ETA {}\n", t + 1,
                 spec.steps, loss, tps, lr,
                 (spec.max_grad_norm > 0 ? fmt::format(" | grad norm {:.3f}", r.grad_norm) : std::string()) +
                     (spec.loss_scaling ? fmt::format(" | scale {:g}{}", r.loss_scale, r.skipped ? " (skipped)" : "")
                                        : std::string()),
                 fmt_duration(now), fmt_duration(eta));
    std::fflush(stdout);
  };

  int64_t t = start;
  for (; t < spec.steps && !g_interrupted; ++t) {
    for (int64_t a = 0; a < spec.accumulation; ++a) {
      TokenBatch b = stream.next(per_pass);
      if (t == 0 && a == 0 && !ov.dump_batch.empty()) {
        std::ofstream f(ov.dump_batch);
        f << nlohmann::json{{"n_seq", b.n_seq}, {"seq_len", b.seq_len}, {"ids", b.ids}, {"targets", b.targets}}.dump()
          << "\n";
        f.close();
        if (!f) throw std::runtime_error(fmt::format("--dump-batch {}: cannot write the file", ov.dump_batch));
      }
      session.forward_backward(b.ids, b.targets);
    }
    session.step(spec.lr_schedule.at(t));
    if (spec.save_every > 0 && (t + 1) % spec.save_every == 0 && t + 1 < spec.steps) {
      // drain before the next step's passes: the pipeline refills after the save, and
      // the results do not change (step t+1 computes with the weights of step t-1 anyway)
      for (int64_t k = reported + 1; k <= t; ++k) report(k);
      save(fmt::format("checkpoint-{}", t + 1));
    } else if (t > start && reported < t - 1) {
      // Report one step behind: with the staleness-1 optimizer the next pass is already
      // queued while step t-1's update finishes.
      report(t - 1);
    }
  }
  for (int64_t k = reported + 1; k < t; ++k) report(k);
  session.synchronize();
  if (spec.trace) {
    session.write_trace(spec.output_dir + "/trace.json");
    spdlog::info("wrote trace {}/trace.json", spec.output_dir);
  }
  if (g_interrupted && t < spec.steps) {
    // the steps done become a checkpoint like a periodic one (still under our handler: a
    // second signal exits at once and leaves only a *.tmp-<pid> folder)
    const std::string name = fmt::format("checkpoint-{}", t);
    const bool fresh = t > start && !(spec.save_every > 0 && t % spec.save_every == 0);
    if (fresh) save(name);
    else save_profile();
    restore_signals();
    fmt::print(stderr, "roundpipe: interrupted after {} steps; {}\n", t,
               fresh ? fmt::format("saved {}/{} (continue with --resume {}/{})", spec.output_dir, name,
                                   spec.output_dir, name)
                     : std::string("finished checkpoints are kept"));
    return 130;
  }
  save("final");  // still under our signal handlers: a Ctrl-C now cannot cut the checkpoint
  restore_signals();
  fmt::print("done: {} steps{} in {}, peak device memory {:.1f} MiB per worker, metrics in {}, plan {}\n",
             spec.steps - start,
             start > 0 ? fmt::format(" (resumed at step {}, {} in all)", start, spec.steps) : std::string(),
             fmt_duration(elapsed()), session.peak_device_bytes() / 1048576.0, csv_path, session.plan().summary());
  return 0;
}

}  // namespace rp
